"""Multi-token fact recall (the paper's analysis of multi-token answers).

Cloze prompts whose answers often span several tokens. For answer tokens 1, 2, 3
the answer is *teacher-forced by token ids*: the ids of the answer as it follows
the prompt (:func:`depthkit.lens.trajectories.answer_token_ids`) are appended one by one,
never re-encoded from decoded text, and the prediction of token j is read at the
position just before it. Per token, the earliest layer at which the answer token's
rank is ≤ k (:func:`depthkit.analyses.summaries.onset_layers`), grouped by answer length and
by whether the model's own prediction of that token is right.

Data: the project's curated set (``depthkit/data/files/facts.jsonl``: capitals,
languages, currencies, chemical symbols, authors, founders, birthplaces, painters,
composers, continents, inventors; phrased by us), TriviaQA as ``Q: ... A:``
prompts (embedded), or a user's file of ``{"prompt", "answer"}`` records.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from depthkit import data as dkdata
from depthkit.lens.base import DEFAULT_LENS, Lens
from depthkit.lens.registry import get_lens
from depthkit.lens.trajectories import Item, answer_token_ids, encode, trajectories

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

FACTS_PATH = Path(__file__).resolve().parents[1] / "data" / "files" / "facts.jsonl"
LENGTH_GROUPS = ("1", "2", "3", "4+")
# Demonstrations for TriviaQA prompts, written by us, so that a base model answers in
# the "Q: / A:" format.
TRIVIA_DEMOS = (
    ("Which city is the capital of Italy?", "Rome"),
    ("Who wrote the novel Moby-Dick?", "Herman Melville"),
)


def load_facts(categories: str | Sequence[str] | None = None, path: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """The curated cloze facts: DataFrame[prompt, answer, category], optionally only
    some ``categories``. The prompt stops where the answer comes next; the answer
    follows after one space."""
    frame = dkdata.load_records(path or FACTS_PATH, required=("prompt", "answer", "category"))
    frame = frame[["prompt", "answer", "category"]].reset_index(drop=True)
    if categories is not None:
        chosen = [categories] if isinstance(categories, str) else list(categories)
        known = sorted(frame["category"].unique())
        unknown = [c for c in chosen if c not in known]
        if unknown:
            raise dkdata.DataError(f"Unknown fact categories {unknown}; the curated set has {known}.")
        frame = frame[frame["category"].isin(chosen)].reset_index(drop=True)
    return frame


def trivia_cloze(n: int | None = None, *, shots: int = 2, seed: int = 0) -> pd.DataFrame:
    """TriviaQA questions as cloze prompts ``Q: <question>\\nA:`` after ``shots``
    fixed demonstrations (:data:`TRIVIA_DEMOS`). ``n`` questions drawn with ``seed``
    (all if None). Returns DataFrame[prompt, answer, aliases, category]."""
    if not 0 <= int(shots) <= len(TRIVIA_DEMOS):
        raise ValueError(f"shots must lie in 0..{len(TRIVIA_DEMOS)}, got {shots}.")
    tq = dkdata.trivia_qa()
    if n is not None:
        if int(n) != n or n < 1:
            raise ValueError(f"n must be a positive integer or None, got {n!r}.")
        take = np.sort(np.random.default_rng(seed).choice(len(tq), size=min(int(n), len(tq)), replace=False))
        tq = tq.iloc[take]
    prefix = "".join(f"Q: {q}\nA: {a}\n\n" for q, a in TRIVIA_DEMOS[: int(shots)])
    return pd.DataFrame(
        {
            "prompt": [f"{prefix}Q: {q.strip()}\nA:" for q in tq["question"]],
            "answer": [str(a).strip() for a in tq["answer"]],
            "aliases": list(tq["aliases"]),
            "category": "trivia_qa",
        }
    )


def fact_prompts(dataset: str = "curated", n: int | None = None, *, seed: int = 0) -> pd.DataFrame:
    """Resolve a chapter's ``dataset`` parameter: ``"curated"`` (the project's set),
    ``"trivia_qa"`` (embedded), or the path of a JSON/JSONL file of
    ``{"prompt", "answer"}`` records (``category`` optional). ``n`` rows drawn with
    ``seed`` (all if None)."""
    if dataset == "curated":
        frame = load_facts()
    elif dataset == "trivia_qa":
        return trivia_cloze(n, seed=seed)
    elif Path(os.fspath(dataset)).expanduser().is_file():
        frame = dkdata.load_records(dataset, required=("prompt", "answer"))
        if "category" not in frame.columns:
            frame["category"] = "file"
        frame = frame[["prompt", "answer", "category"]]
    else:
        raise dkdata.DataError(
            f"dataset {dataset!r} is neither 'curated', 'trivia_qa' nor an existing file; give one of these, "
            "or the path of a JSON/JSONL file of {\"prompt\", \"answer\"} records."
        )
    if n is not None and n < len(frame):
        take = np.sort(np.random.default_rng(seed).choice(len(frame), size=int(n), replace=False))
        frame = frame.iloc[take]
    return frame.reset_index(drop=True)


def continuation(prompt: str, answer: str) -> str:
    """The answer as text that follows the prompt: one space in between unless either
    side already has it."""
    return answer if (answer[:1].isspace() or prompt[-1:].isspace()) else " " + answer


def length_group(n_tokens: int) -> str:
    return str(n_tokens) if n_tokens < 4 else "4+"


def fact_items(model: Model, facts: pd.DataFrame, *, max_tokens: int = 3) -> tuple[list[Item], pd.DataFrame]:
    """Teacher-forced items: prompt ids followed by the first answer ids, with one
    read position per answer token (up to ``max_tokens``) whose target is that token.

    Returns the items and a frame ``[item, position, token, answer_len, length_group,
    category]`` (``token`` 1-based).
    """
    if int(max_tokens) != max_tokens or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}.")
    items, rows = [], []
    for i, (prompt, answer) in enumerate(zip(facts["prompt"], facts["answer"])):
        if not isinstance(answer, str) or not answer.strip():
            raise dkdata.DataError(f"Fact {i}: the answer {answer!r} is empty; give a non-empty answer.")
        ans = answer_token_ids(model, prompt, continuation(prompt, answer))
        p = encode(model, prompt)
        m = min(len(ans), int(max_tokens))
        positions = [len(p) - 1 + j for j in range(m)]
        items.append(Item(p + ans[: m - 1], positions, {"answer": ans[:m]}))
        cat = facts["category"].iloc[i] if "category" in facts.columns else ""
        for j, pos in enumerate(positions):
            rows.append({"item": i, "position": pos, "token": j + 1, "answer_len": len(ans), "length_group": length_group(len(ans)), "category": cat})
    return items, pd.DataFrame(rows)


def answer_ranks(
    model: Model,
    facts: pd.DataFrame,
    *,
    lens: str | Lens = DEFAULT_LENS,
    convention: str = "canonical",
    max_tokens: int = 3,
    batch_size: int = 16,
    progress: bool = True,
    **lens_kwargs,
) -> pd.DataFrame:
    """Rank and probability of each teacher-forced answer token at every layer.

    Returns DataFrame[item, position, token, answer_len, length_group, category,
    layer, token_id, rank, prob, correct]; ``correct``: the model's own top-1 at
    that position is the answer token.
    """
    items, meta = fact_items(model, facts, max_tokens=max_tokens)
    lens_obj = get_lens(model, lens, **lens_kwargs)
    traj = trajectories(model, items, lens=lens_obj, convention=convention, top_k=1, batch_size=batch_size, progress=progress)
    t = traj.target("answer")[["item", "position", "layer", "token_id", "rank", "prob"]]
    final = traj.target("final")
    final = final[final["layer"] == final["layer"].max()][["item", "position", "token_id"]].rename(columns={"token_id": "final_id"})
    out = meta.merge(t, on=["item", "position"]).merge(final, on=["item", "position"])
    out["correct"] = out["token_id"] == out["final_id"]
    return out.drop(columns="final_id").sort_values(["item", "token", "layer"], kind="stable").reset_index(drop=True)


def fact_onsets(ranks: pd.DataFrame, ks: Sequence[int] | None = None) -> pd.DataFrame:
    """Per answer token and k: the earliest layer from layer 1 at rank ≤ k
    (:func:`depthkit.analyses.summaries.onset_layers`), with ``token``, ``length_group``,
    ``answer_len``, ``category`` and ``correct`` carried along."""
    from depthkit.analyses.summaries import FIRST_DEPTH_LAYER, onset_layers

    need = {"item", "position", "layer", "rank", "token", "length_group", "correct"}
    if not need <= set(ranks.columns):
        raise ValueError(f"The rank frame needs columns {sorted(need)}; build it with answer_ranks().")
    on = onset_layers(ranks[["item", "position", "layer", "rank"]], ks, first_layer=FIRST_DEPTH_LAYER)
    carry = ranks.drop_duplicates(["item", "position"])[[c for c in ("item", "position", "token", "answer_len", "length_group", "category", "correct") if c in ranks.columns]]
    return on.merge(carry, on=["item", "position"])


def onset_table(
    onsets: pd.DataFrame, k: int = 1, by: Sequence[str] = ("token", "correct"), n_boot: int = 1000, seed: int = 0,
    *, censor_at: float | None = None,
) -> pd.DataFrame:
    """Mean onset layer at one ``k`` per group (``by``), over the tokens that reach
    rank ≤ k, with a bootstrap interval (:func:`depthkit.analyses.summaries.onset_curve`):
    ``[*by, mean_onset, lo, hi, n_reached, n_items]``; with ``censor_at`` (the output
    row L) the mean is over onsets before it, and ``n_censored``, ``censored``,
    ``censored_lo``, ``censored_hi`` count the rest."""
    from depthkit.analyses.summaries import onset_curve

    sub = onsets[onsets["k"] == int(k)]
    if sub.empty:
        raise ValueError(f"No onsets at k = {k}; compute fact_onsets with this k in ks.")
    out = onset_curve(sub, by=list(by), n_boot=n_boot, seed=seed, censor_at=censor_at)
    return out.drop(columns="k")
