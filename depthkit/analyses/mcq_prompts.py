"""Few-shot multiple-choice prompts: the embedded tasks formatted as prompts that end
where the option token comes next, and a user's own multiple-choice file read into the
same frame (the input of :func:`depthkit.analyses.mcq.option_ranks`).

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
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from depthkit import data as dkdata
from depthkit.data import choice_sets

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



@dataclass(frozen=True)
class _Draw:
    """The evaluated examples of one task and what each is shown with: ``take`` the
    drawn rows of ``pool``, and per query its demonstrations, their set's name and
    the prompt's header line."""

    pool: pd.DataFrame
    take: np.ndarray
    queries: list[Example]
    demo_lists: list[list[Example]]
    demo_sets: list[str]
    headers: list[str]
    n_options: int


def _check_request(task: str, n: int, shots: int) -> None:
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}; choose from {', '.join(TASKS)} (or load your own file with load_mcq_file).")
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}.")
    if int(shots) != shots or shots < 0:
        raise ValueError(f"shots must be a non-negative integer, got {shots!r}.")


def _mmlu_draw(n: int, shots: int, subjects: str | Sequence[str] | None, rng: np.random.Generator) -> _Draw:
    if shots > 5:
        raise ValueError(f"MMLU's dev split has 5 questions per subject; shots must be at most 5, got {shots}.")
    pool = dkdata.mmlu(subjects, split="test")
    dev = dkdata.mmlu(subjects, split="dev")
    take = np.sort(rng.choice(len(pool), size=min(int(n), len(pool)), replace=False))
    rows = pool.iloc[take]
    demos_by_subject = {s: _mmlu_examples(g.head(shots)) for s, g in dev.groupby("subject")}
    headers = [f"The following are multiple choice questions (with answers) about {s.replace('_', ' ')}." for s in rows.subject]
    return _Draw(pool, take, _mmlu_examples(rows), [demos_by_subject[s] for s in rows.subject], list(rows.subject), headers, 4)


def _choice_set_draw(task: str, n: int, shots: int, rng: np.random.Generator) -> _Draw:
    pool = choice_sets.choice_set(task.removesuffix(WORDS))
    if task in WORD_TASKS:
        pool = pool[pool.choices.map(_distinct_first_words)]
    ex = [Example(q, "", tuple(ch), int(a)) for q, ch, a in zip(pool.question, pool.choices, pool.answer)]
    # Fixed demonstrations drawn once, never evaluated (the sets ship one split here).
    demo_idx = rng.choice(len(pool), size=min(int(shots), len(pool)), replace=False).tolist()
    rest = np.setdiff1d(np.arange(len(pool)), demo_idx)
    take = np.sort(rng.choice(rest, size=min(int(n), len(rest)), replace=False))
    header = choice_sets.header(task.removesuffix(WORDS))
    return _Draw(pool, take, [ex[i] for i in take], [[ex[i] for i in demo_idx]] * len(take), [task] * len(take),
                 [header] * len(take), len(ex[0].options))  # fmt: skip


def _glue_draw(task: str, n: int, shots: int, rng: np.random.Generator) -> _Draw:
    pool = dkdata.glue(task)
    ex = _glue_examples(task, pool)
    # Label-balanced fixed demonstrations, alternating classes, never evaluated.
    by_label = [rng.permutation(np.flatnonzero(pool.label.to_numpy() == c)).tolist() for c in (0, 1)]
    demo_idx = [by_label[i % 2][i // 2] for i in range(shots)]
    rest = np.setdiff1d(np.arange(len(pool)), demo_idx)
    take = np.sort(rng.choice(rest, size=min(int(n), len(rest)), replace=False))
    return _Draw(pool, take, [ex[i] for i in take], [[ex[i] for i in demo_idx]] * len(take), [task] * len(take),
                 [_GLUE[task]["header"]] * len(take), 2)  # fmt: skip


def _records(
    task: str, draw: _Draw, labels: str | Sequence[str], labs: Labels, *, shots: int, permute: bool, seed: int
) -> list[dict]:
    # Option orders come from their own generator, so permuting leaves the drawn examples as they are.
    order_rng = np.random.default_rng(seed + 1)

    def order() -> list[int]:
        return order_rng.permutation(draw.n_options).tolist() if permute else list(range(draw.n_options))

    demo_orders = [order() for _ in range(shots)]
    records = []
    # ``example`` is the row of the source data set, also where a filter left gaps.
    source_rows = draw.pool.index.to_numpy()[draw.take]
    for ex_id, q, demos, header, demo_set in zip(source_rows.tolist(), draw.queries, draw.demo_lists, draw.headers, draw.demo_sets):
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
    return records


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
    _check_request(task, n, shots)
    rng = np.random.default_rng(seed)
    if task == "mmlu":
        draw = _mmlu_draw(n, shots, subjects, rng)
    elif task in choice_sets.SETS or task in WORD_TASKS:
        draw = _choice_set_draw(task, n, shots, rng)
    else:
        draw = _glue_draw(task, n, shots, rng)
    labs = _label_set(labels, task, draw.n_options)
    return pd.DataFrame(_records(task, draw, labels, labs, shots=shots, permute=permute, seed=seed))


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
