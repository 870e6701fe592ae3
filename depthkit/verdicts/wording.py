"""How a verdict writes its numbers: a value with its interval (or that every
resample agreed), a layer as ℓ/L where the output row means "not before the
output", and a verdict's values for the findings table."""

from __future__ import annotations

import math

from depthkit.stats import narrate
from depthkit.stats.narrate import EQUAL_ENDS
from depthkit.verdicts.records import Stat, Verdict

# Decimals of every value a verdict prints (a share in whole per cent has the same),
# and so the precision every comparison that decides a verdict is judged at.
DIGITS = 2


def _above(x: float, bound: float) -> bool:
    """``x`` exceeds ``bound`` as a verdict prints both."""
    return narrate.above(x, bound, digits=DIGITS)


def _excludes_zero(s: Stat) -> bool:
    return narrate.excludes_zero(s.lo, s.hi, digits=DIGITS)


def _ci(s: Stat | None, pct: bool = False) -> str:
    """A value with its interval; an interval whose ends are equal is not shown as
    one (at least 95 % of resamples gave the same grid value: it says so instead)."""
    if s is None or not math.isfinite(s.value):
        return "—"
    f = (lambda v: f"{v:.{DIGITS - 2}%}") if pct else (lambda v: f"{v:.{DIGITS}f}")
    if not (math.isfinite(s.lo) and math.isfinite(s.hi)):
        return f(s.value)
    if f(s.lo) == f(s.hi):
        return f"{f(s.value)} ({EQUAL_ENDS})"
    return f"{f(s.value)} [{f(s.lo)}, {f(s.hi)}]"


def _at_output(s: Stat | None) -> str | None:
    """"the output, not before" for a layer ℓ/L at the output row (1), which is
    censoring, not a depth; None for any other."""
    if s is not None and math.isfinite(s.value) and s.value >= 1:
        share = "" if not _has_interval(s) or s.lo >= 1 else f" (95 % CI from ℓ/L {s.lo:.{DIGITS}f})"
        return f"the output, not before{share}"
    return None


def _layer_at(s: Stat | None) -> str:
    """A layer as ℓ/L, or "the output, not before"."""
    return _at_output(s) or f"ℓ/L {_ci(s)}"


def value_text(value: float, lo: float, hi: float, *, layer: bool = False) -> str:
    """A value with its interval as every verdict writes it; ``layer``: the value is a
    depth ℓ/L, where 1 (the output row) is censoring."""
    s = Stat(value, lo, hi, math.nan)
    return (_at_output(s) if layer else None) or _ci(s)


def _has_interval(s: Stat) -> bool:
    return math.isfinite(s.lo) and math.isfinite(s.hi)


def _values(v: Verdict) -> str:
    shown = [c for c in v.checks if c.stat is not None and math.isfinite(c.stat.value)]
    if len(v.checks) == 1 and shown:
        return _ci(shown[0].stat)
    return "; ".join(f"{c.label} {_ci(c.stat)}" for c in shown) or "—"
