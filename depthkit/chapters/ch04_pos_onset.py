"""Chapter 04 (part of speech and depth): the onset tables beyond :mod:`depthkit.analyses.part_of_speech`
and :mod:`depthkit.analyses.part_of_speech_filter`, the two frequency controls, the generated prose,
the headline quantities and the paper's reference rows.

The unit of every interval is a passage: up to one example per tag comes from one
passage, so the examples of a word class share passages and are resampled with them
(examples loaded from files name no passage and are each their own unit; the
frequency controls still resample examples). Onsets count depth from layer 1
(:data:`depthkit.analyses.summaries.FIRST_DEPTH_LAYER`): layer 0 is the token embedding read
through the lens. An onset at L, the model's own output, is "not before the output":
means are over the onsets before it, and the share at L is reported beside them.

Two depths per example and k: **first reach** (``onset``), the earliest layer at
which the answer's rank is ≤ k, the paper's measure; and **saturation**
(``saturation``), the earliest layer from which the rank stays ≤ k at every layer
up to the output (the last layer where it is not yet ≤ k, plus one). A saturation at
L (the lens never holds the answer at L-1) is censored like an onset at L.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from depthkit import stats
from depthkit.analyses import part_of_speech, summaries
from depthkit.analyses.frequency import ranks_of
from depthkit.analyses.part_of_speech_filter import filter_sentence
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.stats import narrate

# The paper's main figure: rank-1 onset near layer 5 for function words and near
# layer 20 for content words, of 32 blocks.
PAPER_BLOCKS = 32
PAPER_ONSETS = {"function": 5.0, "content": 20.0}
PAPER = pd.DataFrame(
    [(f"rank-1 onset, {c} words", "main figure (32 blocks)", v / PAPER_BLOCKS, math.nan, math.nan) for c, v in PAPER_ONSETS.items()],
    columns=PAPER_COLUMNS,
)
# A frequency bin enters the matched comparison only with this many examples of each
# class: a bin with one example of a class has no variance to speak of.
MIN_PER_BIN = 5
LATER = dict(more="later", less="earlier", unit="layers")
# The two depths of an example at k = 1: column of the layer, column of its censoring, words.
MEASURES = {
    "first reach": ("onset", "censored", "the earliest layer at which the answer is the top-1 token"),
    "saturation": ("saturation", "sat_censored", "the layer from which it stays the top-1 token through the output"),
}


def saturation_layers(targets: pd.DataFrame, ks: Sequence[int], *, first_layer: int = summaries.FIRST_DEPTH_LAYER) -> pd.DataFrame:
    """Per item and k, the earliest layer ≥ ``first_layer`` from which the target's
    rank is ≤ k at every later layer up to the last one (NaN if it is not ≤ k at the
    last layer; a layer missing for an item counts as not ≤ k). ``targets``: rows
    ``[item, layer, rank]`` of one target. Returns ``[item, k, saturation]``."""
    t = targets[targets["layer"] >= int(first_layer)]
    wide = t.pivot(index="item", columns="layer", values="rank").sort_index(axis=1)
    layers = wide.columns.to_numpy()
    r = np.where(np.isnan(wide.to_numpy(dtype=float)), np.inf, wide.to_numpy(dtype=float))
    worst_after = np.maximum.accumulate(r[:, ::-1], axis=1)[:, ::-1]  # [item, layer]: the worst rank from here on
    k_arr = np.asarray([int(k) for k in ks], dtype=float)
    held = worst_after[:, :, None] <= k_arr[None, None, :]  # [item, layer, k], non-decreasing along layers
    first = held.argmax(axis=1)
    sat = np.where(held.any(axis=1), layers[first].astype(float), np.nan)
    return pd.DataFrame({"item": np.repeat(wide.index.to_numpy(), len(k_arr)),
                         "k": np.tile(k_arr.astype(np.int64), len(wide)), "saturation": sat.reshape(-1)})


def onsets_of(traj: Any, kept: pd.DataFrame, freq: pd.DataFrame, ks: Sequence[int], tags: Sequence[str]) -> pd.DataFrame:
    """Per example and k, the earliest layer (from layer 1) at which the answer's rank
    is ≤ k (``onset``, first reach) and the layer from which it stays ≤ k to the output
    (``saturation``, :func:`saturation_layers`), with the example's tag, word class,
    answer, the end of its prompt and the corpus frequency rank (and its bin) of the
    answer's first token. ``traj``: trajectories of ``kept``'s prompts with the target
    ``answer``."""
    meta = kept[["tag", "word_class", "answer"]].assign(
        item=np.arange(len(kept)), freq_rank=ranks_of(freq, kept["answer_id"].to_numpy()),
        prompt_end="…" + kept["prompt"].str[-40:],
        passage=kept["passage_id"].to_numpy() if "passage_id" in kept else np.arange(len(kept)),
    )
    meta["freq_bin"] = summaries.rank_bins(meta["freq_rank"])
    answer = traj.target("answer")
    onsets = summaries.onset_layers(answer, ks, first_layer=summaries.FIRST_DEPTH_LAYER)
    onsets = onsets.merge(saturation_layers(answer, ks), on=["item", "k"], how="left").merge(meta, on="item")
    order = [t for t in tags if t in set(kept["tag"])]
    onsets["tag"] = pd.Categorical(onsets["tag"], categories=order, ordered=True)
    return onsets


def _unit(k1: pd.DataFrame) -> str:
    return "passage" if "passage" in k1.columns else "item"


def _gap_stat(k1: pd.DataFrame, value: str, censored: str) -> Callable[[np.ndarray], float]:
    """Content minus function mean of ``value`` over the rows of the drawn indices
    that are not ``censored``: NaN where a draw lacks either class."""
    v = k1[value].to_numpy(dtype=float)
    ok = ~k1[censored].to_numpy(dtype=bool) & np.isfinite(v)
    content = (k1["word_class"] == "content").to_numpy()

    def gap(i: np.ndarray) -> float:
        i = np.asarray(i, dtype=int)
        i = i[ok[i]]
        c = content[i]
        return v[i][c].mean() - v[i][~c].mean() if c.any() and not c.all() else np.nan

    return gap


def class_gap(k1: pd.DataFrame, value: str = "onset", censored: str = "censored", *, n_boot: int, seed: int) -> pd.Series:
    """Mean ``value`` (default: the rank-1 onset) of content minus function words over
    the rows before the output (``censored`` False), passages resampled (every example
    of a drawn passage goes in, both classes together): a row like
    :func:`depthkit.stats.stratified_difference`'s pooled one (``n``: passages)."""
    d = k1[k1["word_class"].isin(["function", "content"])].reset_index(drop=True)
    before = d[~d[censored].astype(bool) & d[value].notna()]
    v, content = before[value].to_numpy(dtype=float), (before["word_class"] == "content").to_numpy()
    ci = stats.bootstrap_ci(np.arange(len(d)), stat=_gap_stat(d, value, censored), n_boot=n_boot, seed=seed,
                            units=d[_unit(d)].to_numpy())
    return pd.Series({"stratum": "all", "n_a": int((~content).sum()), "n_b": int(content.sum()), "mean_a": v[~content].mean(),
                      "mean_b": v[content].mean(), "used": True, "diff": ci.estimate, "lo": ci.lo, "hi": ci.hi, "n": ci.n})


def gap_change(k1: pd.DataFrame, *, n_boot: int, seed: int) -> stats.CI:
    """The saturation gap minus the first-reach gap (content minus function, layers),
    both from the same passage draws (:func:`class_gap` draws passages the same way
    for the same seed, so the two are paired)."""
    d = k1[k1["word_class"].isin(["function", "content"])].reset_index(drop=True)
    first, sat = _gap_stat(d, *MEASURES["first reach"][:2]), _gap_stat(d, *MEASURES["saturation"][:2])
    return stats.bootstrap_ci(np.arange(len(d)), stat=lambda i: sat(i) - first(i), n_boot=n_boot, seed=seed,
                              units=d[_unit(d)].to_numpy())


def rank1(onsets: pd.DataFrame, n_blocks: int, *, compare: bool, n_boot: int, seed: int) -> dict[str, Any]:
    """The k = 1 onsets (``k1``: one row an example, ``censored`` where the onset is
    the output row L, ``sat_censored`` where the saturation is) and their means before
    the output per tag (``by_tag``, with the median over all onsets: those at L are the
    largest, so it is the censoring-aware median while under half are censored) and,
    where the classes can be compared (``compare``), per word class (``by_class``) and
    content minus function (``gap``, :func:`class_gap`). The same on saturation:
    ``by_class_sat`` and ``gap_sat``, and ``gap_change`` (saturation gap minus
    first-reach gap, :func:`gap_change`); these are empty/None for onsets saved
    without a ``saturation`` column. Intervals resample passages; ``censored``
    columns: the share at L with its interval (:func:`depthkit.stats.censored_mean`)."""
    k1 = onsets[onsets["k"] == 1].copy()
    k1["depth_fraction"] = k1["onset"] / n_blocks
    k1["censored"] = k1["onset"] >= n_blocks
    has_sat = "saturation" in k1.columns
    if has_sat:
        k1["sat_censored"] = k1["saturation"] >= n_blocks
    kw = dict(unit=_unit(k1), n_boot=n_boot, seed=seed)
    by_tag = stats.censored_mean(k1, "onset", n_blocks, "tag", **kw)
    by_tag["median"] = by_tag["tag"].map(k1.groupby("tag", observed=True)["onset"].median())
    by_tag["word_class"] = by_tag["tag"].astype(str).map(part_of_speech.word_class)
    by_class = stats.censored_mean(k1, "onset", n_blocks, "word_class", **kw)
    by_class_sat = stats.censored_mean(k1, "saturation", n_blocks, "word_class", **kw) if has_sat else by_class.iloc[:0]
    gap = class_gap(k1, n_boot=n_boot, seed=seed) if compare else None
    gap_sat = class_gap(k1, *MEASURES["saturation"][:2], n_boot=n_boot, seed=seed) if compare and has_sat else None
    change = gap_change(k1, n_boot=n_boot, seed=seed) if compare and has_sat else None
    if not compare:
        by_class, by_class_sat = by_class.iloc[:0], by_class_sat.iloc[:0]  # no class means on this run (chapter 07 then shows none)
    return {"k1": k1, "by_tag": by_tag, "by_class": by_class, "gap": gap,
            "by_class_sat": by_class_sat, "gap_sat": gap_sat, "gap_change": change}


GAP_COLUMNS = [
    "measure", "paper's measure", "what",
    *(f"{c}{s}" for c in ("function", "content") for s in (" mean layer [95 % CI]", ": only at the output")),
    "content − function (layers)", "lo", "hi", "content − function (L)", "lo (L)", "hi (L)", "n function", "n content", "passages",
]


def class_gap_table(r1: Mapping[str, Any], n_blocks: int) -> pd.DataFrame:
    """Function and content words on both depths at k = 1, one row a measure: each
    class's mean layer before the output [95 % CI], its share only at the output, and
    content minus function in layers and as a fraction of depth, each interval over
    passages. Empty where the classes are not compared."""
    rows = []
    for measure, (by_class, gap) in {"first reach": (r1["by_class"], r1["gap"]),
                                     "saturation": (r1.get("by_class_sat"), r1.get("gap_sat"))}.items():
        if gap is None or by_class is None or by_class.empty:
            continue
        c = by_class.set_index(by_class["word_class"].astype(str))
        row = {"measure": measure, "paper's measure": measure == "first reach", "what": MEASURES[measure][2]}
        for cls in ("function", "content"):
            row[f"{cls} mean layer [95 % CI]"] = _with_ci(c.loc[cls]) if cls in c.index else "—"
            row[f"{cls}: only at the output"] = (
                narrate.share(*c.loc[cls, ["censored", "censored_lo", "censored_hi"]], digits=0) if cls in c.index else "—")
        row |= {"content − function (layers)": gap["diff"], "lo": gap["lo"], "hi": gap["hi"],
                "content − function (L)": gap["diff"] / n_blocks, "lo (L)": gap["lo"] / n_blocks, "hi (L)": gap["hi"] / n_blocks,
                "n function": int(gap["n_a"]), "n content": int(gap["n_b"]), "passages": int(gap["n"])}
        rows.append(row)
    return pd.DataFrame(rows, columns=GAP_COLUMNS)


def gaps_text(r1: Mapping[str, Any], n_blocks: int) -> str:
    """The content-minus-function gap on first reach and on saturation, each with its
    interval over passages, how the two differ, and which one the paper's claim is
    about. Both depths count from layer 1; examples at the output are left out of
    each mean (their shares are in :func:`class_gap_table`)."""

    def one(measure: str, by_class: pd.DataFrame, gap: pd.Series) -> str:
        c = by_class.set_index(by_class["word_class"].astype(str))
        means = " and ".join(f"{cls} words {narrate.estimate(*c.loc[cls, ['estimate', 'lo', 'hi']])}" for cls in ("function", "content"))
        diff = narrate.difference(gap["diff"], gap["lo"], gap["hi"], subject="content words", than="function words", **LATER)
        frac = (f", i.e. {gap['diff'] / n_blocks:+.2f} L of the depth ({narrate.interval(gap['lo'] / n_blocks, gap['hi'] / n_blocks, digits=2)})"
                if np.isfinite(gap["lo"]) else "")
        return f"on {measure} ({MEASURES[measure][2]}) the mean layer is {means}: {diff}{frac}"

    def left_out(measure: str, by_class: pd.DataFrame) -> str:
        c = by_class.set_index(by_class["word_class"].astype(str))
        return f"on {measure} " + " and ".join(
            f"{narrate.share(*c.loc[cls, ['censored', 'censored_lo', 'censored_hi']], digits=0)} of {cls}" for cls in ("function", "content"))

    measured = [("first reach", r1["by_class"], r1["gap"])]
    if r1.get("gap_sat") is not None and not r1["by_class_sat"].empty:
        measured.append(("saturation", r1["by_class_sat"], r1["gap_sat"]))
    parts = [one(*m) for m in measured]
    change = r1.get("gap_change")
    text = "At rank 1, " + "; ".join(parts) + "."
    text += (" Examples that hold rank 1 only at the output are left out of each mean: "
             + "; ".join(left_out(m, b) for m, b, _ in measured) + " examples.")
    if change is not None:
        if not np.isfinite(change.estimate):
            text += " How the two gaps differ cannot be measured here."
        elif not np.isfinite(change.lo):
            text += f" The saturation gap differs from the first-reach gap by {change.estimate:+.1f} layers ({narrate.NO_INTERVAL}); no finding is drawn from it."
        elif narrate.excludes_zero(change.lo, change.hi, digits=1):
            word = "smaller" if change.estimate < 0 else "larger"
            text += (f" The content − function gap is {abs(change.estimate):.1f} layers {word} on saturation than on first reach "
                     f"({narrate.interval(change.lo, change.hi, digits=1)}, the same passages drawn for both).")
        else:
            text += (f" The two gaps show no clear difference ({change.estimate:+.1f} layers, "
                     f"{narrate.interval(change.lo, change.hi, digits=1)}).")
    return text + (" The paper's claim is about first reach: its figure plots, per prompt, the earliest layer at which the "
                   "answer's rank is ≤ k, and its headline compares that layer at k = 1.")


def _with_ci(r: pd.Series) -> str:
    if not np.isfinite(r["lo"]):
        return f"{r['estimate']:.1f} (no interval: n < {stats.MIN_N})"
    return f"{r['estimate']:.1f} [{r['lo']:.1f}, {r['hi']:.1f}]"


def rank1_table(r1: Mapping[str, Any], n_blocks: int, source: str) -> pd.DataFrame:
    """Mean rank-1 onset per tag and per class, this run's, under the paper's rows."""

    def rows(t: pd.DataFrame, group: str, median: Any) -> pd.DataFrame:
        return pd.DataFrame({
            "group": t[group].astype(str), "source": source, "mean layer [95 % CI]": t.apply(_with_ci, axis=1) if len(t) else [],
            "median": median, "fraction of depth": (t["estimate"] / n_blocks).map(lambda v: f"{v:.2f}"), "n": t["n"],
        })

    paper = pd.DataFrame({
        "group": list(PAPER_ONSETS), "source": f"paper (reference): main figure, {PAPER_BLOCKS} blocks",
        "mean layer [95 % CI]": [f"≈ {v:.0f}" for v in PAPER_ONSETS.values()], "median": np.nan,
        "fraction of depth": [f"≈ {v / PAPER_BLOCKS:.2f}" for v in PAPER_ONSETS.values()], "n": np.nan,
    })
    return pd.concat([rows(r1["by_tag"], "tag", r1["by_tag"]["median"]), rows(r1["by_class"], "word_class", np.nan), paper], ignore_index=True)


def onset_curves(onsets: pd.DataFrame, n_blocks: int, *, n_boot: int, seed: int) -> pd.DataFrame:
    """Mean onset against k per tag, before the output (onsets at the output row
    censored, their share in ``censored``), passages resampled where known."""
    unit = "passage" if "passage" in onsets.columns else None
    return summaries.onset_curve(onsets, by=["tag"], n_boot=n_boot, seed=seed, censor_at=n_blocks, unit=unit)


def frequency_controls(k1: pd.DataFrame, *, n_boot: int, seed: int) -> dict[str, pd.DataFrame]:
    """The two ways to compare the classes at equal frequency: within matched bins of
    the answer's frequency rank (``matched``: per bin, then the precision-weighted
    average of bins holding at least :data:`MIN_PER_BIN` of each class) and a linear
    fit of onset on log10 rank plus a class offset (``adjusted``). ``cells``: mean
    onset per bin and class, for the chart. Like :func:`class_gap`: onsets before the
    output only (censored ones are not layers), passages resampled."""
    if "censored" in k1.columns:
        k1 = k1[~k1["censored"].astype(bool)]
    unit = _unit(k1)
    cells = stats.bootstrap_ci_by(k1, "onset", ["freq_bin", "word_class"], n_boot=n_boot, seed=seed, unit=unit)
    cells["freq_bin"] = pd.Categorical(cells["freq_bin"], categories=list(k1["freq_bin"].cat.categories), ordered=True)
    matched = stats.stratified_difference(
        k1, "onset", "word_class", "freq_bin", a="function", b="content", n_boot=n_boot, seed=seed, min_per_cell=MIN_PER_BIN,
        unit=unit,
    )
    adjusted = stats.adjusted_difference(
        k1.assign(log10_rank=np.log10(k1["freq_rank"])), "onset", "word_class", "log10_rank",
        a="function", b="content", n_boot=n_boot, seed=seed, unit=unit,
    )
    return {"cells": cells, "matched": matched, "adjusted": adjusted}


def frequency_verdict(matched: pd.DataFrame, adjusted: pd.DataFrame) -> str:
    """What the two frequency controls support together: a direction only where both
    intervals exclude zero on the same side; otherwise each number with its interval
    and no finding. (The matched bins compare like with like but may hold few
    examples; the fit uses every example but extrapolates where the classes do not
    overlap: a claim must survive both.)"""
    pooled, adj = matched.iloc[-1], adjusted.iloc[0]
    bins = matched.iloc[:-1][matched.iloc[:-1]["used"].astype(bool)]
    m_text = (
        f"within the {len(bins)} frequency bin{'s' if len(bins) != 1 else ''} holding at least {MIN_PER_BIN} of each class "
        f"({int(pooled['n_a'])} function and {int(pooled['n_b'])} content examples), content minus function is "
        f"{narrate.estimate(pooled['diff'], pooled['lo'], pooled['hi'], unit='layers')}"
        if len(bins)
        else f"no frequency bin holds {MIN_PER_BIN} examples of each class, so the matched comparison cannot be made"
    )
    a_text = (
        f"a linear fit of onset on log10 frequency rank gives a content-word offset of "
        f"{narrate.estimate(adj['estimate'], adj['lo'], adj['hi'], unit='layers')} "
        f"(each tenfold rarer answer {adj['slope']:+.1f} layers)"
        if np.isfinite(adj["estimate"])
        else "too few examples of one class for the frequency-adjusted fit"
    )
    signs = [np.sign(x) if narrate.excludes_zero(lo, hi, digits=1) else 0 for x, lo, hi in
             ((pooled["diff"], pooled["lo"], pooled["hi"]), (adj["estimate"], adj["lo"], adj["hi"]))]
    if len(bins) and signs[0] != 0 and signs[0] == signs[1]:
        word = "later" if signs[0] > 0 else "earlier"
        return f"At equal frequency content words reach rank 1 {word} than function words, by both controls: {m_text}; {a_text}."
    both_clear = len(bins) and all(np.isfinite(v) for v in (pooled["lo"], adj["lo"])) and signs == [0, 0]
    verdict = (
        "Neither frequency control finds a difference between the classes at equal frequency"
        if both_clear
        else "The frequency controls do not agree on a difference, so this run cannot separate word class from frequency"
    )
    return f"{verdict}: {m_text}; {a_text}."


def summary(
    report: pd.DataFrame, r1: Mapping[str, Any], controls: Mapping[str, pd.DataFrame] | None, *,
    reason: str, n_blocks: int, n_per_tag: int, lens_name: str, weights: str, minutes: float,
) -> str:
    """The chapter's closing Markdown, every number from this run. ``controls`` and
    ``r1["gap"]`` are None where the classes cannot be compared (``reason`` says why)."""
    by_tag = r1["by_tag"].set_index(r1["by_tag"]["tag"].astype(str))
    tags = ", ".join(
        f"{t} {by_tag.loc[t, 'estimate']:.1f} (n = {by_tag.loc[t, 'n_rows']}; "
        f"{narrate.share(*by_tag.loc[t, ['censored', 'censored_lo', 'censored_hi']], digits=0)} of "
        f"{by_tag.loc[t, 'n_rows'] + by_tag.loc[t, 'n_censored']} only at the output, not before)"
        for t in by_tag.index
    )
    paper = "The paper reports ≈ layer {function:.0f} (function) vs ≈ {content:.0f} (content) of {blocks} for its 7-8B models.".format(
        **PAPER_ONSETS, blocks=PAPER_BLOCKS
    )
    if controls is None:
        lines = [f"{reason} {paper}"]
    else:
        lines = [f"{gaps_text(r1, n_blocks)} {paper}", frequency_verdict(controls["matched"], controls["adjusted"])]
    bullets = [f"Mean earliest layer at rank 1 before the output (layers 1 to {n_blocks - 1}; passages resampled): {tags}.", *lines,
               f"These are {weights} weights of a small model; the numbers are this run's alone."]
    return (
        f"{filter_sentence(report)} Up to {n_per_tag} per tag were analysed with the {lens_name} lens.\n\n"
        + "\n".join(f"* {b}" for b in bullets)
        + f"\n\nRun time: {minutes:.1f} min."
    )


def headlines(run) -> pd.DataFrame:
    """Mean rank-1 onset layer of function and content words before the output
    (table ``k1_by_class``; ``n``: the passages behind it), and ``censored``: the
    share of their examples whose onset is the output row L (NaN for runs saved
    before it was counted)."""
    k1 = run["k1_by_class"]
    out = pd.DataFrame(
        {
            "quantity": "rank-1 onset, " + k1["word_class"].astype(str) + " words",
            "value": k1["estimate"].astype(float),
            "lo": k1["lo"].astype(float),
            "hi": k1["hi"].astype(float),
            "n": k1["n"].astype(float) if "n" in k1 else float("nan"),
            "scale": "layer",
            "censored": k1["censored"].astype(float) if "censored" in k1 else float("nan"),
        }
    )
    return out[[*HEADLINE_COLUMNS, "censored"]]
