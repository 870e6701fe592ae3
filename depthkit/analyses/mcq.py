"""Constrained choice: few-shot multiple-choice prompts and the per-layer analysis of
*option collection* and *option reasoning* (the paper's multiple-choice analysis).

Prompts
-------
Every prompt is a few-shot prompt that ends exactly where the option token comes
next. Demonstrations are fixed per task (``shots`` of them, default 4) and never
include the evaluated example:

* **MMLU** (4 options): the first ``shots`` questions of the subject's *dev* split,
  formatted as ``question / A. ... / D. ... / Answer: B``; the evaluated questions
  come from the *test* split.
* **ARC-Easy, ARC-Challenge, SciQ, OpenBookQA** (4 options) and **PIQA** (2), from
  :mod:`depthkit.data.choice_sets`: lettered like MMLU under a one-line header; the
  sets ship one split here, so ``shots`` demonstrations are a fixed seeded draw,
  removed from the pool the evaluated questions come from.
* **ARC-Easy, ARC-Challenge, SciQ, OpenBookQA with written-out options**
  (``arc_easy_words``, ...): the same questions, the options listed as
  ``Choices: a; b; c; d`` and answered by the option's own words
  (``Answer: mitochondria``): no label to map back, which a small model may
  manage where letters defeat it. Only questions whose options start with
  different words are drawn; :func:`add_option_ids` can drop the few whose options
  still share a first token under a model's tokenizer.
* **SST-2, MRPC, RTE** (2 options): GLUE ships only its validation split here, so
  the demonstrations are a fixed, label-balanced draw from it (seeded) and are
  removed from the pool the evaluated examples are drawn from. By default the
  options are *verbalisers* named in the prompt:

  ====== ================================================= =================
  task   cue                                               options (label 0, 1)
  ====== ================================================= =================
  sst2   ``Sentiment (negative or positive):``              negative, positive
  mrpc   ``Same meaning (no or yes):``                      no, yes
  rte    ``Entailment (yes or no):``                        yes, no
  ====== ================================================= =================

  (GLUE's RTE label 0 is *entailment*, MRPC's label 1 is *equivalent*.)

``labels`` changes how options are named: ``"default"`` (as above), ``"letters"``
(every task as lettered choices ``A. negative / B. positive / Answer:``),
``"symbols"`` (lettered, with rare symbols :data:`SYMBOLS` instead of letters: the
control that separates "frequent letter tokens" from "recognised options"), or a
list of label strings. ``permute=True`` shuffles the order of the options of every
example (demonstrations included), so the gold label's position varies.

The option token of each option is the first token of ``" " + label`` as it
follows the prompt (:func:`depthkit.lens.trajectories.answer_token_ids`).

Analysis
--------
:func:`option_ranks` decodes every layer through a lens and keeps rank and
probability of every option token; the pure functions below turn that frame into
per-layer shares. *Collected* at layer ℓ: every option sits in the top-|O| of the
whole vocabulary. *Choice* at ℓ: the most probable option; the model's *answer* is
the choice at ℓ = L.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from depthkit import data as dkdata
from depthkit.data import choice_sets
from depthkit.lens.base import DEFAULT_LENS, Lens
from depthkit.lens.registry import get_lens
from depthkit.lens.trajectories import Trajectories, answer_token_ids, trajectories
from depthkit.stats import LEVEL, MIN_N

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

# Word-option variants of the choice sets; PIQA's options are whole sentences that
# often start alike, so it has none.
WORDS = "_words"
WORD_TASKS = tuple(f"{t}{WORDS}" for t in choice_sets.SETS if t != "piqa")
TASKS = ("mmlu", "sst2", "mrpc", "rte", *choice_sets.SETS, *WORD_TASKS)
LETTERS = ("A", "B", "C", "D")
# Rare in text and, after a space, one token each in both embedded tokenizers
# (SmolLM2, Gemma 3); distinct first tokens are checked for every prompt anyway
# (:func:`add_option_ids`).
SYMBOLS = ("§", "µ", "π", "±")

_GLUE = {
    "sst2": {"header": "Classify the sentiment of each movie review.", "cue": "Sentiment", "options": ("negative", "positive")},
    "mrpc": {"header": "Decide whether the two sentences mean the same thing.", "cue": "Same meaning", "options": ("no", "yes")},
    "rte": {"header": "Decide whether the premise entails the hypothesis.", "cue": "Entailment", "options": ("yes", "no")},
}


@dataclass(frozen=True)
class Example:
    """One question before formatting: ``body`` (the text), ``cue`` (the line that
    asks for the answer; empty for MMLU), ``options`` in canonical order, ``gold`` index."""

    body: str
    cue: str
    options: tuple[str, ...]
    gold: int


Labels = tuple[str, ...] | Literal["words"] | None


def _label_set(labels: str | Sequence[str], task: str, n_options: int) -> Labels:
    """Labels to letter the options with, ``"words"`` for written-out options, or
    None for verbalisers."""
    if isinstance(labels, str):
        if labels == "default":
            return None if task in _GLUE else "words" if task in WORD_TASKS else LETTERS[:n_options]
        if labels == "letters":
            return LETTERS[:n_options]
        if labels == "symbols":
            return SYMBOLS[:n_options]
        raise ValueError(f"labels must be 'default', 'letters', 'symbols' or a list of {n_options} label strings, got {labels!r}.")
    out = tuple(str(x).strip() for x in labels)
    if len(out) < n_options or len(set(out)) < len(out) or not all(out):
        raise ValueError(f"Give at least {n_options} distinct, non-empty option labels; got {list(labels)}.")
    return out[:n_options]


def render(ex: Example, labels: Labels, order: Sequence[int]) -> tuple[str, list[str], int]:
    """Format one example: (text ending where the option comes next, the option
    continuations in column order, index of the gold one).

    Verbalisers (``labels=None``): the cue lists the options in ``order`` and the
    columns are the option words in canonical order. Words (``"words"``): a
    ``Choices:`` line lists the options in ``order``; the columns are the options
    in canonical order. Lettered: the options are listed in ``order`` under the
    labels, and column j is label j.
    """
    order = list(order)
    if sorted(order) != list(range(len(ex.options))):
        raise ValueError(f"order {order} is not a permutation of the {len(ex.options)} options.")
    if labels == "words":
        listed = "; ".join(ex.options[o] for o in order)
        return f"{ex.body}\nChoices: {listed}\nAnswer:", [f" {o}" for o in ex.options], ex.gold
    if labels is None:
        listed = " or ".join(ex.options[o] for o in order)
        text = f"{ex.body}\n{ex.cue} ({listed}):"
        return text, [f" {o}" for o in ex.options], ex.gold
    lines = "\n".join(f"{lab}. {ex.options[o]}" for lab, o in zip(labels, order))
    cue = f"\n{ex.cue}:" if ex.cue else ""
    text = f"{ex.body}{cue}\n{lines}\nAnswer:"
    return text, [f" {lab}" for lab in labels], order.index(ex.gold)


def _mmlu_examples(frame: pd.DataFrame) -> list[Example]:
    return [Example(str(q).strip(), "", tuple(str(c) for c in ch), int(a)) for q, ch, a in zip(frame.question, frame.choices, frame.answer)]


def _glue_examples(task: str, frame: pd.DataFrame) -> list[Example]:
    spec = _GLUE[task]
    if task == "sst2":
        bodies = [f"Review: {s.strip()}" for s in frame.sentence]
    elif task == "mrpc":
        bodies = [f"Sentence 1: {a.strip()}\nSentence 2: {b.strip()}" for a, b in zip(frame.sentence1, frame.sentence2)]
    else:
        bodies = [f"Premise: {a.strip()}\nHypothesis: {b.strip()}" for a, b in zip(frame.sentence1, frame.sentence2)]
    return [Example(b, spec["cue"], spec["options"], int(lab)) for b, lab in zip(bodies, frame.label)]


def build_prompts(
    task: str,
    n: int,
    *,
    shots: int = 4,
    labels: str | Sequence[str] = "default",
    permute: bool = False,
    seed: int = 0,
    subjects: str | Sequence[str] | None = None,
) -> pd.DataFrame:
    """Few-shot prompts of one embedded task.

    Returns DataFrame[task, example, prompt, options (list of continuation
    strings, one per column), gold (int), labels, permuted, demo_set]; ``example`` is
    the row of the source data set (MMLU test / GLUE validation); ``demo_set`` names
    the demonstrations a prompt shares with others (MMLU's subject; one set for every
    other task), the unit an interval resamples. ``n`` examples drawn with ``seed``
    (all if there are fewer). ``subjects`` restricts MMLU.
    """
    task = str(task).lower()
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}; choose from {', '.join(TASKS)} (or load your own file with load_mcq_file).")
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}.")
    if int(shots) != shots or shots < 0:
        raise ValueError(f"shots must be a non-negative integer, got {shots!r}.")
    rng = np.random.default_rng(seed)
    if task == "mmlu":
        if shots > 5:
            raise ValueError(f"MMLU's dev split has 5 questions per subject; shots must be at most 5, got {shots}.")
        pool = dkdata.mmlu(subjects, split="test")
        dev = dkdata.mmlu(subjects, split="dev")
        take = np.sort(rng.choice(len(pool), size=min(int(n), len(pool)), replace=False))
        rows = pool.iloc[take]
        demos_by_subject = {s: _mmlu_examples(g.head(shots)) for s, g in dev.groupby("subject")}
        queries = _mmlu_examples(rows)
        demo_lists = [demos_by_subject[s] for s in rows.subject]
        demo_sets = list(rows.subject)
        headers = [f"The following are multiple choice questions (with answers) about {s.replace('_', ' ')}." for s in rows.subject]
        n_options = 4
    elif task in choice_sets.SETS or task in WORD_TASKS:
        pool = choice_sets.choice_set(task.removesuffix(WORDS))
        if task in WORD_TASKS:
            pool = pool[pool.choices.map(_distinct_first_words)]
        ex = [Example(q, "", tuple(ch), int(a)) for q, ch, a in zip(pool.question, pool.choices, pool.answer)]
        # Fixed demonstrations drawn once, never evaluated (the sets ship one split here).
        demo_idx = rng.choice(len(pool), size=min(int(shots), len(pool)), replace=False).tolist()
        rest = np.setdiff1d(np.arange(len(pool)), demo_idx)
        take = np.sort(rng.choice(rest, size=min(int(n), len(rest)), replace=False))
        queries = [ex[i] for i in take]
        demo_lists = [[ex[i] for i in demo_idx]] * len(take)
        demo_sets = [task] * len(take)
        headers = [choice_sets.header(task.removesuffix(WORDS))] * len(take)
        n_options = len(ex[0].options)
    else:
        pool = dkdata.glue(task)
        ex = _glue_examples(task, pool)
        # Label-balanced fixed demonstrations, alternating classes, never evaluated.
        by_label = [rng.permutation(np.flatnonzero(pool.label.to_numpy() == c)).tolist() for c in (0, 1)]
        demo_idx = [by_label[i % 2][i // 2] for i in range(shots)]
        rest = np.setdiff1d(np.arange(len(pool)), demo_idx)
        take = np.sort(rng.choice(rest, size=min(int(n), len(rest)), replace=False))
        queries = [ex[i] for i in take]
        demo_lists = [[ex[i] for i in demo_idx]] * len(take)
        demo_sets = [task] * len(take)
        headers = [_GLUE[task]["header"]] * len(take)
        n_options = 2
    labs = _label_set(labels, task, n_options)
    order_rng = np.random.default_rng(seed + 1)

    def order() -> list[int]:
        return order_rng.permutation(n_options).tolist() if permute else list(range(n_options))

    demo_orders = [order() for _ in range(shots)]
    records = []
    # ``example`` is the row of the source data set, also where a filter left gaps.
    source_rows = pool.index.to_numpy()[take]
    for ex_id, q, demos, header, demo_set in zip(source_rows.tolist(), queries, demo_lists, headers, demo_sets):
        parts = [header, ""]
        for d, o in zip(demos, demo_orders):
            text, opts, g = render(d, labs, o)
            parts += [text + opts[g], ""]
        text, opts, g = render(q, labs, order())
        parts.append(text)
        records.append(
            {
                "task": task,
                "example": int(ex_id),
                "prompt": "\n".join(parts),
                "options": opts,
                "gold": int(g),
                "labels": labels if isinstance(labels, str) else ",".join(labs or ()),
                "permuted": bool(permute),
                "demo_set": str(demo_set),
            }
        )
    return pd.DataFrame(records)


def _distinct_first_words(options: Sequence[str]) -> bool:
    first = [str(o).split()[0].lower() if str(o).split() else "" for o in options]
    return all(first) and len(set(first)) == len(first)


def load_mcq_file(path: str | os.PathLike[str], task: str | None = None) -> pd.DataFrame:
    """A user's multiple-choice file: JSON array or JSONL of
    ``{"prompt", "options", "answer"}`` records. ``prompt`` ends where the option
    comes next; ``options`` are the option continuations (e.g. ``[" A", " B"]``);
    ``answer`` is one of the options or its index. Returns the frame of
    :func:`build_prompts`, its ``task`` named after the file
    (:func:`depthkit.data.user_files.file_set_name`) unless ``task`` is given."""
    task = task or dkdata.file_set_name(path, TASKS)
    frame = dkdata.load_records(path, required=("prompt", "answer", "options"))
    records = []
    for i, row in frame.reset_index(drop=True).iterrows():
        opts = row["options"]
        if not isinstance(opts, (list, tuple)) or len(opts) < 2 or not all(isinstance(o, str) and o.strip() for o in opts):
            raise dkdata.DataError(f"{path}, record {i + 1}: 'options' must be a list of at least 2 non-empty strings, got {opts!r}.")
        ans = row["answer"]
        if isinstance(ans, (int, np.integer)) and not isinstance(ans, bool):
            if not 0 <= int(ans) < len(opts):
                raise dkdata.DataError(f"{path}, record {i + 1}: answer index {ans} is outside 0..{len(opts) - 1}.")
            gold = int(ans)
        elif isinstance(ans, str) and ans in opts:
            gold = list(opts).index(ans)
        elif isinstance(ans, str) and ans.strip() in [o.strip() for o in opts]:
            gold = [o.strip() for o in opts].index(ans.strip())
        else:
            raise dkdata.DataError(f"{path}, record {i + 1}: answer {ans!r} is neither one of the options {list(opts)} nor an index.")
        records.append(
            {"task": task, "example": int(i), "prompt": str(row["prompt"]), "options": list(opts), "gold": gold, "labels": "file", "permuted": False}
        )
    return pd.DataFrame(records)


def add_option_ids(model: Model, prompts: pd.DataFrame, *, drop_shared: bool = False) -> pd.DataFrame:
    """Add ``option_ids``: the first token of each option as it follows its prompt.
    Two options of a prompt that share their first token cannot be told apart: that
    raises, or with ``drop_shared`` the prompt is dropped (their number is in
    ``attrs["dropped_shared_first_token"]``, per task)."""
    ids, keep, dropped = [], [], {}
    for prompt, opts, task in zip(prompts["prompt"], prompts["options"], prompts["task"]):
        first = [answer_token_ids(model, prompt, o)[0] for o in opts]
        shared = len(set(first)) < len(first)
        if shared and not drop_shared:
            raise ValueError(
                f"Options {list(opts)} share a first token ({first}) after this prompt, so their ranks cannot be told "
                "apart. Choose labels whose first tokens differ (e.g. labels='letters')."
            )
        keep.append(not shared)
        if shared:
            dropped[task] = dropped.get(task, 0) + 1
        else:
            ids.append(first)
    out = prompts[np.array(keep, dtype=bool)].copy()
    out["option_ids"] = ids
    if drop_shared:
        out = out.reset_index(drop=True)
    out.attrs["dropped_shared_first_token"] = dropped
    return out


def option_ranks(
    model: Model,
    prompts: pd.DataFrame,
    *,
    lens: str | Lens = DEFAULT_LENS,
    convention: str = "canonical",
    batch_size: int = 8,
    progress: bool = True,
    return_trajectories: bool = False,
    **lens_kwargs,
) -> pd.DataFrame | tuple[pd.DataFrame, dict[str, Trajectories]]:
    """Rank and probability of every option token at every layer.

    ``prompts``: frame of :func:`build_prompts` / :func:`load_mcq_file` (option ids
    are added if missing). Returns DataFrame[task, item, example, layer, option,
    token_id, rank, prob, is_gold, top1_is_option]; ``item`` is the row of
    ``prompts``; ``top1_is_option``: the lens top-1 token is one of the options.
    With ``return_trajectories``, also the :class:`Trajectories` of each task (targets
    ``opt0``.. and ``gold``; its ``item`` is the position within the task), e.g. for
    :func:`depthkit.analyses.early_exit.early_exit_table`. A ``demo_set`` column of
    ``prompts`` is carried along.
    """
    if "option_ids" not in prompts.columns:
        prompts = add_option_ids(model, prompts)
    prompts = prompts.reset_index(drop=True)
    lens_obj = get_lens(model, lens, **lens_kwargs)
    frames, trajs = [], {}
    for (task, k), group in prompts.groupby([prompts["task"], prompts["option_ids"].map(len)], sort=False):
        names = [f"opt{j}" for j in range(k)]
        targets = {nm: [ids[j] for ids in group["option_ids"]] for j, nm in enumerate(names)}
        targets["gold"] = [ids[g] for ids, g in zip(group["option_ids"], group["gold"])]
        traj = trajectories(
            model, list(group["prompt"]), lens=lens_obj, convention=convention, targets=targets,
            top_k=1, batch_size=batch_size, progress=progress,
        )  # fmt: skip
        t = traj.targets[traj.targets["target"].isin(names)].copy()
        rows = group.index.to_numpy()
        t["item"] = rows[t["item"].to_numpy()]
        t["option"] = t["target"].str[3:].astype(np.int64)
        top1 = traj.steps[["item", "layer", "top1_id"]].copy()
        top1["item"] = rows[top1["item"].to_numpy()]
        t = t.merge(top1, on=["item", "layer"])
        opt_sets = {r: set(prompts.at[r, "option_ids"]) for r in rows}
        t["top1_is_option"] = [tid in opt_sets[r] for tid, r in zip(t["top1_id"], t["item"])]
        frames.append(t)
        # A user file may mix option counts within a task: one trajectory set per count.
        trajs[str(task) if str(task) not in trajs else f"{task} ({k} options)"] = traj
    out = pd.concat(frames, ignore_index=True)
    out["task"] = prompts.loc[out["item"], "task"].to_numpy()
    out["example"] = prompts.loc[out["item"], "example"].to_numpy()
    out["is_gold"] = out["option"].to_numpy() == prompts.loc[out["item"], "gold"].to_numpy()
    cols = ["task", "item", "example", "layer", "option", "token_id", "rank", "prob", "is_gold", "top1_is_option"]
    if "demo_set" in prompts.columns:
        out["demo_set"] = prompts.loc[out["item"], "demo_set"].to_numpy()
        cols.append("demo_set")
    out = out[cols].sort_values(["item", "layer", "option"], kind="stable").reset_index(drop=True)
    return (out, trajs) if return_trajectories else out


# ---------------------------------------------------------------- analysis (pure)

_RANK_COLUMNS = ("task", "item", "layer", "option", "rank", "prob", "is_gold")


def _check(ranks: pd.DataFrame) -> None:
    missing = [c for c in _RANK_COLUMNS if c not in ranks.columns]
    if missing:
        raise ValueError(f"The option-rank frame lacks columns {missing}; build it with option_ranks().")
    if ranks.duplicated(["item", "layer", "option"]).any():
        raise ValueError("The option-rank frame has duplicate (item, layer, option) rows.")


def per_item(ranks: pd.DataFrame) -> pd.DataFrame:
    """One row per (item, layer): ``collected`` (all options in the top-|O|),
    ``mass`` (probability on the options), ``choice`` (most probable option),
    ``answer`` (the choice at the last layer = the model's answer), ``gold``,
    ``agrees_final`` and ``agrees_gold``."""
    _check(ranks)
    g = ranks.groupby(["task", "item", "layer"], sort=True)
    out = g.agg(n_options=("option", "size"), worst_rank=("rank", "max"), mass=("prob", "sum")).reset_index()
    out["collected"] = out["worst_rank"] <= out["n_options"]
    best = ranks.loc[ranks.groupby(["item", "layer"])["prob"].idxmax(), ["item", "layer", "option"]]
    out = out.merge(best.rename(columns={"option": "choice"}), on=["item", "layer"])
    last = out.groupby("item")["layer"].transform("max")
    answer = out[out["layer"] == last][["item", "choice"]].rename(columns={"choice": "answer"})
    gold = ranks[ranks["is_gold"]].drop_duplicates("item")[["item", "option"]].rename(columns={"option": "gold"})
    out = out.merge(answer, on="item").merge(gold, on="item", how="left")
    out["agrees_final"] = out["choice"] == out["answer"]
    out["agrees_gold"] = out["choice"] == out["gold"]
    return out


def collection_reasoning(ranks: pd.DataFrame) -> pd.DataFrame:
    """Per task and layer: ``collected_share`` (option collection), ``mass`` (mean
    probability on the options), ``final_share`` and ``gold_share`` (option
    reasoning: the layer's most probable option equals the model's answer / the gold
    one), ``n`` items."""
    p = per_item(ranks)
    return (
        p.groupby(["task", "layer"], sort=True)
        .agg(
            collected_share=("collected", "mean"),
            mass=("mass", "mean"),
            final_share=("agrees_final", "mean"),
            gold_share=("agrees_gold", "mean"),
            n=("item", "size"),
        )
        .reset_index()
    )


def accuracy(ranks: pd.DataFrame) -> pd.DataFrame:
    """Per task, at the model's output: ``accuracy`` (answer = gold),
    ``majority_answer`` and ``majority_share`` (the most frequent answer, ties to the
    first option, and the share of items that get it: near 1, the model answers
    alike whatever the prompt, and "the answer is settled early" says little),
    ``top1_option`` (share whose unrestricted top-1 token is an option, when the
    frame has ``top1_is_option``) and ``n``."""
    p = per_item(ranks)
    last = p[p["layer"] == p.groupby("item")["layer"].transform("max")]
    out = last.groupby("task").agg(accuracy=("agrees_gold", "mean"), n=("item", "size")).reset_index()
    counts = last.groupby(["task", "answer"]).size().rename("count").reset_index()
    top = counts.sort_values(["task", "count", "answer"], ascending=[True, False, True]).drop_duplicates("task")
    out = out.merge(top.rename(columns={"answer": "majority_answer"}), on="task")
    out["majority_share"] = out.pop("count") / out["n"]
    if "top1_is_option" in ranks.columns:
        r = ranks[ranks["layer"] == ranks.groupby("item")["layer"].transform("max")].drop_duplicates("item")
        out = out.merge(r.groupby("task")["top1_is_option"].mean().rename("top1_option").reset_index(), on="task")
    return out


def majority_baseline(prompts: pd.DataFrame) -> pd.Series:
    """Per task, the accuracy of always giving the most frequent gold answer (by its
    position in the option list): what a model that ignores the question scores.
    A task whose accuracy does not clear it says nothing about reasoning."""
    if not {"task", "gold"} <= set(prompts.columns):
        raise ValueError("The prompts need task and gold columns; build them with build_prompts or load_mcq_file.")
    return prompts.groupby("task")["gold"].agg(lambda g: g.value_counts(normalize=True).max()).rename("majority_baseline")


def first_layer_reaching(curve: np.ndarray, layers: np.ndarray, level: float, *, stay: bool) -> float:
    """Earliest layer whose value is ≥ ``level`` (``stay``: and every later one
    too); NaN if none."""
    ok = np.asarray(curve) >= level
    if stay:
        if not ok[-1]:
            return float("nan")
        bad = np.flatnonzero(~ok)
        return float(layers[0 if len(bad) == 0 else bad[-1] + 1])
    hit = np.flatnonzero(ok)
    return float(layers[hit[0]]) if len(hit) else float("nan")


def _collection_layer(m: np.ndarray, layers: np.ndarray, level: float) -> float:
    curve = m.mean(0)
    peak = curve.max()
    return float("nan") if peak <= 0 else first_layer_reaching(curve, layers, level * peak, stay=False)


def _decision_layer(m: np.ndarray, layers: np.ndarray, level: float) -> float:
    return first_layer_reaching(m.mean(0), layers, level, stay=True)


def _demo_units(ranks: pd.DataFrame, items: pd.Index) -> tuple[np.ndarray | None, int]:
    """``(units, sets)``: per item its demonstration set where the items hold more
    than one (prompts sharing demonstrations are not independent), else None (each
    prompt its own unit); ``sets`` counts the named sets (0: none named, e.g. a file)."""
    if "demo_set" not in ranks.columns:
        return None, 0
    sets = ranks.groupby("item")["demo_set"].first().reindex(items)
    named = int(sets.nunique())
    if named < 2:
        return None, named
    return sets.astype(object).where(sets.notna(), "prompt " + items.astype(str)).to_numpy(), named


def layer_estimates(
    ranks: pd.DataFrame,
    *,
    collect_level: float = 0.5,
    decide_level: float = 0.9,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    min_n: int = MIN_N,
) -> pd.DataFrame:
    """Per task: the *collection layer* (earliest layer at which the share of prompts
    with every option in the top-|O| reaches ``collect_level`` × its peak over
    layers) and the *decision layer* (earliest layer from which the share whose
    most probable option equals the model's answer stays ≥ ``decide_level``), each
    with a percentile bootstrap interval (:func:`depthkit.stats.bootstrap_layer`),
    plus the peak collection share, the layer it is reached at and the number of
    blocks L.

    The interval resamples demonstration sets (``demo_set`` of the ranks) as
    clusters where a task has more than one; where all prompts share one set
    (``demo_sets`` = 1) it resamples prompts and so covers prompt variation only.
    ``*_mode_share`` and ``*_censored_share``: the share of resamples at a
    zero-width interval's layer and at the output row L (:class:`depthkit.stats.LayerCI`).
    """
    from depthkit.stats import bootstrap_layer

    for name, v in (("collect_level", collect_level), ("decide_level", decide_level)):
        if not 0 < v <= 1:
            raise ValueError(f"{name} must lie in (0, 1], got {v}.")
    p = per_item(ranks)
    rows = []
    for task, g in p.groupby("task", sort=False):
        coll = g.pivot(index="item", columns="layer", values="collected").sort_index(axis=1)
        agree = g.pivot(index="item", columns="layer", values="agrees_final").sort_index(axis=1)
        layers = coll.columns.to_numpy()
        cm, am = coll.to_numpy(dtype=float), agree.to_numpy(dtype=float)
        units, sets = _demo_units(ranks, coll.index)
        kw = dict(n_boot=n_boot, seed=seed, level=level, min_n=min_n, units=units, grid=layers, censor_at=float(layers.max()))
        idx = np.arange(len(coll), dtype=float)
        c_ci = bootstrap_layer(idx, lambda i: _collection_layer(cm[i.astype(int)], layers, collect_level), **kw)
        d_ci = bootstrap_layer(idx, lambda i: _decision_layer(am[i.astype(int)], layers, decide_level), **kw)
        curve = cm.mean(0)
        rows.append(
            {
                "task": task,
                "collection_layer": c_ci.estimate,
                "collection_lo": c_ci.lo,
                "collection_hi": c_ci.hi,
                "peak_collected_share": float(curve.max()),
                "peak_layer": int(layers[curve.argmax()]),
                "decision_layer": d_ci.estimate,
                "decision_lo": d_ci.lo,
                "decision_hi": d_ci.hi,
                "n_layers": int(layers.max()),
                "n": int(len(coll)),
                "demo_sets": sets,
                "collection_mode_share": c_ci.mode_share,
                "collection_censored_share": c_ci.censored_share,
                "decision_mode_share": d_ci.mode_share,
                "decision_censored_share": d_ci.censored_share,
                "step": c_ci.step,
            }
        )
    return pd.DataFrame(rows)
