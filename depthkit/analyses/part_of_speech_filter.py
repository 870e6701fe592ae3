"""The correctness filter of the part-of-speech chapter, and whether what it keeps
can carry a comparison of word classes.

As in the paper, only prompts whose greedy next token is the answer's first token
are analysed. That filter can leave too little, or too selected a few, to compare
function and content words: :func:`class_comparison` says when, and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from depthkit.analyses.part_of_speech import CLASSES, CONTENT_TAGS, FUNCTION_TAGS, word_class

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

# The function/content comparison is made only if each class keeps at least this many
# correctly predicted examples ...
MIN_KEPT_PER_CLASS: int = 30
# ... and at least this share of its candidates (below it, the survivors are a
# selected minority of the class, not the class). A 135M model predicts about one
# content word in six right (15.7 % on the embedded passages), the paper's own
# correctness filter at work; a file the model cannot read keeps under 1 %.
MIN_KEPT_SHARE: float = 0.10


def is_word_token(tag: str, token: str) -> bool:
    """Whether an answer's first token stands for a word of its tag: letters for a
    word ("13th" tagged ADJ whose first token is "1", or "-" before "based", are
    tokenisation artefacts that reach rank 1 at once and say nothing about the
    class), digits for NUM, no letters or digits for PUNCT, and never bare
    whitespace."""
    t = token.strip()
    if not t:
        return False
    if tag == "PUNCT":
        return not any(c.isalnum() for c in t)
    if tag == "NUM":
        return any(c.isdigit() for c in t)
    return any(c.isalpha() for c in t)


class FilterResult(NamedTuple):
    """Outcome of :func:`correctness_filter`."""

    kept: pd.DataFrame  # the examples the model predicts correctly whose first answer token is a word, with answer_id
    checked: pd.DataFrame  # every example, with answer_id, answer_token, word_token, greedy_id, greedy_token, correct
    report: pd.DataFrame  # per tag: candidates, kept, kept_share


def greedy_next_tokens(model: Model, prompts: Sequence[str], *, batch_size: int = 16, progress: bool = True) -> np.ndarray:
    """The model's greedy next-token id after each prompt.

    Reads the final residual at the last position (right-padded batches of similar
    length) and applies the model's own final norm and unembedding, which is exactly
    the model's logits there.
    """
    import torch

    from depthkit.engine.capture import residual_batches
    from depthkit.lens.base import LogitLens
    from depthkit.lens.trajectories import make_items

    items = make_items(model, list(prompts))
    readout = LogitLens(model)
    n_blocks = model.info.n_blocks
    out = np.empty(len(items), dtype=np.int64)
    order = sorted(range(len(items)), key=lambda i: len(items[i].tokens))
    bar = tqdm(total=len(items), desc="greedy next token", unit="prompt", disable=not progress, leave=False)
    batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    finals = residual_batches(model, [[items[i] for i in batch] for batch in batches], [n_blocks])
    for batch, final in zip(batches, finals):
        h = final[0]  # [prompt, d_model]
        with torch.no_grad():
            out[batch] = readout.readout(h).argmax(-1).cpu().numpy()
        bar.update(len(batch))
    bar.close()
    return out


def correctness_filter(model: Model, examples: pd.DataFrame, *, batch_size: int = 16, progress: bool = True) -> FilterResult:
    """Keep the examples whose greedy next token is the answer's first token (the
    answer tokenised as it follows the prompt, :func:`depthkit.answer_token_ids`)
    and whose first token is a word of its tag (:func:`is_word_token`).

    Returns the kept rows, every row with its check, and a per-tag report of how many
    each tag keeps.
    """
    from depthkit.lens.trajectories import answer_token_ids

    missing = [c for c in ("tag", "prompt", "answer") if c not in examples.columns]
    if missing:
        raise ValueError(f"The examples lack column(s) {missing}; build them with pos_dataset or load_pos_files.")
    if examples.empty:
        raise ValueError("No examples to filter: the dataset is empty.")
    checked = examples.reset_index(drop=True).copy()
    checked["answer_id"] = [answer_token_ids(model, p, a)[0] for p, a in zip(checked["prompt"], checked["answer"])]
    checked["greedy_id"] = greedy_next_tokens(model, checked["prompt"].tolist(), batch_size=batch_size, progress=progress)
    tok = model.tokenizer
    checked["answer_token"] = [tok.decode([int(i)]) for i in checked["answer_id"]]
    checked["word_token"] = [is_word_token(str(t), a) for t, a in zip(checked["tag"], checked["answer_token"])]
    checked["greedy_token"] = [tok.decode([int(i)]) for i in checked["greedy_id"]]
    checked["correct"] = checked["answer_id"] == checked["greedy_id"]
    keep = checked["correct"] & checked["word_token"]
    report = (
        checked.assign(keep=keep)
        .groupby("tag", sort=False)["keep"]
        .agg(candidates="size", kept="sum")
        .reset_index()
        .astype({"kept": np.int64})
    )
    report["kept_share"] = report["kept"] / report["candidates"]
    kept = checked[keep].drop(columns=["correct"]).reset_index(drop=True)
    return FilterResult(kept=kept, checked=checked, report=report)


def filter_table(checked: pd.DataFrame, analysed: pd.DataFrame | None = None) -> pd.DataFrame:
    """How many candidates the correctness filter kept, per tag and per word class.

    ``checked``: every candidate with its ``tag`` and ``correct`` (and, optionally,
    ``word_token``; the ``checked`` frame of :func:`correctness_filter`).
    ``analysed``: optionally the examples that go on to the analysis (e.g. the kept
    ones capped per tag), counted per tag.

    Returns one row per tag (in order of first appearance), then one per word class
    present (function, content, other): ``[level, group, word_class, candidates,
    not_word, kept, kept_share]`` plus ``analysed`` when given; ``level`` is
    ``"tag"`` or ``"class"`` and ``group`` the tag or the class; ``not_word`` counts
    the correct predictions dropped because the answer's first token is no word.
    """
    missing = [c for c in ("tag", "correct") if c not in checked.columns]
    if missing:
        raise ValueError(f"The checked examples lack column(s) {missing}; pass correctness_filter(...).checked.")
    correct = checked["correct"].astype(bool).to_numpy()
    word = checked["word_token"].astype(bool).to_numpy() if "word_token" in checked.columns else np.ones_like(correct)
    frame = pd.DataFrame({"tag": checked["tag"].astype(str).to_numpy(), "kept": correct & word, "not_word": correct & ~word})
    frame["word_class"] = frame["tag"].map(word_class)
    tag_order = list(dict.fromkeys(frame["tag"]))
    counts = dict(candidates=("kept", "size"), not_word=("not_word", "sum"), kept=("kept", "sum"))
    by_tag = frame.groupby("tag", sort=False).agg(word_class=("word_class", "first"), **counts)
    by_tag = by_tag.reindex(tag_order).reset_index().rename(columns={"tag": "group"}).assign(level="tag")
    present = [c for c in CLASSES if c in set(frame["word_class"])]
    by_class = frame.groupby("word_class").agg(**counts).reindex(present).reset_index()
    by_class = by_class.assign(group=by_class["word_class"], level="class")
    cols = ["level", "group", "word_class", "candidates", "not_word", "kept"]
    out = pd.concat([by_tag[cols], by_class[cols]], ignore_index=True)
    out = out.astype({"candidates": np.int64, "not_word": np.int64, "kept": np.int64})
    out["kept_share"] = out["kept"] / out["candidates"]
    if analysed is not None:
        if "tag" not in analysed.columns:
            raise ValueError("The analysed examples lack a tag column.")
        per_tag = analysed["tag"].astype(str).value_counts()
        per_class = analysed["tag"].astype(str).map(word_class).value_counts()
        counts = np.where(out["level"] == "tag", out["group"].map(per_tag), out["group"].map(per_class))
        out["analysed"] = pd.Series(counts).fillna(0).astype(np.int64).to_numpy()
    return out


class ClassComparison(NamedTuple):
    """Whether the function/content comparison can be made (:func:`class_comparison`)."""

    ok: bool
    reason: str  # why it cannot be made; "" when it can


def _share(v: float) -> str:
    # one decimal below 10 %, and never rounded up onto a threshold it misses
    return f"{np.floor(v * 1000 + 1e-9) / 10:.1f} %" if v < 0.1 else f"{np.floor(v * 100 + 1e-9):.0f} %"


def class_comparison(table: pd.DataFrame, *, min_kept: int | None = None, min_share: float | None = None) -> ClassComparison:
    """Whether function and content words can be compared on what the correctness
    filter kept (``table``: :func:`filter_table`).

    Only if each class keeps at least ``min_kept`` examples (and, when the table has
    an ``analysed`` column, at least that many are analysed) *and* at least
    ``min_share`` of its candidates: a class of which the model predicts only a small
    minority is represented by that selected minority, and a few dozen examples give
    intervals too wide to read. Returns ``(ok, reason)``; ``reason`` says in one
    sentence why not, naming each class and threshold that fails. The thresholds
    default to :data:`MIN_KEPT_PER_CLASS` and :data:`MIN_KEPT_SHARE`.
    """
    min_kept = MIN_KEPT_PER_CLASS if min_kept is None else int(min_kept)
    min_share = MIN_KEPT_SHARE if min_share is None else float(min_share)
    need = {"level", "group", "candidates", "kept"}
    if not need <= set(table.columns):
        raise ValueError(f"The filter table needs columns {sorted(need)}; build it with filter_table().")
    classes = table[table["level"] == "class"].set_index("group")
    problems = []
    for cls, tags in (("function", FUNCTION_TAGS), ("content", CONTENT_TAGS)):
        if cls not in classes.index or classes.loc[cls, "candidates"] == 0:
            problems.append(f"this run has no {cls}-word candidates ({', '.join(tags)})")
            continue
        r = classes.loc[cls]
        share = r["kept"] / r["candidates"]
        needs = [f"{min_kept} examples" if r["kept"] < min_kept else "", _share(min_share) if share < min_share else ""]
        if any(needs):
            problems.append(
                f"only {int(r['kept']):,} of {int(r['candidates']):,} {cls}-word candidates passed the correctness "
                f"filter ({_share(share)}; at least {' and '.join(n for n in needs if n)} needed)"
            )
        elif "analysed" in classes.columns and r["analysed"] < min_kept:
            problems.append(
                f"only {int(r['analysed']):,} {cls}-word examples are analysed (at least {min_kept} needed; raise n_per_tag)"
            )
    if not problems:
        return ClassComparison(True, "")
    return ClassComparison(
        False,
        "Function and content words cannot be compared on this run: " + "; ".join(problems) + ". "
        "So no class means, no function/content gap and no interval for it are reported.",
    )


def filter_sentence(table: pd.DataFrame) -> str:
    """One sentence on what the correctness filter kept (``table``: :func:`filter_table`):
    in all, per word class and per tag."""
    tags = table[table["level"] == "tag"]
    classes = table[table["level"] == "class"]
    total, kept = int(tags["candidates"].sum()), int(tags["kept"].sum())
    per_class = ", ".join(
        f"{r.group} words {r.kept:,} of {r.candidates:,} ({_share(r.kept_share)})" for r in classes.itertuples()
    )
    per_tag = ", ".join(f"{r.group} {r.kept}/{r.candidates}" for r in tags.itertuples())
    not_word = int(tags["not_word"].sum()) if "not_word" in tags.columns else 0
    dropped = (
        f" A further {not_word:,} correct prediction{'s were' if not_word != 1 else ' was'} dropped because the "
        'answer\'s first token is not a word of its tag (a digit of "13th", a bare hyphen).'
        if not_word
        else ""
    )
    return (
        f"The correctness filter kept {kept:,} of {total:,} candidate prompts ({_share(kept / total if total else 0.0)}): "
        f"{per_class} (per tag: {per_tag}).{dropped}"
    )
