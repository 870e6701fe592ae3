"""Every chapter's headline quantities and the paper's reference values, in one
shape across chapters (what chapter 07 and the verdicts compare, never by a
chapter's own table schema). Chapter modules are imported on first use: checking
parameters never needs them."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from depthkit.chapters.specs import CHAPTERS, Chapter, chapter

HEADLINE_COLUMNS = ["quantity", "value", "lo", "hi", "n", "scale"]
PAPER_COLUMNS = ["quantity", "model", "value", "lo", "hi"]


def chapter_module(ch: Chapter):
    """``depthkit.chapters.chNN_<name>`` of a chapter (imported on first use: checking
    parameters never needs it)."""
    return importlib.import_module(f"depthkit.chapters.ch{ch.slug}")


def headlines(model: str, key: str, results_root: str | Path | None = None) -> Any:
    """The headline quantities of one chapter's saved run of ``model``:
    :data:`HEADLINE_COLUMNS` plus ``model``, ``chapter``, ``n_blocks`` and
    ``value_norm``/``lo_norm``/``hi_norm`` (layers divided by the model's L, other
    quantities as they are). Raises depthkit.core.results.ResultsError when the run is
    missing or incomplete."""
    from depthkit.core.results import load_run

    ch = chapter(key)
    return run_headlines(load_run(model, ch.slug, root=results_root), ch).assign(model=model)


def run_headlines(run: Any, ch: Chapter) -> Any:
    """:func:`headlines` of a run already loaded (without ``model``)."""
    import numpy as np

    out = chapter_module(ch).headlines(run)
    missing = [c for c in HEADLINE_COLUMNS if c not in out.columns]
    if missing:
        raise ValueError(f"Chapter {ch.id}'s headlines lack columns {missing}.")
    n_blocks = int(run.model["n_blocks"])
    scale = np.where(out["scale"] == "layer", 1.0 / n_blocks, 1.0)
    return out[HEADLINE_COLUMNS].assign(
        chapter=ch.id, n_blocks=n_blocks,
        value_norm=out["value"] * scale, lo_norm=out["lo"] * scale, hi_norm=out["hi"] * scale,
    )


def paper_reference() -> Any:
    """The paper's reference values of every chapter that has some (layers as ℓ/L)."""
    import pandas as pd

    frames = []
    for ch in CHAPTERS.values():
        try:
            module = chapter_module(ch)
        except ModuleNotFoundError:
            continue
        paper = getattr(module, "PAPER", None)
        if paper is not None and len(paper):
            frames.append(paper[PAPER_COLUMNS].assign(chapter=ch.id))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*PAPER_COLUMNS, "chapter"])
