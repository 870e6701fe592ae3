"""When a unit can carry a finding at all: enough units and an interval, a lens that
agrees with the model, and for a multiple-choice task an accuracy above the
majority baseline; and the one helper that turns a gated statistic into a
:class:`~depthkit.verdicts.records.Check`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

# The testability thresholds chapter 02 states in its own text (LENS_FLOOR: lens
# agreement with the model at L−1; ONE_ANSWER_MAX: share of prompts given one answer),
# so a chapter and its verdict can never disagree on them.
from depthkit.chapters.ch02_mcq_collection_vs_reasoning import LENS_FLOOR, ONE_ANSWER_MAX
from depthkit.stats import MIN_N
from depthkit.verdicts.quantities import Q_ACCURACY, Q_AGREE, Q_BASELINE, Q_ONE_ANSWER
from depthkit.verdicts.records import Check, Evidence, Stat
from depthkit.verdicts.wording import _above, _ci, _has_interval

# The conditions above in words, as the rules table states them.
_LENS = f"lens top-1 agreement with the model at layer L−1 ≥ {LENS_FLOOR:.0%}"
_TASK = (
    f"per task: accuracy's interval above the gold majority baseline, no answer to more than {ONE_ANSWER_MAX:.0%} "
    f"of prompts, {_LENS}, ≥ {MIN_N} prompts"
)


def _untestable(s: Stat | None, what: str) -> str | None:
    """Why ``s`` cannot carry a finding: not measured, too few units, no interval."""
    if s is None or not math.isfinite(s.value):
        return f"{what} not measured"
    if not s.n >= MIN_N:
        return f"{what} from {s.n:.0f} units, fewer than {MIN_N}"
    if not _has_interval(s):
        return f"{what} has no interval"
    return None


def _lens_gate(ev: Evidence, chapter: str, suffix: str = "") -> str | None:
    a = ev.get(chapter, Q_AGREE + suffix)
    if a is not None and a.value < LENS_FLOOR:
        return f"the lens agrees with the model at layer L−1 on {a.value:.0%} of prompts, below the floor of {LENS_FLOOR:.0%}"
    return None


def _task_gate(ev: Evidence, task: str) -> str | None:
    """Why a multiple-choice task cannot test a claim about when its answer forms."""
    acc, base, one = (ev.get("02", f"{q} ({task})") for q in (Q_ACCURACY, Q_BASELINE, Q_ONE_ANSWER))
    if acc is None or base is None or not _above(acc.lo, base.value):
        return f"accuracy {_ci(acc, True)} does not clear the majority baseline of {_ci(base, True)}"
    if one is not None and one.value > ONE_ANSWER_MAX:
        return f"one answer to {one.value:.0%} of prompts (more than {ONE_ANSWER_MAX:.0%})"
    return _lens_gate(ev, "02", f" ({task})")


def _check(label: str, s: Stat | None, gates: Sequence[str | None], score: Callable[[Stat], tuple[int, str]]) -> Check:
    why = next((g for g in gates if g), None) or _untestable(s, label)
    if why or s is None:
        return Check(label, s, None, why or f"{label} not measured")
    points, text = score(s)
    return Check(label, s, points, text)
