"""The tuned lens, trained on CPU: the public entry point.

A :class:`TunedLens` puts one affine *translator* in front of the model's own
readout at every layer ℓ < L: ``h ↦ h + A_ℓ h + b_ℓ``. With ``A = b = 0`` it is
exactly the logit lens. This module gathers what the chapters use; the code lives
by idea in :mod:`depthkit.lenses` (:class:`TunedLens` and the one
:class:`Readout`), :mod:`depthkit.lens_data` (configuration and budgets, text
splits, residual caching: :class:`ResidualCache`), :mod:`depthkit.lens_training`
(ridge start, Adam, held-out metrics; how training is made affordable on two CPU
cores), :mod:`depthkit.lens_store` (saving, checked loading, lenses by name) and
:mod:`depthkit.lens_compare` (several lenses on the same prompts).

:func:`lens_for` is the one call that may train: chapters use it to ask for the
lens their parameters name. Engine calls with a lens *name* only load.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from depthkit.lens_compare import compare_lenses
from depthkit.lens_data import (
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
from depthkit.lens_store import LensFileError, get_tuned_lens, lens_path, load_lens, resolve_lens, save_lens
from depthkit.lens_training import EVAL_CHUNK, heldout_metrics, train_tuned_lens
from depthkit.lenses import DEFAULT_LENS, Lens, LogitLens, Readout, TunedLens

if TYPE_CHECKING:
    from depthkit.handles import Model

__all__ = [
    "BUDGETS",
    "DEFAULT_LENS",
    "DOWNWEIGHT_SETS",
    "EVAL_CHUNK",
    "FORMAT_VERSION",
    "Downweight",
    "LensFileError",
    "LensTrainingData",
    "LogitLens",
    "Readout",
    "ResidualCache",
    "TrainConfig",
    "TunedLens",
    "compare_lenses",
    "config_hash",
    "get_tuned_lens",
    "heldout_metrics",
    "lens_for",
    "lens_path",
    "load_lens",
    "resolve_config",
    "resolve_lens",
    "save_lens",
    "train_tuned_lens",
]


def lens_for(
    model: Model, lens: str | Lens = DEFAULT_LENS, *, budget: str | Mapping[str, Any] | TrainConfig = "default", **kwargs: Any
) -> Lens:
    """The lens a chapter asked for, *training it if needed*: ``"logit"`` is the logit
    lens, ``"tuned"`` the tuned lens for ``budget`` (loaded if saved, otherwise
    trained now and saved: :func:`get_tuned_lens`, which takes ``kwargs``: text,
    cache_dir, progress, downweight, seed, cache), a :class:`Lens` itself.

    A path to a saved lens file (``.safetensors`` with its JSON sidecar) loads that
    lens, checked against this model (:func:`load_lens`).

    Engine calls (``trajectories(model, lens="tuned")``) only load saved lenses
    (:func:`resolve_lens`); this is the call that says training may happen."""
    if lens == "tuned":
        return get_tuned_lens(model, budget, **kwargs)
    if isinstance(lens, (str, os.PathLike)) and is_lens_path(lens):
        return load_lens(model, os.fspath(lens))
    return resolve_lens(model, lens)


def is_lens_path(lens: str | os.PathLike) -> bool:
    """Whether a ``lens`` parameter names a saved lens file rather than a lens kind."""
    return os.fspath(lens).endswith((".safetensors", ".json"))
