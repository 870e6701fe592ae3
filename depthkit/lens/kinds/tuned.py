"""The tuned lens: an affine translator per layer in front of the model's own readout,
trained on the lens quarter of the corpus (:mod:`depthkit.lens.training`) and saved
by model, budget, text, down-weighting and seed (:mod:`depthkit.lens.store`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from depthkit.lens.base import TunedLens
from depthkit.lens.registry import LensKind
from depthkit.lens.store import LensFileError, get_tuned_lens, lens_path, load_lens
from depthkit.lens.training import start_hash
from depthkit.lens.training_data import Downweight, TrainConfig, as_texts, resolve_config


def _load(
    model: Any,
    *,
    budget: str | Mapping[str, Any] | TrainConfig = "default",
    text: str | Sequence[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
    downweight: Downweight = None,
    seed: int | None = None,
    progress: bool | None = None,  # noqa: ARG001 - nothing runs when only loading
    start: TunedLens | None = None,
) -> TunedLens:
    cfg = resolve_config(budget, seed=seed, downweight=downweight, start=start_hash(budget, start))
    path = lens_path(model, cfg, as_texts(text), cache_dir)
    if not path.exists():
        what = "" if budget == "default" else f"budget={budget!r}, "
        call = "get_tuned_lens(model)" if budget == "default" else f"get_tuned_lens(model, budget={budget!r})"
        raise LensFileError(
            f"No saved tuned lens for {model.info.name!r} ({what}expected at {path}); engine calls never "
            f"train one. Train and cache it first: depthkit.lens.{call}, "
            "or pass lens=depthkit.lens.lens_for(model, 'tuned')."
        )
    return load_lens(model, path)


KIND = LensKind(
    "tuned",
    "an affine translator per layer, trained once per model and budget, then loaded",
    load=_load,
    make=get_tuned_lens,
)
