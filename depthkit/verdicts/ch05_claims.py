"""Chapter 05's claim (a book addition): the residual stream changes regime partway
through the network. Its test and the slope change and edge distance read from the
chapter's saved phase test."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from depthkit.core.results import Run
from depthkit.verdicts.quantities import Q_EDGE, Q_SLOPE
from depthkit.verdicts.records import Check, Evidence, Reference, Stat
from depthkit.verdicts.testability import _check
from depthkit.verdicts.wording import _ci, _excludes_zero


def _phase_change(ev: Evidence, ref: Reference) -> list[Check]:
    edge = ev.get("05", Q_EDGE)

    def score(s: Stat) -> tuple[int, str]:
        text = f"slope change at ℓ*: {_ci(s)}"
        if not _excludes_zero(s):
            return 0, text + ": one line fits as well as two segments"
        if edge is None or edge.value <= 0:
            return 0, text + ", but ℓ* sits on the edge of the fit range"
        if edge.value <= 1:
            return 1, text + ", ℓ* one block from the edge of the fit range"
        return 2, text + ", ℓ* interior"

    return [_check("phase change", ev.get("05", Q_SLOPE), [], score)]


def _derive_05(run: Run, other: Callable[[str], Run | None]) -> list[tuple]:
    if "phase_test" not in run.tables:
        return []
    t = run["phase_test"].iloc[0]
    edge = min(t["split"] - t["first_knot"], t["last_knot"] - t["split"])
    return [(Q_SLOPE, t["slope_change"], t["slope_change_lo"], t["slope_change_hi"], t["n"]),
            (Q_EDGE, edge, np.nan, np.nan, t["n"])]
