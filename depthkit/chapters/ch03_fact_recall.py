"""Chapter 03 (multi-token fact recall): the chapter's tables beyond
:mod:`depthkit.facts`, its generated prose, its headline quantities and the paper's
reference rows."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from depthkit import facts, metrics, narrate, stats
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS

if TYPE_CHECKING:
    from depthkit.handles import Model

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


def onset_curves(onsets: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Mean onset against k for the main dataset, by correctness and (correct
    tokens only) by answer length; ``group`` names the curve."""
    sub = onsets[onsets["dataset"] == dataset]
    c = metrics.onset_curve(sub, by=["token", "correct"])
    by_len = metrics.onset_curve(sub[sub["correct"]], by=["token", "length_group"])
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


def summary(k1: pd.DataFrame, onsets: pd.DataFrame, datasets: list[str], n_blocks: int, *, n_boot: int, seed: int) -> str:
    paper = " / ".join(f"{v:.0f}" for v in PAPER_ONSETS.values())
    frac = " / ".join(f"{v / PAPER_BLOCKS:.2f}" for v in PAPER_ONSETS.values())
    return ("\n\n".join(dataset_summary(k1, onsets, ds, n_blocks, n_boot=n_boot, seed=seed) for ds in datasets)
            + f"\n\nFor comparison, the paper's Pythia-6.9B onsets {paper} of {PAPER_BLOCKS} are {frac} of the depth.")


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
