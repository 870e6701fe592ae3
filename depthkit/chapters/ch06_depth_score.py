"""Chapter 06 (depth scores and early exit): per-token depth tables, group means,
the deep-thinking ratio, the early-exit prose and the headline quantities.

Every interval resamples passages (the ``item`` column), never tokens: the tokens
of one passage share their context and are not independent. A d₁ at row L, the
model's own output, is "not before the output": means of d₁ are over the tokens
reaching rank 1 before it, with the share at L beside them (``censored``).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from depthkit import depth_score, frequency, narrate, pos, stats
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS

# The paper has no early-exit or deep-thinking numbers; its word-class onsets are chapter 04's.
PAPER = pd.DataFrame(columns=PAPER_COLUMNS)

MEASURES = ("d1_norm", "d_sat_norm")
GROUP_COLUMNS = ["estimate", "lo", "hi", "n", "n_rows", "measure"]
POLICIES = ("confidence", "fixed", "oracle (d_sat)", "oracle (d_1)")
# Headline names of each policy's saving (chapter 07 and saved runs use them).
SAVING_LABELS = {"confidence": "confidence policy", "fixed": "fixed exit", "oracle (d_sat)": "oracle (d_sat)", "oracle (d_1)": "oracle (d_1)"}


def model_line(info: Any, lens_name: str, convention: str) -> str:
    """The model note, warning about the logit lens (its confident early echoes of the
    input distort a confidence exit)."""
    warning = (
        " With the logit lens, early layers of small models often echo the input token with high confidence, "
        "which makes a confidence-based exit look far better or worse than it is: prefer the tuned lens here."
        if lens_name == "logit"
        else ""
    )
    return narrate.model_note(info, lens_name, convention) + warning


def scores_with_buckets(traj: Any, freq: pd.DataFrame) -> pd.DataFrame:
    """:func:`depthkit.depth_score.depth_scores` plus the frequency ``bucket`` of the
    model's predicted token."""
    scores = depth_score.depth_scores(traj)
    scores["bucket"] = frequency.bucket_of(frequency.ranks_of(freq, scores["final_id"].to_numpy()))
    return scores


def summary_table(scores: pd.DataFrame, n_blocks: int) -> pd.DataFrame:
    """Mean and median of each normalised depth over tokens: ``[measure, mean, median,
    mean (layers), at the output]``. d₁'s mean is over the tokens before the output;
    its median counts those at the output as the largest (censoring-aware while under
    half are); ``at the output``: d₁'s share at row L."""
    rows = []
    for m in ("d1_norm", "d_sat_norm", "flips_norm"):
        censored = scores[m] >= 1 if m == "d1_norm" else pd.Series(False, index=scores.index)
        mean = scores.loc[~censored, m].mean()
        rows.append({"measure": m, "mean": mean, "median": scores[m].median(), "mean (layers)": mean * n_blocks,
                     "at the output": censored.mean() if m == "d1_norm" else np.nan})
    return pd.DataFrame(rows)


def group_depths(df: pd.DataFrame, group: str, *, n_boot: int, seed: int) -> pd.DataFrame:
    """Mean d₁/L (before the output) and d_sat/L per group over its tokens, the
    interval from resampling passages: ``[group, estimate, lo, hi, n (passages),
    n_rows (tokens), measure]``, and for d₁ the share at the output (``censored``,
    ``censored_lo``, ``censored_hi``, ``n_censored``)."""
    if df.empty:
        return pd.DataFrame(columns=[group, *GROUP_COLUMNS])
    d1 = stats.censored_mean(df, "d1_norm", 1.0, group, unit="item", n_boot=n_boot, seed=seed).assign(measure="d1_norm")
    d_sat = stats.unit_mean(df, "d_sat_norm", "item", group, n_boot=n_boot, seed=seed).assign(measure="d_sat_norm")
    return pd.concat([d1, d_sat], ignore_index=True)


def pos_tables(
    scores: pd.DataFrame, tags: pd.DataFrame, *, min_group: int, n_boot: int, seed: int
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``(tagged, kept, pos_summary, class_summary)``: scores joined to the true next
    word's tag; the correctly predicted first pieces of words in tags with at least
    ``min_group`` tokens (as in the paper's part-of-speech analysis); their depths by
    tag and by word class (function / content; "other" left out)."""
    tagged = scores.merge(tags, on=["item", "position"], how="left")
    kept = tagged[tagged["correct"] & tagged["first_piece"]]
    counts = kept["pos"].value_counts()
    kept = kept[kept["pos"].isin(counts[counts >= min_group].index)]
    kept = kept.assign(word_class=kept["pos"].map(pos.word_class))
    pos_summary = group_depths(kept, "pos", n_boot=n_boot, seed=seed)
    class_summary = group_depths(kept[kept["word_class"] != "other"], "word_class", n_boot=n_boot, seed=seed)
    return tagged, kept, pos_summary, class_summary


def _unit_ci(n_units: int, stat: Callable[[np.ndarray], float], *, n_boot: int, seed: int) -> stats.CI:
    """:func:`depthkit.stats.bootstrap_ci` of a statistic of whole units: the resampled
    values are unit indices, so ``stat`` sees which passages were drawn."""

    def of_indices(idx: np.ndarray) -> float:
        # A resample may lack a class or hold one constant value: NaN, not a warning.
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(stat(np.asarray(idx, dtype=int)))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # every resample NaN (e.g. a constant DTR): no interval
        return stats.bootstrap_ci(np.arange(n_units), stat=of_indices, n_boot=n_boot, seed=seed)


def class_difference(kept: pd.DataFrame, measure: str = "d1_norm", *, n_boot: int, seed: int) -> stats.CI:
    """Mean ``measure`` of content minus function words, the interval from resampling
    passages (both classes of a passage go in or out together); a d₁ at the output
    is censored, not a value, and left out."""
    d = kept[kept["word_class"].isin(["function", "content"]) & ((kept[measure] < 1) if measure == "d1_norm" else True)]
    if d.empty or d["word_class"].nunique() < 2:
        return stats.CI(np.nan, np.nan, np.nan, 0)
    agg = d.pivot_table(index="item", columns="word_class", values=measure, aggfunc=["sum", "count"], fill_value=0)
    s, c = agg["sum"], agg["count"]

    def diff(idx: np.ndarray) -> float:
        return s["content"].to_numpy()[idx].sum() / c["content"].to_numpy()[idx].sum() - (
            s["function"].to_numpy()[idx].sum() / c["function"].to_numpy()[idx].sum()
        )

    return _unit_ci(len(agg), diff, n_boot=n_boot, seed=seed)


def _est(summary: pd.DataFrame, group: str, measure: str, key: str) -> str:
    r = summary[(summary["measure"] == measure) & (summary[group].astype(str) == key)]
    if r.empty:
        return "—"
    r = r.iloc[0]
    text = narrate.estimate(r["estimate"], r["lo"], r["hi"], digits=2)
    if measure != "d1_norm" or "censored" not in r or not np.isfinite(r["censored"]):
        return text
    return f"{text} before the output ({narrate.share(r['censored'], r['censored_lo'], r['censored_hi'], digits=0)} only at the output, not before)"


def groups_text(bucket_summary: pd.DataFrame, class_summary: pd.DataFrame, gap: stats.CI, scores: pd.DataFrame) -> str:
    """Markdown bullets on depth by frequency bucket and word class."""
    top_b, rest_b = frequency.BUCKETS[0], frequency.BUCKETS[-1]
    b = lambda m, k: _est(bucket_summary, "bucket", m, k)  # noqa: E731
    lines = [
        f"* Tokens predicted from the {top_b} bucket reach rank 1 at d₁/L = {b('d1_norm', top_b)} on average and settle at "
        f"d_sat/L = {b('d_sat_norm', top_b)}; tokens from the '{rest_b}' bucket at {b('d1_norm', rest_b)} and "
        f"{b('d_sat_norm', rest_b)}."
    ]
    classes = set(class_summary["word_class"]) if len(class_summary) else set()
    if {"function", "content"} <= classes:
        lines.append(
            f"* Correctly predicted function words (DET, ADP, PUNCT) reach rank 1 at d₁/L = "
            f"{_est(class_summary, 'word_class', 'd1_norm', 'function')}, content words (NOUN, VERB, ADJ) at "
            f"{_est(class_summary, 'word_class', 'd1_norm', 'content')}: "
            + narrate.difference(gap.estimate, gap.lo, gap.hi, more="later", less="earlier", than="function words",
                                 subject="content words", digits=2, unit="L")
            + ". The paper's main figure has ≈ 5 and ≈ 20 of 32 layers (0.16 and 0.62)."
        )
    else:
        lines.append("* Too few correctly predicted function or content words to compare the two classes; raise n_texts.")
    lines.append(f"* {scores['correct'].mean():.1%} of the {len(scores):,} predictions are the true next token.")
    return "\n".join(lines)


def dtr_table(scores: pd.DataFrame, rho: float) -> pd.DataFrame:
    """Per passage: deep-thinking ratio and next-token accuracy."""
    dtr = depth_score.deep_thinking_ratio(scores, rho=rho)
    return dtr.merge(scores.groupby("item")["correct"].mean().rename("accuracy").reset_index(), on="item")


def dtr_text(dtr: pd.DataFrame, rho: float, *, n_boot: int, seed: int) -> str:
    """Mean DTR over passages and its Spearman correlation with accuracy, each with
    its interval over passages."""
    mean = stats.bootstrap_ci(dtr["dtr"], n_boot=n_boot, seed=seed)
    x, y = dtr["dtr"].to_numpy(dtype=float), dtr["accuracy"].to_numpy(dtype=float)
    corr = _unit_ci(len(dtr), lambda i: pd.Series(x[i]).corr(pd.Series(y[i]), method="spearman"), n_boot=n_boot, seed=seed)
    return (
        f"Mean deep-thinking ratio: **{narrate.share(*mean[:3])}** of tokens per passage settle only at d_sat/L ≥ {rho} "
        f"(range {dtr['dtr'].min():.1%}–{dtr['dtr'].max():.1%} over {len(dtr)} passages). Spearman correlation between a "
        f"passage's DTR and its next-token accuracy over the {len(dtr)} passages: {narrate.estimate(*corr[:3], digits=2)}."
    )


def _exit_layer(layer: float, n_blocks: int) -> str:
    # An exit at row L is the full model: "no exit before the output", never "layer L of L".
    if np.isnan(layer):
        return "no exit layer"
    return "no exit before the output" if layer >= n_blocks else f"layer {layer:.0f} of {n_blocks}"


def _pct(v: float) -> str:
    return "not reached" if np.isnan(v) else f"{v:.0%}"


def exit_text(
    saving: pd.DataFrame, sweep: pd.DataFrame, *, target: float, info: Any, block_params: int,
    n_select: int | None = None, n_report: int | None = None,
) -> str:
    """The Markdown summary of the early-exit operating points at ``target`` agreement
    (``saving``: :func:`depthkit.depth_score.held_out_saving`, thresholds chosen on
    ``n_select`` passages and measured on ``n_report`` others; no interval)."""
    s = saving.set_index("policy")
    conf, fixed, osat, o1 = (s.loc[k] for k in POLICIES)
    readout = info.d_model * info.d_vocab
    if np.isnan(conf["saving"]):
        tau_max = sweep.loc[sweep["policy"] == "confidence", "param"].max()
        conf_line = (
            f"the **confidence policy** never reaches this agreement at any τ of the sweep (up to {tau_max:.4g}): "
            "a dynamic-depth model driven by this lens's confidence saves nothing at this level"
        )
    else:
        conf_line = (
            f"the **confidence policy** (τ = {conf['param']:.4g}) runs {conf['frac_layers']:.0%} of the blocks on average "
            f"and agrees with the full model on {_pct(conf.get('agreement', np.nan))} of tokens: a dynamic-depth model "
            f"could save **{conf['saving']:.0%}** of the block compute"
        )
    split = (
        f"τ and the exit layer are chosen on {n_select} passages to reach {target:.0%} agreement there; the figures below "
        f"are measured on the other {n_report}, so they may fall short of {target:.0%}."
        if n_select and n_report else f"At {target:.0%} agreement with the full model:"
    )
    return f'''
{split}

* {conf_line}
* a **fixed exit layer** saves {_pct(fixed['saving'])} ({_exit_layer(fixed['param'], info.n_blocks)}, agreement {_pct(fixed.get('agreement', np.nan))});
* the oracles save {_pct(osat['saving'])} (exit at d_sat) and {_pct(o1['saving'])} (exit at d₁): what a perfect exit rule could reach.

The saving counts transformer blocks only. Testing the confidence needs a lens read-out per layer: one unembedding has
{readout / 1e6:.1f} M weights against {block_params / 1e6:.1f} M in a block of {info.name} (ratio {readout / block_params:.1f}), so with
this vocabulary a per-layer check costs {'more' if readout > block_params else 'less'} than the block it might save. Agreement is measured on
teacher-forced text, where every earlier position ran all blocks; a real per-token exit would also have to supply the
deeper keys and values that later tokens attend to.
'''


def verify_taus(saving: pd.DataFrame, taus: list[float]) -> list[float]:
    """The thresholds to check with truncated passes: ``taus`` and the one reaching the target."""
    conf = saving.set_index("policy").loc["confidence", "param"]
    return sorted({float(t) for t in taus} | ({float(conf)} if not np.isnan(conf) else set()))


def first_passages(traj: Any, n: int) -> Any:
    """The trajectory restricted to passages ``0..n-1``."""
    return _passages(traj, lambda item: item < n)


def split_passages(traj: Any) -> tuple[Any, Any]:
    """The passages split in two halves (the passages are in random order already):
    early-exit thresholds are chosen on the first and measured on the second."""
    half = max(1, int(traj.steps["item"].nunique()) // 2)
    return first_passages(traj, half), _passages(traj, lambda item: item >= half)


def _passages(traj: Any, keep: Callable[[pd.Series], pd.Series]) -> Any:
    sub = lambda df: df[keep(df["item"])].reset_index(drop=True)  # noqa: E731
    return dataclasses.replace(traj, steps=sub(traj.steps), topk=sub(traj.topk), targets=sub(traj.targets))


def verify_text(verify: pd.DataFrame, n_passages: int, seconds: float) -> str:
    return (
        f"On {int(verify['n_tokens'].iloc[0]):,} tokens of {n_passages} passage{'s' if n_passages != 1 else ''}, at every checked τ the truncated passes give "
        f"the same token as the simulation for at least {verify['same_as_simulated'].min():.2%} of the tokens ({seconds:.0f} s)."
    )


def headline_table(
    scores: pd.DataFrame, dtr: pd.DataFrame, saving: pd.DataFrame, target: float, *, n_boot: int, seed: int
) -> pd.DataFrame:
    """The chapter's headline numbers: ``[quantity, value, lo, hi, n, censored]``;
    means over tokens with intervals over passages (d₁ over the tokens before the
    output, ``censored`` its share at the output), savings as operating points (no
    interval)."""
    d1 = stats.censored_mean(scores, "d1_norm", 1.0, unit="item", n_boot=n_boot, seed=seed).iloc[0]
    rows = [("mean onset depth d1/L", d1["estimate"], d1["lo"], d1["hi"], d1["n"], d1["censored"])]
    for name, col in (("mean saturation depth d_sat/L", "d_sat_norm"), ("mean flips / L", "flips_norm")):
        r = stats.unit_mean(scores, col, "item", n_boot=n_boot, seed=seed).iloc[0]
        rows.append((name, r["estimate"], r["lo"], r["hi"], r["n"], np.nan))
    rows.append(("mean deep-thinking ratio", *stats.bootstrap_ci(dtr["dtr"], n_boot=n_boot, seed=seed), np.nan))
    s = saving.set_index("policy")["saving"]
    for policy, label in SAVING_LABELS.items():
        rows.append((f"block saving at {target:.0%} agreement, {label}", s[policy], np.nan, np.nan, scores["item"].nunique(), np.nan))
    return pd.DataFrame(rows, columns=["quantity", "value", "lo", "hi", "n", "censored"]).astype({"n": "float64"})


def headlines(run: Any) -> pd.DataFrame:
    """The saved ``headline`` table: depths already divided by L, shares as shares;
    ``censored``: d₁'s share of tokens at the output (NaN elsewhere and for runs saved
    before it was counted)."""
    h = run["headline"]
    depth = h["quantity"].str.startswith(("mean onset", "mean saturation", "mean flips"))
    out = pd.DataFrame(
        {
            "quantity": h["quantity"].astype(str),
            "value": h["value"].astype(float),
            "lo": h["lo"].astype(float) if "lo" in h else np.nan,
            "hi": h["hi"].astype(float) if "hi" in h else np.nan,
            "n": h["n"].astype(float) if "n" in h else np.nan,
            # d1/L etc. are fractions of the depth already: never divided by L again.
            "scale": np.where(depth, "other", "share"),
            "censored": h["censored"].astype(float) if "censored" in h else np.nan,
        }
    )
    return out[[*HEADLINE_COLUMNS, "censored"]].reset_index(drop=True)
