"""Lenses: what a residual at some depth says about the next token.

One front door: :func:`get_lens` (in :mod:`depthkit.lens.registry`) returns a lens
for a model by kind name, saved file or lens object; :func:`lens_for` is the same
call allowed to train (chapters use it for the lens their parameters name), and
:func:`resolve_lens` the same call that never trains (what engine calls use). The
kinds are one file each in :mod:`depthkit.lens.kinds`.

The modules, bottom to top: :mod:`~depthkit.lens.base` (the one
:class:`Readout`, :class:`Lens`, :class:`LogitLens`, :class:`TunedLens`, layer
conventions), :mod:`~depthkit.lens.training_data` (configuration and budgets, text
splits, residual caching), :mod:`~depthkit.lens.training` (ridge start and the fit; Adam steps and
KL gradients in :mod:`~depthkit.lens.training_steps`, held-out metrics in
:mod:`~depthkit.lens.training_metrics`; how training is made affordable on two CPU
cores),
:mod:`~depthkit.lens.store` (saving and checked loading),
:mod:`~depthkit.lens.registry` and :mod:`~depthkit.lens.kinds`,
:mod:`~depthkit.lens.prompts` (prompts to token ids and read positions),
:mod:`~depthkit.lens.decode` (residuals to top-k tables and statistics),
:mod:`~depthkit.lens.trajectories` (every depth of a batch of prompts read through
a lens) and :mod:`~depthkit.lens.compare` (several lenses on the same prompts).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from depthkit.lens.base import DEFAULT_LENS, Lens, LogitLens, Readout, TunedLens
from depthkit.lens.compare import compare_lenses
from depthkit.lens.registry import LensKind, get_lens, is_lens_path, kind_names, lens_kind
from depthkit.lens.store import LensFileError, get_tuned_lens, lens_path, load_lens, save_lens
from depthkit.lens.training import EVAL_CHUNK, heldout_metrics, train_tuned_lens
from depthkit.lens.training_data import (
    BUDGETS,
    DOWNWEIGHT_SETS,
    FORMAT_VERSION,
    Downweight,
    LensTrainingData,
    ResidualCache,
    TrainConfig,
    config_hash,
    resolve_config,
)

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

__all__ = [
    "BUDGETS",
    "DEFAULT_LENS",
    "DOWNWEIGHT_SETS",
    "EVAL_CHUNK",
    "FORMAT_VERSION",
    "Downweight",
    "LensFileError",
    "LensKind",
    "LensTrainingData",
    "LogitLens",
    "Readout",
    "ResidualCache",
    "TrainConfig",
    "TunedLens",
    "compare_lenses",
    "config_hash",
    "get_lens",
    "get_tuned_lens",
    "heldout_metrics",
    "is_lens_path",
    "kind_names",
    "lens_kind",
    "lens_for",
    "lens_path",
    "load_lens",
    "resolve_config",
    "resolve_lens",
    "save_lens",
    "train_tuned_lens",
]


def lens_for(
    model: Model, lens: str | os.PathLike[str] | Lens = DEFAULT_LENS, *, budget: str | Mapping[str, Any] | TrainConfig = "default",
    **kwargs: Any,
) -> Lens:
    """The lens a chapter asked for, *training it if needed*: :func:`get_lens` with
    ``train=True``. ``"tuned"`` is loaded if saved for ``budget``, otherwise trained
    now and saved (``kwargs``: text, cache_dir, progress, downweight, seed, cache).

    >>> import depthkit as dk
    >>> model = dk.load_model("tiny-llama", seed=0)
    >>> dk.lens_for(model, "logit").name
    'logit'
    """
    return get_lens(model, lens, train=True, budget=budget, **kwargs)


def resolve_lens(model: Model, lens: str | os.PathLike[str] | Lens = DEFAULT_LENS, **kwargs: Any) -> Lens:
    """A lens by name, path or object, never trained: :func:`get_lens` with
    ``train=False``. A tuned lens that is not saved yet raises and says how to make it.

    >>> import depthkit as dk
    >>> model = dk.load_model("tiny-llama", seed=0)
    >>> dk.resolve_lens(model, "logit").n_blocks == model.info.n_blocks
    True
    """
    return get_lens(model, lens, train=False, **kwargs)
