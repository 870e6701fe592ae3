"""Chapter 04 (part of speech and depth): the onset tables beyond :mod:`depthkit.pos`
and :mod:`depthkit.pos_filter`, the two frequency controls, the generated prose,
the headline quantities and the paper's reference rows.

The unit of every interval is a passage: up to one example per tag comes from one
passage, so the examples of a word class share passages and are resampled with them
(examples loaded from files name no passage and are each their own unit; the
frequency controls still resample examples). Onsets count depth from layer 1
(:data:`depthkit.metrics.FIRST_DEPTH_LAYER`): layer 0 is the token embedding read
through the lens. An onset at L, the model's own output, is "not before the output":
means are over the onsets before it, and the share at L is reported beside them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from depthkit import metrics, narrate, pos, stats
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.frequency import ranks_of
from depthkit.pos_filter import filter_sentence

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


def onsets_of(traj: Any, kept: pd.DataFrame, freq: pd.DataFrame, ks: Sequence[int], tags: Sequence[str]) -> pd.DataFrame:
    """Per example and k, the earliest layer (from layer 1) at which the answer's rank
    is ≤ k, with the example's tag, word class, answer, the end of its prompt and the
    corpus frequency rank (and its bin) of the answer's first token. ``traj``: trajectories of ``kept``'s
    prompts with the target ``answer``."""
    meta = kept[["tag", "word_class", "answer"]].assign(
        item=np.arange(len(kept)), freq_rank=ranks_of(freq, kept["answer_id"].to_numpy()),
        prompt_end="…" + kept["prompt"].str[-40:],
        passage=kept["passage_id"].to_numpy() if "passage_id" in kept else np.arange(len(kept)),
    )
    meta["freq_bin"] = metrics.rank_bins(meta["freq_rank"])
    onsets = metrics.onset_layers(traj.target("answer"), ks, first_layer=metrics.FIRST_DEPTH_LAYER).merge(meta, on="item")
    order = [t for t in tags if t in set(kept["tag"])]
    onsets["tag"] = pd.Categorical(onsets["tag"], categories=order, ordered=True)
    return onsets


def _unit(k1: pd.DataFrame) -> str:
    return "passage" if "passage" in k1.columns else "item"


def class_gap(k1: pd.DataFrame, *, n_boot: int, seed: int) -> pd.Series:
    """Mean onset of content minus function words over the onsets before the output,
    passages resampled (both classes of a passage go in or out together): a row like
    :func:`depthkit.stats.stratified_difference`'s pooled one."""
    d = k1[k1["word_class"].isin(["function", "content"]) & ~k1["censored"]]
    v, content = d["onset"].to_numpy(dtype=float), (d["word_class"] == "content").to_numpy()

    def gap(i: np.ndarray) -> float:
        i = i.astype(int)
        c = content[i]
        return v[i][c].mean() - v[i][~c].mean() if c.any() and not c.all() else np.nan

    ci = stats.bootstrap_ci(np.arange(len(d)), stat=gap, n_boot=n_boot, seed=seed, units=d[_unit(d)].to_numpy())
    return pd.Series({"stratum": "all", "n_a": int((~content).sum()), "n_b": int(content.sum()), "mean_a": v[~content].mean(),
                      "mean_b": v[content].mean(), "used": True, "diff": ci.estimate, "lo": ci.lo, "hi": ci.hi, "n": ci.n})


def rank1(onsets: pd.DataFrame, n_blocks: int, *, compare: bool, n_boot: int, seed: int) -> dict[str, Any]:
    """The k = 1 onsets (``k1``: one row an example, ``censored`` where the onset is
    the output row L) and their means before the output per tag (``by_tag``, with the
    median over all onsets: those at L are the largest, so it is the censoring-aware
    median while under half are censored) and, where the classes can be compared
    (``compare``), per word class (``by_class``) and content minus function (``gap``,
    :func:`class_gap`). Intervals resample passages; ``censored`` columns: the share
    at L with its interval (:func:`depthkit.stats.censored_mean`)."""
    k1 = onsets[onsets["k"] == 1].copy()
    k1["depth_fraction"] = k1["onset"] / n_blocks
    k1["censored"] = k1["onset"] >= n_blocks
    kw = dict(unit=_unit(k1), n_boot=n_boot, seed=seed)
    by_tag = stats.censored_mean(k1, "onset", n_blocks, "tag", **kw)
    by_tag["median"] = by_tag["tag"].map(k1.groupby("tag", observed=True)["onset"].median())
    by_tag["word_class"] = by_tag["tag"].astype(str).map(pos.word_class)
    by_class = stats.censored_mean(k1, "onset", n_blocks, "word_class", **kw)
    gap = class_gap(k1, n_boot=n_boot, seed=seed) if compare else None
    if not compare:
        by_class = by_class.iloc[:0]  # no class means on this run (chapter 07 then shows none)
    return {"k1": k1, "by_tag": by_tag, "by_class": by_class, "gap": gap}


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


def frequency_controls(k1: pd.DataFrame, *, n_boot: int, seed: int) -> dict[str, pd.DataFrame]:
    """The two ways to compare the classes at equal frequency: within matched bins of
    the answer's frequency rank (``matched``: per bin, then the precision-weighted
    average of bins holding at least :data:`MIN_PER_BIN` of each class) and a linear
    fit of onset on log10 rank plus a class offset (``adjusted``). ``cells``: mean
    onset per bin and class, for the chart."""
    cells = stats.bootstrap_ci_by(k1, "onset", ["freq_bin", "word_class"], n_boot=n_boot, seed=seed)
    cells["freq_bin"] = pd.Categorical(cells["freq_bin"], categories=list(k1["freq_bin"].cat.categories), ordered=True)
    matched = stats.stratified_difference(
        k1, "onset", "word_class", "freq_bin", a="function", b="content", n_boot=n_boot, seed=seed, min_per_cell=MIN_PER_BIN
    )
    adjusted = stats.adjusted_difference(
        k1.assign(log10_rank=np.log10(k1["freq_rank"])), "onset", "word_class", "log10_rank",
        a="function", b="content", n_boot=n_boot, seed=seed,
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
    signs = [np.sign(x) if narrate.excludes_zero(lo, hi) else 0 for x, lo, hi in
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
        fc, gap = r1["by_class"].set_index("word_class"), r1["gap"]
        lines = [
            f"Function words {narrate.estimate(*fc.loc['function', ['estimate', 'lo', 'hi']])} vs content words "
            f"{narrate.estimate(*fc.loc['content', ['estimate', 'lo', 'hi']])}: at rank 1, "
            f"{narrate.difference(gap['diff'], gap['lo'], gap['hi'], subject='content words', than='function words', **LATER)}. {paper}",
            frequency_verdict(controls["matched"], controls["adjusted"]),
        ]
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
