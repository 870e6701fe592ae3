"""Chapter 06 (depth scores and early exit): per-token depth tables, group means,
the deep-thinking ratio, the early-exit prose and the headline quantities.

Every interval resamples passages (the ``item`` column), never tokens: the tokens
of one passage share their context and are not independent. A d₁ at row L, the
model's own output, is "not before the output": means of d₁ are over the tokens
reaching rank 1 before it, with the share at L beside them (``censored``).

The notebook reads everything as ``ch.X`` from this module. The word-class
comparison, the deep-thinking ratio, the early exit and the passage resampling live
in the ``ch06_*`` modules beside it and are re-exported here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from depthkit import stats
from depthkit.analyses import depth_score, frequency, part_of_speech
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.chapters.ch06_classes import DEPTHS as DEPTHS
from depthkit.chapters.ch06_classes import _class_sums as _class_sums
from depthkit.chapters.ch06_classes import _difference_stat as _difference_stat
from depthkit.chapters.ch06_classes import _est as _est
from depthkit.chapters.ch06_classes import _gap_sentence as _gap_sentence
from depthkit.chapters.ch06_classes import class_difference as class_difference
from depthkit.chapters.ch06_classes import class_gap_table as class_gap_table
from depthkit.chapters.ch06_classes import class_gaps as class_gaps
from depthkit.chapters.ch06_classes import gaps_text as gaps_text
from depthkit.chapters.ch06_classes import groups_text as groups_text
from depthkit.chapters.ch06_deep_thinking import deep_token_accuracy as deep_token_accuracy
from depthkit.chapters.ch06_deep_thinking import dtr_correlation as dtr_correlation
from depthkit.chapters.ch06_deep_thinking import dtr_table as dtr_table
from depthkit.chapters.ch06_deep_thinking import dtr_text as dtr_text
from depthkit.chapters.ch06_deep_thinking import sign_text as sign_text
from depthkit.chapters.ch06_early_exit import POLICIES as POLICIES
from depthkit.chapters.ch06_early_exit import SAVING_LABELS
from depthkit.chapters.ch06_early_exit import _exit_layer as _exit_layer
from depthkit.chapters.ch06_early_exit import _pct as _pct
from depthkit.chapters.ch06_early_exit import block_parameters as block_parameters
from depthkit.chapters.ch06_early_exit import exit_text as exit_text
from depthkit.chapters.ch06_early_exit import verify_taus as verify_taus
from depthkit.chapters.ch06_early_exit import verify_text as verify_text
from depthkit.chapters.ch06_passages import _passages as _passages
from depthkit.chapters.ch06_passages import _unit_ci as _unit_ci
from depthkit.chapters.ch06_passages import first_passages as first_passages
from depthkit.chapters.ch06_passages import split_passages as split_passages
from depthkit.stats import narrate

# The paper has no early-exit or deep-thinking numbers; its word-class onsets are chapter 04's.
PAPER = pd.DataFrame(columns=PAPER_COLUMNS)

MEASURES = ("d1_norm", "d_sat_norm")
GROUP_COLUMNS = ["estimate", "lo", "hi", "n", "n_rows", "measure"]


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
