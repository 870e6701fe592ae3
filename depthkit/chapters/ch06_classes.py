"""Chapter 06's depth by frequency bucket and word class: content minus function
words on first reach (d₁) and on saturation (d_sat), passages resampled, a d₁ at the
output censored rather than counted; the table and the prose of the comparison."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from depthkit import stats
from depthkit.analyses import frequency
from depthkit.chapters.ch06_passages import _unit_ci
from depthkit.stats import narrate


def _class_sums(kept: pd.DataFrame, measure: str) -> tuple[pd.Index, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Per passage (every passage holding a function or content word), the sum and
    count of ``measure`` over each class's tokens; a d₁ at the output is censored,
    not a value, and counts in neither."""
    d = kept[kept["word_class"].isin(["function", "content"])]
    items = pd.Index(np.unique(d["item"]), name="item")
    ok = d[d[measure] < 1] if measure == "d1_norm" else d.dropna(subset=[measure])
    out = {}
    for cls in ("function", "content"):
        g = ok[ok["word_class"] == cls].groupby("item")[measure].agg(["sum", "count"]).reindex(items, fill_value=0)
        out[cls] = (g["sum"].to_numpy(dtype=float), g["count"].to_numpy(dtype=float))
    return items, out


def _difference_stat(sums: dict[str, tuple[np.ndarray, np.ndarray]]) -> Callable[[np.ndarray], float]:
    (sc, cc), (sf, cf) = sums["content"], sums["function"]
    return lambda idx: sc[idx].sum() / cc[idx].sum() - sf[idx].sum() / cf[idx].sum()


def class_difference(kept: pd.DataFrame, measure: str = "d1_norm", *, n_boot: int, seed: int) -> stats.CI:
    """Mean ``measure`` of content minus function words, the interval from resampling
    passages (both classes of a passage go in or out together); a d₁ at the output
    is censored, not a value, and left out. ``n``: the passages holding a function or
    content word."""
    items, sums = _class_sums(kept, measure)
    if not len(items) or not all(c.sum() for _, c in sums.values()):
        return stats.CI(np.nan, np.nan, np.nan, 0)
    return _unit_ci(len(items), _difference_stat(sums), n_boot=n_boot, seed=seed)


# The two depths of the word-class comparison: d₁ (first reach, the paper's measure) and d_sat.
DEPTHS = {"d1_norm": "first reach (d₁/L)", "d_sat_norm": "saturation (d_sat/L)"}


def class_gaps(kept: pd.DataFrame, *, n_boot: int, seed: int) -> dict[str, stats.CI]:
    """Content minus function words on first reach (``d1_norm``) and on saturation
    (``d_sat_norm``), and ``change``: the saturation gap minus the first-reach gap.
    All three from the same passage draws (same seed, same passages), so the change
    is paired."""
    items, first = _class_sums(kept, "d1_norm")
    _, sat = _class_sums(kept, "d_sat_norm")
    if not len(items) or not all(c.sum() for _, c in first.values()) or not all(c.sum() for _, c in sat.values()):
        nan = stats.CI(np.nan, np.nan, np.nan, 0)
        return {"d1_norm": nan, "d_sat_norm": nan, "change": nan}
    f, s = _difference_stat(first), _difference_stat(sat)
    kw = dict(n_boot=n_boot, seed=seed)
    return {"d1_norm": _unit_ci(len(items), f, **kw), "d_sat_norm": _unit_ci(len(items), s, **kw),
            "change": _unit_ci(len(items), lambda i: s(i) - f(i), **kw)}


def class_gap_table(class_summary: pd.DataFrame, gaps: dict[str, stats.CI]) -> pd.DataFrame:
    """One row a depth (first reach, saturation): each class's mean with its interval
    over passages (d₁ before the output, with its share at the output) and content
    minus function, in fractions of depth L."""
    rows = []
    for measure, label in DEPTHS.items():
        g = gaps.get(measure)
        if g is None or not np.isfinite(g.estimate):
            continue
        row = {"measure": label, "paper's measure": measure == "d1_norm"}
        for cls in ("function", "content"):
            r = class_summary[(class_summary["measure"] == measure) & (class_summary["word_class"].astype(str) == cls)]
            row[f"{cls} (L)"] = r["estimate"].iloc[0] if len(r) else np.nan
            row[f"{cls} lo"] = r["lo"].iloc[0] if len(r) else np.nan
            row[f"{cls} hi"] = r["hi"].iloc[0] if len(r) else np.nan
            row[f"{cls}: at the output"] = r["censored"].iloc[0] if len(r) and "censored" in r else np.nan
        row |= {"content − function (L)": g.estimate, "lo": g.lo, "hi": g.hi, "passages": g.n}
        rows.append(row)
    cols = ["measure", "paper's measure",
            *(f"{c}{s}" for c in ("function", "content") for s in (" (L)", " lo", " hi", ": at the output")),
            "content − function (L)", "lo", "hi", "passages"]
    return pd.DataFrame(rows, columns=cols)


def _est(summary: pd.DataFrame, group: str, measure: str, key: str) -> str:
    r = summary[(summary["measure"] == measure) & (summary[group].astype(str) == key)]
    if r.empty:
        return "—"
    r = r.iloc[0]
    text = narrate.estimate(r["estimate"], r["lo"], r["hi"], digits=2)
    if measure != "d1_norm" or "censored" not in r or not np.isfinite(r["censored"]):
        return text
    return f"{text} before the output ({narrate.share(r['censored'], r['censored_lo'], r['censored_hi'], digits=0)} only at the output, not before)"


def _gap_sentence(g: stats.CI) -> str:
    return narrate.difference(g.estimate, g.lo, g.hi, more="later", less="earlier", than="function words",
                              subject="content words", digits=2, unit="L")


def gaps_text(class_summary: pd.DataFrame, gaps: dict[str, stats.CI]) -> str:
    """Content minus function words on first reach (d₁) and on saturation (d_sat),
    each with its interval over passages, how the two gaps differ (paired draws), and
    which depth the paper's claim is about."""
    cls = lambda m, k: _est(class_summary, "word_class", m, k)  # noqa: E731
    text = (
        f"On first reach, correctly predicted function words (DET, ADP, PUNCT) reach rank 1 at d₁/L = {cls('d1_norm', 'function')}, "
        f"content words (NOUN, VERB, ADJ) at {cls('d1_norm', 'content')}: {_gap_sentence(gaps['d1_norm'])}."
    )
    sat, change = gaps.get("d_sat_norm"), gaps.get("change")
    if sat is not None and np.isfinite(sat.estimate):
        text += (f" On saturation, function words settle at d_sat/L = {cls('d_sat_norm', 'function')}, content words at "
                 f"{cls('d_sat_norm', 'content')}: {_gap_sentence(sat)}.")
    if change is not None and np.isfinite(change.estimate):
        if not np.isfinite(change.lo):
            text += f" The saturation gap differs from the first-reach gap by {change.estimate:+.2f} L ({narrate.NO_INTERVAL}); no finding is drawn from it."
        elif narrate.excludes_zero(change.lo, change.hi, digits=2):
            text += (f" The content − function gap is {abs(change.estimate):.2f} L {'smaller' if change.estimate < 0 else 'larger'} on saturation than on "
                     f"first reach ({narrate.interval(change.lo, change.hi, digits=2)}, the same passages drawn for both).")
        else:
            text += f" The two gaps show no clear difference ({change.estimate:+.2f} L, {narrate.interval(change.lo, change.hi, digits=2)})."
    return text + (" The paper's claim is about first reach (its part-of-speech figure plots the earliest layer at which the "
                   "answer reaches rank ≤ k); its main figure has ≈ 5 and ≈ 20 of 32 layers (0.16 and 0.62).")


def groups_text(bucket_summary: pd.DataFrame, class_summary: pd.DataFrame, gap: stats.CI | dict[str, stats.CI],
                scores: pd.DataFrame) -> str:
    """Markdown bullets on depth by frequency bucket and word class. ``gap``:
    :func:`class_gaps` (first reach and saturation), or one :func:`class_difference`
    (first reach only)."""
    gaps = gap if isinstance(gap, dict) else {"d1_norm": gap}
    top_b, rest_b = frequency.BUCKETS[0], frequency.BUCKETS[-1]
    b = lambda m, k: _est(bucket_summary, "bucket", m, k)  # noqa: E731
    lines = [
        f"* Tokens predicted from the {top_b} bucket reach rank 1 at d₁/L = {b('d1_norm', top_b)} on average and settle at "
        f"d_sat/L = {b('d_sat_norm', top_b)}; tokens from the '{rest_b}' bucket at {b('d1_norm', rest_b)} and "
        f"{b('d_sat_norm', rest_b)}."
    ]
    classes = set(class_summary["word_class"]) if len(class_summary) else set()
    if {"function", "content"} <= classes:
        lines.append(f"* {gaps_text(class_summary, gaps)}")
    else:
        lines.append("* Too few correctly predicted function or content words to compare the two classes; raise n_texts.")
    lines.append(f"* {scores['correct'].mean():.1%} of the {len(scores):,} predictions are the true next token.")
    return "\n".join(lines)
