"""Chapter 01's claims (guess, then refine): early layers guess a frequent token,
and the output overturns most of those guesses. Their tests, the paper's
references, and the lens agreement derived from the chapter's saved run."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from depthkit.chapters.ch01_guess_then_refine import Q_EARLY_FLIP, Q_FINAL, Q_FLIP, Q_L1
from depthkit.core.results import Run
from depthkit.verdicts.quantities import Q_AGREE, _paper, _share
from depthkit.verdicts.records import Check, Evidence, Reference, Stat
from depthkit.verdicts.testability import _check, _lens_gate
from depthkit.verdicts.wording import _above, _ci, _has_interval


def _frequent_early(ev: Evidence, ref: Reference) -> list[Check]:
    final = ev.get("01", Q_FINAL)

    def score(s: Stat) -> tuple[int, str]:
        where = f"layer-1 Top-10 share {_ci(s, True)}"
        if _above(s.lo, ref.value):
            return 2, f"{where} lies above the paper's {ref.value:.0%}"
        if final is not None and _has_interval(final) and _above(s.lo, final.hi):
            return 1, f"{where} lies above the output's {_ci(final, True)} but not clearly above the paper's {ref.value:.0%}"
        return 0, f"{where} is not clearly above the output's {_ci(final, True)}"

    return [_check("layer-1 Top-10 share", ev.get("01", Q_L1), [_lens_gate(ev, "01")], score)]


def _overturned(ev: Evidence, ref: Reference) -> list[Check]:
    def score(s: Stat) -> tuple[int, str]:
        where = f"{_ci(s, True)} of layer-1 Top-10 guesses are overturned"
        if _above(s.lo, ref.value):
            return 2, f"{where}, above the paper's {ref.value:.0%}"
        if _above(s.lo, 0.5):
            return 1, f"{where}: most, but not clearly above the paper's {ref.value:.0%}"
        return 0, f"{where}: not clearly most of them"

    return [_check("layer-1 flip rate", ev.get("01", Q_FLIP), [_lens_gate(ev, "01")], score)]


def _ref_frequent(paper: pd.DataFrame) -> Reference:
    l1, fin = _paper(paper, Q_L1), _paper(paper, Q_FINAL)
    return Reference(l1["lo"], f"> {l1['lo']:.0%} at layer 1, ≈ {fin['value']:.0%} at the output ({l1['model']})")


def _ref_overturned(paper: pd.DataFrame) -> Reference:
    early, l1 = _paper(paper, Q_EARLY_FLIP), _paper(paper, Q_FLIP)
    return Reference(early["lo"], f"> {early['lo']:.0%} ({early['model']}); ≈ {l1['value']:.0%} at layer 1 ({l1['model']})")


def _derive_01(run: Run, other: Callable[[str], Run | None]) -> list[tuple]:
    fl = run["flip_rates"]
    last = fl[fl["layer"] == int(run.model["n_blocks"]) - 1]
    return [(Q_AGREE, *_share(last["n"].sum() - last["n_flipped"].sum(), last["n"].sum(), run))] if len(last) else []
