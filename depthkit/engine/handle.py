"""The model handle: what :func:`depthkit.load_model` returns and every ``model``
argument in depthkit takes.

A :class:`Model` carries the backend that runs the network (TransformerLens 4's
``TransformerBridge`` by default, or nnsight: :mod:`depthkit.engine.backends`), its
:class:`~depthkit.core.model_info.ModelInfo` (written next to every result) and the
tokenizer depthkit encodes with, so no function has to look any of them up
elsewhere. This module imports neither torch nor TransformerLens.

For readers who know the engine underneath, attributes the handle does not have
are its network's, and calling the handle calls it: on the default backend
``model.cfg.n_layers``, ``model(tokens)`` and hooked runs work as on a bridge; on
nnsight, tracing works as on an nnsight model (``model.trace``). depthkit's own code
says ``model.backend`` (and ``model.bridge`` only where TransformerLens is required).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from depthkit.core.model_info import ModelInfo

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedTokenizerBase

    from depthkit.engine.backends.base import Backend

__all__ = ["Model", "ModelInfo", "as_model"]


@dataclass(frozen=True, eq=False)  # compared and hashed by identity, like the network it holds
class Model:
    """A loaded model: the network, what depthkit knows about it, and its tokenizer.

    >>> import depthkit as dk
    >>> model = dk.load_model("tiny-gpt2", seed=0)
    >>> model.info.n_blocks == model.bridge.cfg.n_layers == model.cfg.n_layers
    True
    >>> model.tokenizer("Paris")["input_ids"] == model.tokenizer.encode("Paris")
    True
    """

    backend: Backend
    info: ModelInfo
    # The model family's own tokenizer: TransformerBridge swaps in a copy that always
    # prepends BOS, and depthkit tokenises prompts as the family does by default.
    tokenizer: PreTrainedTokenizerBase

    @property
    def bridge(self) -> TransformerBridge:
        """The TransformerLens bridge (default backend only)."""
        bridge = getattr(self.backend, "bridge", None)
        if bridge is None:
            raise AttributeError(self._no_bridge())
        return bridge

    def _no_bridge(self) -> str:
        return (
            f"This model runs on the {self.backend.name!r} backend, which has no TransformerLens bridge; hooks and "
            "run_with_cache need dk.load_model(name) with the default backend='bridge'."
        )

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the handle lacks (or a property that raised); the
        # network's own error otherwise.
        if name.startswith("__") or name in ("backend", "info", "tokenizer"):
            raise AttributeError(name)
        if name == "bridge":
            raise AttributeError(self._no_bridge())
        return getattr(self.backend.network, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.backend.network(*args, **kwargs)

    def __repr__(self) -> str:
        i = self.info
        return f"Model({i.name!r}, {i.family}, {i.n_blocks} blocks, d_model={i.d_model}, source={i.source}, backend={i.backend})"


def as_model(model: Any) -> Model:
    """``model`` if it is a :class:`Model`; otherwise a clear error naming the fix."""
    if isinstance(model, Model):
        return model
    raise TypeError(
        f"Expected a model loaded with depthkit.load_model (a depthkit Model); got {type(model).__name__}. "
        "Load it with `dk.load_model(name_or_path)`."
    )
