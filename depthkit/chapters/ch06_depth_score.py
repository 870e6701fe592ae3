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

from depthkit import stats
from depthkit.analyses import depth_score, frequency, part_of_speech
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.stats import narrate

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
    """:func:`depthkit.analyses.depth_score.depth_scores` plus the frequency ``bucket`` of the
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
    kept = kept.assign(word_class=kept["pos"].map(part_of_speech.word_class))
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
        elif narrate.excludes_zero(change.lo, change.hi):
            text += (f" The content − function gap is {abs(change.estimate):.2f} L {'smaller' if change.estimate < 0 else 'larger'} on saturation than on "
                     f"first reach ({narrate.CI_LABEL} {change.lo:+.2f} to {change.hi:+.2f}, the same passages drawn for both).")
        else:
            text += f" The two gaps show no clear difference ({change.estimate:+.2f} L, {narrate.CI_LABEL} {change.lo:+.2f} to {change.hi:+.2f})."
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


def dtr_table(scores: pd.DataFrame, rho: float) -> pd.DataFrame:
    """Per passage: deep-thinking ratio and next-token accuracy."""
    dtr = depth_score.deep_thinking_ratio(scores, rho=rho)
    return dtr.merge(scores.groupby("item")["correct"].mean().rename("accuracy").reset_index(), on="item")


def deep_token_accuracy(scores: pd.DataFrame, rho: float, *, n_boot: int, seed: int) -> stats.CI:
    """Share of deep-thinking tokens (d_sat/L ≥ ``rho``, as in
    :func:`depthkit.analyses.depth_score.deep_thinking_ratio`) that are the true next token,
    minus that share among the other tokens; the interval resamples passages."""
    d = scores.assign(deep=scores["d_sat_norm"].to_numpy() >= rho - 1e-12, right=scores["correct"].astype(float))
    per = d.pivot_table(index="item", columns="deep", values="right", aggfunc=["sum", "count"], fill_value=0)
    if True not in per["count"].columns or False not in per["count"].columns:
        return stats.CI(np.nan, np.nan, np.nan, int(d["item"].nunique()))
    sd, cd = per["sum"][True].to_numpy(dtype=float), per["count"][True].to_numpy(dtype=float)
    so, co = per["sum"][False].to_numpy(dtype=float), per["count"][False].to_numpy(dtype=float)
    return _unit_ci(len(per), lambda i: sd[i].sum() / cd[i].sum() - so[i].sum() / co[i].sum(), n_boot=n_boot, seed=seed)


def dtr_correlation(dtr: pd.DataFrame, *, n_boot: int, seed: int) -> stats.CI:
    """Spearman correlation of a passage's DTR with its next-token accuracy, the
    interval from resampling passages."""
    x, y = dtr["dtr"].to_numpy(dtype=float), dtr["accuracy"].to_numpy(dtype=float)
    return _unit_ci(len(dtr), lambda i: pd.Series(x[i]).corr(pd.Series(y[i]), method="spearman"), n_boot=n_boot, seed=seed)


def sign_text(corr: stats.CI, token_gap: stats.CI | None = None) -> str:
    """What the sign of the DTR–accuracy correlation says about the chapter's
    question (does deep thinking go with right predictions, as Chen et al. found on
    reasoning traces?): a direction only when the interval excludes zero; a negative
    one is read as depth tracking difficulty, with the token-level accuracy gap
    (``token_gap``, :func:`deep_token_accuracy`) as the check of that reading."""
    if not np.isfinite(corr.estimate):
        return "The correlation cannot be computed here (every passage has the same DTR or the same accuracy), so its sign says nothing."
    if not np.isfinite(corr.lo):
        return (f"With {corr.n} passages there is no interval ({narrate.NO_INTERVAL}), so no sign is read from "
                f"ρ = {corr.estimate:+.2f}: this run neither supports nor contradicts Chen et al.'s direction.")
    ci = f"{narrate.CI_LABEL} {corr.lo:+.2f} to {corr.hi:+.2f}"
    if not narrate.excludes_zero(corr.lo, corr.hi):
        text = (f"The interval of ρ ({ci}) includes zero: no clear association between how many tokens of a passage settle late "
                f"and how well the passage is predicted, so this run neither supports nor contradicts Chen et al.'s direction.")
    elif corr.estimate < 0:
        text = (f"The correlation is negative and its interval ({ci}) excludes zero: passages with more late-settling tokens are "
                "predicted *less* accurately, the opposite of the direction Chen et al. report. It does not support the hypothesis "
                "that spending more depth makes predictions right; a negative sign is what one expects if depth tracks difficulty "
                "instead: tokens that are hard for the model take more layers to settle and are also more often wrong. "
                "A correlation over passages does not show which way the dependence runs.")
    else:
        text = (f"The correlation is positive and its interval ({ci}) excludes zero: passages with more late-settling tokens are "
                "predicted more accurately, the direction Chen et al. report for reasoning traces. A correlation over passages does "
                "not show that the extra depth causes the accuracy.")
    if token_gap is not None and np.isfinite(token_gap.estimate):
        text += (" Token by token (accuracy of the deep-thinking tokens minus that of the other tokens, passages resampled): "
                 + narrate.difference(
                     token_gap.estimate * 100, token_gap.lo * 100, token_gap.hi * 100, more="more often right",
                     less="less often right", than="the other tokens", subject="deep-thinking tokens", digits=1,
                     unit="percentage points")
                 + ".")
    return text


def dtr_text(dtr: pd.DataFrame, rho: float, *, n_boot: int, seed: int, token_gap: stats.CI | None = None) -> str:
    """Mean DTR over passages and its Spearman correlation with accuracy, each with
    its interval over passages, and what the sign of the correlation means
    (:func:`sign_text`)."""
    mean = stats.bootstrap_ci(dtr["dtr"], n_boot=n_boot, seed=seed)
    corr = dtr_correlation(dtr, n_boot=n_boot, seed=seed)
    return (
        f"Mean deep-thinking ratio: **{narrate.share(*mean[:3])}** of tokens per passage settle only at d_sat/L ≥ {rho} "
        f"(range {dtr['dtr'].min():.1%}–{dtr['dtr'].max():.1%} over {len(dtr)} passages). Spearman correlation between a "
        f"passage's DTR and its next-token accuracy over the {len(dtr)} passages: ρ = {narrate.estimate(*corr[:3], digits=2)}.\n\n"
        + sign_text(corr, token_gap)
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
    (``saving``: :func:`depthkit.analyses.depth_score.held_out_saving`, thresholds chosen on
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
