"""The engines that run a model's forward pass for depthkit.

Every depthkit function reads and writes the residual stream through
:mod:`depthkit.engine.capture`, which says what a pass must do as a
:class:`~depthkit.engine.work.ForwardWork`; a backend carries it out.

* ``"bridge"`` (:mod:`.bridge`, the default): TransformerLens 4's
  ``TransformerBridge``, with hooks. The exercises and anything written against
  TransformerLens need it.
* ``"nnsight"`` (:mod:`.nnsight_trace`): the Hugging Face model inside an nnsight
  trace, on this machine (one device or several, ``device_map``) or on NDIF's
  shared servers (``remote=True``), which run models no single machine here can hold.
"""

from depthkit.engine.backends.base import BACKENDS, Backend, ReadoutParts

__all__ = ["BACKENDS", "Backend", "ReadoutParts"]
