"""Chapter 03 (multi-token fact recall): the chapter's tables beyond
:mod:`depthkit.analyses.facts`, its generated prose, its headline quantities and the paper's
reference rows."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from depthkit import stats
from depthkit.analyses import facts, summaries
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.stats import narrate

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

# Pythia-6.9B (32 blocks): rank-1 onset of answer tokens 1, 2, 3 (the paper's figure).
PAPER_ONSETS = {1: 27.0, 2: 20.0, 3: 12.0}
PAPER_BLOCKS = 32
PAPER = pd.DataFrame(
    [(f"fact recall rank-1 onset, answer token {t}", "Pythia-6.9B", v / PAPER_BLOCKS, math.nan, math.nan) for t, v in PAPER_ONSETS.items()],
    columns=PAPER_COLUMNS,
)


def model_note(info: Any, lens_name: str, convention: str) -> str:
    return narrate.model_note(info, lens_name, convention, paper="Pythia-6.9B")


def fact_sets(p: Mapping[str, Any]) -> dict[str, pd.DataFrame]:
    """The main dataset and, unless it is TriviaQA already, the TriviaQA questions."""
    sets = {p["dataset"]: facts.fact_prompts(p["dataset"], p["n_examples"], seed=p["seed"])}
    if p["n_trivia"] and p["dataset"] != "trivia_qa":
        sets["trivia_qa"] = facts.trivia_cloze(p["n_trivia"], seed=p["seed"])
    return sets


def set_sizes(sets: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    return pd.concat([f.assign(dataset=k) for k, f in sets.items()]).groupby(["dataset", "category"]).size().rename("prompts").to_frame().T


def fact_table(sets: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """All facts in one frame (aliases dropped: lists do not go to parquet)."""
    return pd.concat([f.assign(dataset=k).drop(columns=[c for c in ("aliases",) if c in f.columns]) for k, f in sets.items()], ignore_index=True)


def all_ranks(model: Model, sets: Mapping[str, pd.DataFrame], lens, p: Mapping[str, Any]) -> pd.DataFrame:
    ranks = pd.concat([
        facts.answer_ranks(model, f, lens=lens, convention=p["convention"], max_tokens=p["max_tokens"]).assign(dataset=k)
        for k, f in sets.items()
    ], ignore_index=True)
    # Items are numbered per dataset; a global key keeps them apart.
    ranks["item"] = ranks.groupby(["dataset", "item"], sort=False).ngroup()
    return ranks


def onsets_of(ranks: pd.DataFrame, k_grid: list[int]) -> pd.DataFrame:
    on = facts.fact_onsets(ranks, k_grid)
    return on.merge(ranks.drop_duplicates("item")[["item", "dataset"]], on="item")


def token_accuracy(ranks: pd.DataFrame) -> pd.DataFrame:
    last = ranks[ranks.layer == ranks.layer.max()]
    return last.groupby(["dataset", "token"]).agg(tokens=("item", "size"), correct=("correct", "mean")).reset_index()


def onset_k1(onsets: pd.DataFrame, n_blocks: int, *, n_boot: int, seed: int) -> pd.DataFrame:
    """Mean rank-1 onset per dataset, answer token and correctness, with ``onset / L``.
    An onset at L, the model's own output, is "not before the output": the mean is
    over the onsets before it, and ``censored`` is the share of reaching tokens at L."""
    k1 = facts.onset_table(onsets, k=1, by=("dataset", "token", "correct"), n_boot=n_boot, seed=seed, censor_at=n_blocks)
    return k1.assign(**{"onset / L": k1["mean_onset"] / n_blocks})


def with_paper(k1: pd.DataFrame) -> pd.DataFrame:
    """The k = 1 table under the paper's rows."""
    paper = pd.DataFrame({"dataset": "paper (reference): Pythia-6.9B", "token": list(PAPER_ONSETS), "correct": True,
                          "mean_onset": list(PAPER_ONSETS.values()), "onset / L": [v / PAPER_BLOCKS for v in PAPER_ONSETS.values()]})
    return pd.concat([paper, k1], ignore_index=True)


def onset_k1_by_length(onsets: pd.DataFrame, n_blocks: int, *, n_boot: int, seed: int) -> pd.DataFrame:
    # As in the paper: correct predictions only; onsets at the output censored as in onset_k1.
    return facts.onset_table(onsets[onsets["correct"]], k=1, by=("dataset", "length_group", "token"), n_boot=n_boot, seed=seed,
                             censor_at=n_blocks)


def onset_curves(onsets: pd.DataFrame, dataset: str, n_blocks: int) -> pd.DataFrame:
    """Mean onset against k for the main dataset, by correctness and (correct
    tokens only) by answer length; ``group`` names the curve. Onsets at the output
    row are censored as in :func:`onset_k1` (``censored``: their share)."""
    sub = onsets[onsets["dataset"] == dataset]
    c = summaries.onset_curve(sub, by=["token", "correct"], censor_at=n_blocks)
    by_len = summaries.onset_curve(sub[sub["correct"]], by=["token", "length_group"], censor_at=n_blocks)
    return pd.concat([
        c.assign(group="correct = " + c["correct"].astype(str)).drop(columns="correct"),
        by_len.assign(group="answer of " + by_len["length_group"].astype(str) + " tokens").drop(columns="length_group"),
    ], ignore_index=True)


def token_difference(
    onsets: pd.DataFrame, dataset: str, a: int, b: int, n_blocks: int | None = None, *, n_boot: int, seed: int
) -> pd.Series:
    """Mean rank-1 onset of answer token ``b`` minus token ``a`` in one dataset,
    paired within each correctly predicted answer that has both tokens at rank 1
    before the output (so one-token answers, which have no later token, do not weigh
    on token 1, every comparison is within one answer and its length, and no onset
    censored at L enters as if it were layer L; ``n_blocks`` None keeps every onset,
    as runs before censoring did). Answers are the resampled unit. Returns ``diff, lo, hi, n``."""
    before = onsets["onset"] < n_blocks if n_blocks is not None else True
    d = onsets[(onsets["k"] == 1) & (onsets["dataset"] == dataset) & onsets["correct"] & onsets["token"].isin([a, b]) & before]
    wide = d.pivot_table(index="item", columns="token", values="onset", aggfunc="first").dropna()
    paired = (wide[b] - wide[a]).to_numpy(dtype=float) if {a, b} <= set(wide.columns) else np.array([])
    ci = stats.bootstrap_ci(paired, n_boot=n_boot, seed=seed)
    return pd.Series({"diff": ci.estimate, "lo": ci.lo, "hi": ci.hi, "n": ci.n})


def _onset_words(r: Any, n_blocks: int) -> str:
    """A mean onset before the output, and the share reached only at the output."""
    if r.n_reached == 0:
        return "never at rank 1"
    censored = getattr(r, "censored", math.nan)
    share = narrate.share(censored, getattr(r, "censored_lo", math.nan), getattr(r, "censored_hi", math.nan), digits=0)
    n_before = r.n_reached - int(getattr(r, "n_censored", 0) or 0)
    before = (f"{narrate.layer(r.mean_onset, r.lo, r.hi, n_blocks=n_blocks)} on average over the {n_before} reaching it before the output"
              if np.isfinite(r.mean_onset) else "none before the output")
    return f"{before}; {share} of {r.n_reached} only at the output, not before" if np.isfinite(censored) else f"{before}, n = {r.n_reached}"


def dataset_summary(k1: pd.DataFrame, onsets: pd.DataFrame, dataset: str, n_blocks: int, *, n_boot: int, seed: int) -> str:
    ok = k1[(k1.dataset == dataset) & (k1.correct)].set_index("token")
    wrong = k1[(k1.dataset == dataset) & (~k1.correct)].set_index("token")
    parts = [f"token {t}: {_onset_words(r, n_blocks)}" for t, r in ok.sort_index().iterrows()]
    diffs = []
    # Token 1 is the paper's reference point: without it there is nothing to compare.
    for t in sorted(i for i in ok.index if i != 1 and 1 in ok.index):
        d = token_difference(onsets, dataset, t, 1, n_blocks, n_boot=n_boot, seed=seed)
        diffs.append(narrate.difference(d["diff"], d["lo"], d["hi"], more="later", less="earlier", subject="token 1 onsets", than=f"token {t} onsets"))
    trend = (" Token 1 against later tokens of the same answer (both before the output): " + "; ".join(diffs) + ".") if diffs else ""
    missed = "; ".join(
        f"token {t}: {r.n_reached} of {r.n_items} ever reach rank 1" + ("" if not np.isfinite(r.mean_onset) else f", at layer {r.mean_onset:.0f} on average before the output")
        for t, r in wrong.sort_index().iterrows()
    )
    return (f"**{dataset}**, correctly predicted tokens — rank-1 onset " + "; ".join(parts) + f".{trend} "
            f"Incorrectly predicted tokens: {missed or 'none'}.")


def _against_paper(lo: float, hi: float, paper: float, *, later_fails: bool) -> str:
    """Where an interval (fraction of depth) lies against the paper's value:
    "reproduced"/"not reproduced" only when ``later_fails`` says which side contradicts
    the paper (an interval entirely above its value), and the interval excludes it."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "no interval, so no comparison is drawn"
    if lo > paper:
        return ("not reproduced: later in the depth than the paper's value, its interval entirely above it" if later_fails
                else "later in the depth than the paper's value, its interval entirely above it")
    if hi < paper:
        return ("earlier in the depth than even the paper's value (its interval entirely below it), so the paper's early "
                "settling is there" if later_fails else "earlier in the depth than the paper's value, its interval entirely below it")
    return "consistent with the paper's value (its interval includes it)"


def _decline_against_paper(lo: float, hi: float, paper: float) -> str:
    """Token 1 minus a later token (fraction of depth) against the paper's decline:
    the direction (interval above zero, the test :mod:`depthkit.verdicts` applies) and
    the size (interval against the paper's value)."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "no interval, so no comparison is drawn"
    # judged at the two decimals the comparison table prints
    if narrate.above(0.0, hi, digits=2):
        return "not reproduced: the later token settles later than token 1, not earlier"
    if not narrate.above(lo, 0.0, digits=2):
        size = "and the interval lies below the paper's decline" if narrate.above(paper, hi, digits=2) else "though the interval also includes the paper's"
        return f"not reproduced: no clear decline, {size}"
    if narrate.above(paper, hi, digits=2):
        return "reproduced in direction only: later tokens settle clearly earlier than token 1, but by less than in the paper"
    if narrate.above(lo, paper, digits=2):
        return "reproduced, and larger than the paper's decline (its interval entirely above it)"
    return "reproduced: a clear decline whose interval includes the paper's"


def paper_comparison(k1: pd.DataFrame, onsets: pd.DataFrame, datasets: list[str], n_blocks: int, *, n_boot: int,
                     seed: int) -> pd.DataFrame:
    """The chapter's headline table: per dataset and answer-token position, the mean
    rank-1 onset of correctly predicted tokens as a fraction of the depth (over the
    tokens reaching rank 1 before the output) against the paper's Pythia-6.9B value,
    and for each later token the paired decline token 1 − token t (within answers)
    against the paper's decline. ``reading``: where the interval lies against the
    paper's value; a later token settling later in the depth than the paper says
    (interval entirely above its value) is "not reproduced"; a decline is
    "reproduced" when its interval lies above zero (in direction only when it lies
    below the paper's decline) and "not reproduced" otherwise."""
    rows = []
    for ds in datasets:
        ok = k1[(k1["dataset"] == ds) & k1["correct"].astype(bool)].set_index("token")
        for t in sorted(i for i in ok.index if i in PAPER_ONSETS):
            r = ok.loc[t]
            paper = PAPER_ONSETS[t] / PAPER_BLOCKS
            lo, hi = r["lo"] / n_blocks, r["hi"] / n_blocks
            n_before = int(r["n_reached"] - (r.get("n_censored", 0) if np.isfinite(r.get("n_censored", np.nan)) else 0))
            rows.append({"dataset": ds, "token": int(t), "quantity": f"token {t} rank-1 onset / L", "value": r["mean_onset"] / n_blocks,
                         "lo": lo, "hi": hi, "n": n_before, "censored": r.get("censored", np.nan), "paper": paper,
                         "reading": _against_paper(lo, hi, paper, later_fails=t > 1)})
            if t > 1 and 1 in ok.index:
                d = token_difference(onsets, ds, t, 1, n_blocks, n_boot=n_boot, seed=seed)
                dp = (PAPER_ONSETS[1] - PAPER_ONSETS[t]) / PAPER_BLOCKS
                dlo, dhi = d["lo"] / n_blocks, d["hi"] / n_blocks
                rows.append({"dataset": ds, "token": int(t), "quantity": f"token 1 − token {t} onset / L (paired)",
                             "value": d["diff"] / n_blocks, "lo": dlo, "hi": dhi, "n": int(d["n"]), "censored": np.nan,
                             "paper": dp, "reading": _decline_against_paper(dlo, dhi, dp)})
    return pd.DataFrame(rows, columns=["dataset", "token", "quantity", "value", "lo", "hi", "n", "censored", "paper", "reading"])


def _bold_outcome(reading: str) -> str:
    head, sep, rest = reading.partition(":")
    return f"**{head}**{sep}{rest}" if sep and "reproduced" in head else reading


def headline_summary(comparison: pd.DataFrame) -> str:
    """The chapter's headline in words: per dataset, each answer-token position's
    onset (fraction of depth) against the paper's, then the paired declines."""
    if comparison.empty:
        return "No correctly predicted answer token reaches rank 1, so there is nothing to compare with the paper."
    out = []
    for ds, g in comparison.groupby("dataset", sort=False):
        lines = []
        for r in g.itertuples():
            value = narrate.estimate(r.value, r.lo, r.hi, digits=2)
            reading = _bold_outcome(r.reading)
            if "paired" in r.quantity:
                gap = narrate.difference(r.value, r.lo, r.hi, more="later", less="earlier", subject="token 1 onsets",
                                         than=f"token {r.token} onsets", digits=2, unit="of the depth")
                lines.append(f"  * within the same answers ({r.n} answers): {gap}; the paper's token 1 − token {r.token} is "
                             f"{r.paper:.2f} of the depth — {reading}.")
            else:
                at_out = f", {r.censored:.0%} of those reaching rank 1 only at the output" if np.isfinite(r.censored) else ""
                if not np.isfinite(r.value):
                    lines.append(f"  * answer token {r.token}: no token reaches rank 1 before the output{at_out}; paper "
                                 f"{r.paper:.2f} — no comparison is drawn.")
                    continue
                lines.append(f"  * answer token {r.token}: rank-1 onset at {value} of the depth ({r.n} tokens before the output"
                             f"{at_out}); paper {r.paper:.2f} — {reading}.")
        out.append(f"* **{ds}**, correctly predicted tokens:\n" + "\n".join(lines))
    return (f"Per dataset and answer-token position, the mean rank-1 onset as a fraction of the depth (ℓ/L) against the paper's "
            f"Pythia-6.9B values ({' / '.join(f'{v:.0f}' for v in PAPER_ONSETS.values())} of {PAPER_BLOCKS}), and the decline "
            "from token 1 to each later token measured within the same answers:\n\n" + "\n".join(out))


POOLED_NOTE = ("Each position's mean is over every correctly predicted answer that has that token, so the positions come "
               "from different sets of answers (token 1's includes one-token answers, which have no later token): the paired "
               "rows compare positions within the same answers, and the table by answer length splits them further. The "
               "details below give the same per-position means in layers, with the incorrectly predicted tokens.")


def details_summary(k1: pd.DataFrame, onsets: pd.DataFrame, datasets: list[str], n_blocks: int, *, n_boot: int, seed: int) -> str:
    """The secondary text: :data:`POOLED_NOTE`, then per dataset the per-position
    means in layers, token 1 against later tokens and the incorrectly predicted tokens."""
    details = "\n\n".join(dataset_summary(k1, onsets, ds, n_blocks, n_boot=n_boot, seed=seed) for ds in datasets)
    return f"{POOLED_NOTE}\n\n{details}"


def summary(k1: pd.DataFrame, onsets: pd.DataFrame, datasets: list[str], n_blocks: int, *, n_boot: int, seed: int) -> str:
    """Headline (per dataset and token position against the paper,
    :func:`paper_comparison`) first, then the details (:func:`details_summary`)."""
    comparison = paper_comparison(k1, onsets, datasets, n_blocks, n_boot=n_boot, seed=seed)
    return headline_summary(comparison) + "\n\n" + details_summary(k1, onsets, datasets, n_blocks, n_boot=n_boot, seed=seed)


def headlines(run) -> pd.DataFrame:
    """Mean rank-1 onset of each correctly predicted answer token (``onset_k1``),
    over the onsets before the output; ``censored``: the share of reaching tokens
    whose onset is the output row L (NaN for runs saved before it was counted). The
    run's main dataset keeps the paper's quantity names; a dataset analysed beside it
    (TriviaQA) is named in the quantity, one row per quantity."""
    k1 = run["onset_k1"]
    k1 = k1[k1["correct"].astype(bool)]
    main = run.params.get("dataset")
    quantity = "fact recall rank-1 onset, answer token " + k1["token"].astype(int).astype(str)
    quantity = quantity.where(k1["dataset"] == main, quantity + " (" + k1["dataset"].astype(str) + ")")
    censored = k1["censored"] if "censored" in k1 else pd.Series(np.nan, index=k1.index)
    n = k1["n_reached"] - (k1["n_censored"] if "n_censored" in k1 else 0)
    out = pd.DataFrame({"quantity": quantity.to_numpy(), "value": k1["mean_onset"].to_numpy(dtype=float),
                        "lo": k1["lo"].to_numpy(dtype=float), "hi": k1["hi"].to_numpy(dtype=float),
                        "n": n.to_numpy(dtype=float), "scale": "layer", "censored": censored.to_numpy(dtype=float)})
    return out[[*HEADLINE_COLUMNS, "censored"]]
