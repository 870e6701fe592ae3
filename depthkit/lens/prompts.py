"""Prompts into token ids and :class:`~depthkit.engine.batching.Item` objects, as
the model's own tokenizer makes them: what the trajectory engine reads.

A prompt longer than the model's context raises :class:`PromptTooLongError`, or
loses its start with ``on_overflow="truncate"``; an answer is tokenised as it
follows its prompt in running text (:func:`answer_token_ids`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from depthkit.engine.batching import Item

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

Overflow = Literal["error", "truncate"]


class PromptTooLongError(ValueError):
    """A prompt exceeds the model's context window."""


def encode(model: Model, text: str, *, on_overflow: Overflow = "error", max_tokens: int | None = None) -> list[int]:
    """Token ids of ``text`` as the model's own tokenizer makes them (special tokens
    included, e.g. Gemma's BOS). Too-long texts raise, or lose their *start* with a
    warning when ``on_overflow="truncate"`` (the end is what the prediction reads).

    >>> import depthkit as dk
    >>> model = dk.load_model("tiny-llama", seed=0)
    >>> ids = dk.encode(model, "The capital of France is")
    >>> model.tokenizer.decode(ids)
    'The capital of France is'
    >>> dk.encode(model, "The capital of France is", max_tokens=len(ids)) == ids
    True
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"Empty prompt ({text!r}): every prompt needs some text.")
    tok = model.tokenizer
    ids = list(tok(text, add_special_tokens=True)["input_ids"])
    limit = max_tokens or _context(model)
    if len(ids) > limit:
        if on_overflow == "truncate":
            warnings.warn(
                f"Prompt of {len(ids)} tokens exceeds the context of {limit}; keeping its last {limit} tokens.",
                stacklevel=2,
            )
            ids = ids[-limit:]
        else:
            raise PromptTooLongError(
                f"Prompt of {len(ids)} tokens exceeds the model's context of {limit} tokens "
                f"(it starts {text[:60]!r}). Shorten it, or pass on_overflow='truncate' to keep its last {limit} tokens."
            )
    return ids


def answer_token_ids(model: Model, prompt: str, answer: str) -> list[int]:
    """Token ids of ``answer`` as they follow ``prompt`` (for teacher forcing by ids).

    Encodes ``prompt + answer`` and keeps what follows the prompt's own tokens, so a
    leading space is tokenised as in running text. If the tokenizer merges across the
    boundary, falls back to encoding the answer alone.

    >>> import depthkit as dk
    >>> model = dk.load_model("tiny-llama", seed=0)
    >>> ids = dk.answer_token_ids(model, "The capital of France is", " Paris")
    >>> model.tokenizer.decode(ids)
    ' Paris'
    """
    tok = model.tokenizer
    p = list(tok(prompt, add_special_tokens=True)["input_ids"])
    full = list(tok(prompt + answer, add_special_tokens=True)["input_ids"])
    if full[: len(p)] == p and len(full) > len(p):
        return full[len(p) :]
    ids = list(tok(answer, add_special_tokens=False)["input_ids"])
    if not ids:
        raise ValueError(f"Answer {answer!r} tokenizes to nothing; give a non-empty answer.")
    return ids


def make_items(
    model: Model,
    prompts: Sequence[str],
    *,
    positions: Literal["last", "all"] = "last",
    targets: Mapping[str, Sequence[int | str]] | None = None,
    on_overflow: Overflow = "error",
) -> list[Item]:
    """Items for plain prompts. ``targets`` maps a name to one entry per prompt: a
    token id, or a string whose first token (as it follows the prompt) is the target.
    Targets need ``positions="last"``.

    >>> import depthkit as dk
    >>> model = dk.load_model("tiny-llama", seed=0)
    >>> items = dk.make_items(model, ["The capital of France is", "One two"], targets={"gold": [" Paris", " three"]})
    >>> [it.positions == [len(it.tokens) - 1] for it in items], list(items[0].targets)
    ([True, True], ['gold'])
    >>> [len(it.positions) == len(it.tokens) for it in dk.make_items(model, ["One two"], positions="all")]
    [True]
    """
    if len(prompts) == 0:
        raise ValueError("No prompts given: the dataset is empty.")
    targets = dict(targets or {})
    if targets and positions != "last":
        raise ValueError("Named targets are per prompt and need positions='last'; build Item objects for more.")
    items = []
    for i, text in enumerate(prompts):
        ids = encode(model, text, on_overflow=on_overflow)
        pos = [len(ids) - 1] if positions == "last" else list(range(len(ids)))
        tg = {}
        for name, values in targets.items():
            if len(values) != len(prompts):
                raise ValueError(f"Target {name!r} has {len(values)} entries for {len(prompts)} prompts.")
            v = values[i]
            tg[name] = [int(v) if not isinstance(v, str) else answer_token_ids(model, text, v)[0]]
        items.append(Item(ids, pos, tg))
    return items


def _context(model: Model) -> int:
    return int(model.info.n_ctx)
