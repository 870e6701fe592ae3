"""Words for numbers: the one way every chapter writes an estimate with its
interval, and the rules that keep generated prose from claiming more than the
numbers show.

* An interval is written "(95 % CI lo–hi)"; where :mod:`depthkit.stats` gave none
  (too few units), the text says it cannot be measured here.
* A difference is stated as a finding only when its interval excludes zero as
  printed: an end that prints as zero ("-0.00") carries no finding, since a reader
  cannot check the claim against it. Otherwise it is "no clear difference". A
  difference whose interval has equal ends is written as a share of resamples on
  its grid, never "CI -2 to -2", and one with a side reached only at the output is
  a bound ("at least").
* A layer reached only at the model's output is "the output, not before", never
  "layer L of L"; a zero-width layer interval is "in N % of resamples" on its grid.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from depthkit.stats.intervals import LEVEL, MIN_N
from depthkit.stats.layers import LayerCI

if TYPE_CHECKING:
    from depthkit.core.model_info import ModelInfo

CI_LABEL = f"{LEVEL:.0%} CI".replace("%", " %")
NO_INTERVAL = f"interval cannot be measured here: fewer than {MIN_N} units"
# What an interval with equal ends says instead of "CI 3 to 3": the estimate held in
# at least the interval's share of resamples.
EQUAL_ENDS = f"in at least {LEVEL:.0%} of resamples".replace("%", " %")


def _finite(*xs: float | None) -> bool:
    return all(x is not None and math.isfinite(float(x)) for x in xs)


def estimate(value: float, lo: float = math.nan, hi: float = math.nan, *, digits: int = 1, unit: str = "") -> str:
    """``"12.3 (95 % CI 10.1–14.0)"``; ``"12.3 (interval cannot be measured here …)"``
    without an interval; ``"—"`` without an estimate. ``unit`` follows each number."""
    if not _finite(value):
        return "—"
    u = f" {unit.strip()}" if unit.strip() else ""
    point = f"{value:.{digits}f}{u}"
    if not _finite(lo, hi):
        return f"{point} ({NO_INTERVAL})"
    if f"{lo:.{digits}f}" == f"{hi:.{digits}f}":  # "CI 10.1–10.1" would read as exact
        return f"{point} ({EQUAL_ENDS})"
    return f"{point} ({CI_LABEL} {lo:.{digits}f}–{hi:.{digits}f}{u})"


def share(value: float, lo: float = math.nan, hi: float = math.nan, *, digits: int = 1) -> str:
    """A proportion in per cent with its interval: ``"86.0 % (95 % CI 82.5–89.5 %)"``."""
    scale = [x * 100 if _finite(x) else math.nan for x in (value, lo, hi)]
    return estimate(*scale, digits=digits, unit="%")


def _pct(x: float) -> str:
    return f"{x:.0%}".replace("%", " %")


def _grid(step: float) -> str:
    return f"grid: {step:g} layer{'' if step == 1 else 's'}"


def layer(
    value: float | LayerCI,
    lo: float = math.nan,
    hi: float = math.nan,
    *,
    n_blocks: int | None = None,
    mode_share: float = math.nan,
    step: float = 1.0,
    censored_share: float = math.nan,
) -> str:
    """A layer with its interval, in words that follow a preposition ("settled at …";
    ``value`` may be a :class:`depthkit.stats.LayerCI`, whose fields fill the rest):

    * ``"layer 12 of 30 (95 % CI 10–14)"``; a mean between layers keeps one decimal
      where whole layers would show a zero-width interval: ``"layer 12.3 of 30 (95 % CI 12.1–12.4)"``;
    * at row ``n_blocks``, the model's own output, never "layer 30 of 30": ``"the output,
      not before (in 97 % of resamples)"``; an interval reaching it ends "to the output";
    * a zero-width interval of a layer on the grid: ``"layer 1 of 30 in 97 % of
      resamples (grid: 1 layer)"``.
    """
    if isinstance(value, LayerCI):
        value, lo, hi, _, mode_share, step, censored_share = value
    if not _finite(value):
        return "—"
    of = f" of {n_blocks}" if n_blocks else ""
    resamples = f"in {_pct(censored_share)} of resamples" if _finite(censored_share) else ""
    if n_blocks and round(value) >= n_blocks:
        reach = f"{CI_LABEL} from layer {round(lo)}" if _finite(lo) and round(lo) < n_blocks else ""
        note = "; ".join(x for x in (resamples, reach) if x)
        return "the output, not before" + (f" ({note})" if note else "")
    if _finite(lo, hi) and lo == hi:
        seen = f"in {_pct(mode_share)} of resamples" if _finite(mode_share) else EQUAL_ENDS
        return f"layer {round(value)}{of} {seen} ({_grid(step)})"
    digits = 1 if _finite(lo, hi) and round(lo) == round(hi) else 0
    point = f"{value:.{digits}f}" if digits else f"{round(value)}"
    if not _finite(lo, hi):
        return f"layer {point}{of} ({NO_INTERVAL})"
    top = "the output" if n_blocks and round(hi) >= n_blocks else f"{hi:.{digits}f}" if digits else f"{round(hi)}"
    low = f"{lo:.{digits}f}" if digits else f"{round(lo)}"
    sep = " to " if top == "the output" else "–"
    return f"layer {point}{of} ({CI_LABEL} {low}{sep}{top})"


def shown(x: float, digits: int) -> float:
    """``x`` as a reader sees it printed with ``digits`` decimals (-0.0034 at 2 is 0):
    the value a sentence's claim must hold for."""
    return float(f"{x:.{digits}f}") + 0.0  # + 0.0 turns -0.0 into 0.0


def above(x: float, bound: float, *, digits: int) -> bool:
    """``x`` exceeds ``bound`` as both are printed with ``digits`` decimals."""
    return _finite(x, bound) and shown(x, digits) > shown(bound, digits)


def excludes_zero(lo: float, hi: float, *, digits: int) -> bool:
    """True when an interval exists and, printed with ``digits`` decimals, lies
    entirely on one side of zero. Judged as printed so that no sentence says
    "(95 % CI -0.77 to -0.00) excludes zero": such an end sits on the line, and a
    retrained lens can move it across."""
    return above(lo, 0.0, digits=digits) or above(0.0, hi, digits=digits)


def at_output(subject: float, than: float, n_blocks: int) -> Literal["subject", "than", "both"] | None:
    """Which side of a difference of two layers (estimates) is reached only at the
    output row ``n_blocks``: the ``censored`` argument of :func:`difference`."""
    a, b = _finite(subject) and subject >= n_blocks, _finite(than) and than >= n_blocks
    return "both" if a and b else "subject" if a else "than" if b else None


def interval(lo: float, hi: float, *, digits: int, step: float | None = None) -> str:
    """A signed interval, for sentences that write their own estimate: ``"95 % CI -3
    to -1"``; an interval whose ends are equal is no precise value but
    the same value in at least the interval's share of resamples, on the grid where
    ``step`` names one: ``"-2 in at least 95 % of resamples, grid: 1 layer"``. Ends that
    differ but print alike are said the same way."""
    if f"{lo:+.{digits}f}" == f"{hi:+.{digits}f}":
        grid = f", {_grid(step)}" if step else ""
        return f"{lo:+.{digits}f} {EQUAL_ENDS}{grid}"
    return f"{CI_LABEL} {lo:+.{digits}f} to {hi:+.{digits}f}"


def difference(
    diff: float,
    lo: float,
    hi: float,
    *,
    more: str,
    less: str,
    than: str,
    subject: str,
    digits: int = 1,
    unit: str = "layers",
    step: float | None = None,
    censored: Literal["subject", "than", "both"] | None = None,
) -> str:
    """A sentence about ``subject`` minus ``than`` that states a direction only when
    the interval excludes zero as printed (``digits`` decimals). ``more``/``less``:
    the words for a positive/negative difference ("later"/"earlier"). E.g.
    ``"content words are 5.4 layers later than function words (95 % CI +4.5 to
    +6.3)"`` or ``"no clear difference between content words and function words
    (-1.2 layers, 95 % CI -3.0 to +0.6)"``. ``step``: the grid of the difference's
    values (1 for whole layers), named where the interval has no width.

    ``censored``: which side is reached only at the model's output ("the output, not
    before"). Its layer is then a bound, not a value, and so is the difference: with
    the subject at the output the true gap is at least the measured one, so only a
    positive difference is a finding (and the text says "at least"); with ``than`` at
    the output, only a negative one; with both there, no order can be measured."""
    if censored == "both":
        return f"the order of {subject} and {than} cannot be measured here: both are reached only at the output"
    if not _finite(diff):
        return f"the difference between {subject} and {than} cannot be measured here"
    if unit.endswith("s") and f"{abs(diff):.{digits}f}" == "1":
        unit = unit[:-1]  # "1 layer", but "1.0 layers"
    if not _finite(lo, hi):
        return f"{subject} differ from {than} by {diff:+.{digits}f} {unit} ({NO_INTERVAL}); no finding is drawn from it"
    ci = interval(lo, hi, digits=digits, step=step)
    bound = ""
    finding = excludes_zero(lo, hi, digits=digits)
    if censored is not None:
        side = subject if censored == "subject" else than
        bound = f"; {side} only at the output, so the gap is a bound"
        finding = above(lo, 0.0, digits=digits) if censored == "subject" else above(0.0, hi, digits=digits)
    if not finding:
        return f"no clear difference between {subject} and {than} ({diff:+.{digits}f} {unit}, {ci}{bound})"
    word = more if diff > 0 else less
    least = "at least " if censored else ""
    return f"{subject} are {least}{abs(diff):.{digits}f} {unit} {word} than {than} ({ci}{bound})"


def model_note(info: ModelInfo, lens_name: str, convention: str, *, paper: str = "one of the paper's 7–8B models") -> str:
    """The sentence every chapter opens its results with: which model (and that
    quantised weights of a small model are not the paper's models), which lens, which
    layer convention."""
    shape = f"{info.n_blocks} blocks, vocabulary {info.d_vocab:,}"
    if info.is_quantised:
        who = (
            f"**{info.name}** ({shape}) runs here from {info.quantisation} weights: a small quantised model, "
            f"not {paper}. Compare shapes and orders of magnitude with the paper, not exact values."
        )
    else:
        who = f"**{info.name}** ({shape}, weights not quantised)."
    return f"{who} Lens: **{lens_name}**, layer convention **{convention}**."
