"""Chapter 06's deep-thinking ratio (the share of a passage's tokens that settle only
late): its relation to next-token accuracy, per passage and token by token, and what
the sign of that relation says."""

from __future__ import annotations

import numpy as np
import pandas as pd

from depthkit import stats
from depthkit.analyses import depth_score
from depthkit.chapters.ch06_passages import _unit_ci
from depthkit.stats import narrate


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
    ci = narrate.interval(corr.lo, corr.hi, digits=2)
    if not narrate.excludes_zero(corr.lo, corr.hi, digits=2):
        on = "includes zero" if corr.lo <= 0 <= corr.hi else "reaches zero at the precision shown"
        text = (f"The interval of ρ ({ci}) {on}: no clear association between how many tokens of a passage settle late "
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
