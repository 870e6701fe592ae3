"""One model's evidence from its saved runs: every chapter's headlines (layers as
ℓ/L) plus the quantities each chapter's claims derive from its tables."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from depthkit.chapters import CHAPTERS, run_headlines
from depthkit.core import results as saved
from depthkit.core.results import ResultsError, Run, load_run
from depthkit.verdicts.ch01_claims import _derive_01
from depthkit.verdicts.ch02_claims import _derive_02
from depthkit.verdicts.ch03_claims import _derive_03
from depthkit.verdicts.ch04_claims import _derive_04
from depthkit.verdicts.ch05_claims import _derive_05
from depthkit.verdicts.ch06_claims import _derive_06
from depthkit.verdicts.quantities import _rows
from depthkit.verdicts.records import EVIDENCE_COLUMNS, Evidence

DERIVED: dict[str, Callable[[Run, Callable[[str], Run | None]], list[tuple]]] = {
    "01": _derive_01, "02": _derive_02, "03": _derive_03, "04": _derive_04, "05": _derive_05, "06": _derive_06,
}
_READ_ERRORS = (ResultsError, KeyError, AttributeError, ValueError, IndexError, TypeError)


def _runs(model: str, root: Path) -> dict[str, Run]:
    out = {}
    for ch in CHAPTERS.values():
        if ch.reads_results:
            continue
        try:
            out[ch.id] = load_run(model, ch.slug, root=root)
        except ResultsError:
            continue
    return out


def evidence(model: str, root: str | Path | None = None, runs: dict[str, Run] | None = None) -> Evidence:
    """Every chapter's headlines for ``model`` (layers as ℓ/L) and the quantities the
    rules derive from the saved tables. A run that cannot be read adds nothing."""
    runs = _runs(model, saved.results_root(root)) if runs is None else runs
    frames = []
    for key, run in runs.items():
        try:
            h = run_headlines(run, CHAPTERS[key])
        except _READ_ERRORS:
            continue
        frames.append(h.assign(value=h["value_norm"], lo=h["lo_norm"], hi=h["hi_norm"])[EVIDENCE_COLUMNS])
        if key not in DERIVED:
            continue
        try:
            frames.append(_rows(key, DERIVED[key](run, runs.get)))
        except _READ_ERRORS as err:
            # A run saved without a table the rules need: its verdicts say "not measured".
            warnings.warn(f"{model}, chapter {key}: {type(err).__name__}: {str(err)[:160]}", stacklevel=2)
    return Evidence(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=EVIDENCE_COLUMNS))
