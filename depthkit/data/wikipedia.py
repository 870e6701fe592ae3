"""The embedded Wikipedia text: the paragraphs of BoolQ's validation split (split into
a lens quarter and an analysis rest, :mod:`depthkit.data.corpus`) and random
prefixes of them cut at word boundaries, the prompts of the frequency analysis.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from depthkit.data.arrow_files import _arrow_table
from depthkit.data.corpus import CORPUS_SPLITS, corpus_split
from depthkit.data.user_files import DataError

__all__ = ["wikipedia_passages", "wikipedia_prefixes"]


@functools.lru_cache(maxsize=1)
def _passages() -> tuple[str, ...]:
    column = _arrow_table("boolq/none/validation").column("passage").to_pylist()
    # BoolQ asks several questions about the same paragraph; keep each paragraph once,
    # in order of first appearance, so passage ids are stable.
    return tuple(dict.fromkeys(column))


def wikipedia_passages(split: str = "all") -> list[str]:
    """The Wikipedia paragraphs of BoolQ's validation split, deduplicated, in a stable
    order (2,938 paragraphs, about 300k words). Licence: CC BY-SA 3.0.

    ``split``: ``"all"``; ``"lens"``, the quarter tuned lenses are trained on; or
    ``"analysis"``, the rest, which is all that chapters analyse (:func:`corpus_split`)."""
    if split not in CORPUS_SPLITS:
        raise DataError(f"Unknown corpus split {split!r}; choose one of {', '.join(CORPUS_SPLITS)}.")
    return list(_passages()) if split == "all" else [t for t in _passages() if corpus_split(t) == split]


_WORD_END = re.compile(r"(?<=\S)\s+(?=\S)")


def wikipedia_prefixes(
    n: int, seed: int = 0, min_chars: int = 17, passages: Sequence[str] | None = None, min_passage_chars: int = 200
) -> pd.DataFrame:
    """Random prefixes of Wikipedia paragraphs (the paper's frequency analysis).

    Each prompt comes from a paragraph longer than ``min_passage_chars`` characters,
    cut at a random word boundary chosen uniformly among those leaving at least
    ``min_chars`` characters before the cut and a word after it. The prompt ends with
    the last character of a word (no trailing space), so the next token carries its
    own leading space, as in running text. Paragraphs are drawn without replacement
    in a seeded random order; when ``n`` exceeds their number, a new order is drawn
    and (passage, cut) pairs already used are skipped.

    Returns DataFrame[prompt, passage_id, next_word, cut]: ``passage_id`` indexes
    ``passages`` (default: ``wikipedia_passages("analysis")``), ``next_word`` is the
    whitespace-delimited word after the cut, ``cut`` the character offset.
    """
    for name, value, low in (("n", n, 1), ("min_chars", min_chars, 1), ("min_passage_chars", min_passage_chars, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise DataError(f"wikipedia_prefixes: {name} must be an integer >= {low}, got {value!r}.")
    texts = wikipedia_passages("analysis") if passages is None else list(passages)
    cuts: dict[int, np.ndarray] = {}
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise DataError(f"wikipedia_prefixes: passage {i} is a {type(text).__name__}, not a string.")
        if len(text) <= min_passage_chars:
            continue
        ends = np.array([m.start() for m in _WORD_END.finditer(text) if m.start() >= min_chars], dtype=np.int64)
        if len(ends):
            cuts[i] = ends
    if not cuts:
        raise DataError(
            f"wikipedia_prefixes: no passage is longer than {min_passage_chars} characters with a word boundary "
            f"after {min_chars} characters; give longer passages."
        )
    capacity = sum(len(c) for c in cuts.values())
    if n > capacity:
        raise DataError(
            f"wikipedia_prefixes: asked for {n} prompts, but the passages allow only {capacity} distinct cuts."
        )
    rng = np.random.default_rng(seed)
    eligible = np.fromiter(cuts.keys(), dtype=np.int64)
    rows: list[tuple[str, int, str, int]] = []
    used: set[tuple[int, int]] = set()
    while len(rows) < n:
        for pid in rng.permutation(eligible):
            pid = int(pid)
            ends = cuts[pid]
            cut = int(ends[rng.integers(len(ends))])
            if (pid, cut) in used:
                continue
            used.add((pid, cut))
            text = texts[pid]
            rows.append((text[:cut], pid, text[cut:].split(maxsplit=1)[0], cut))
            if len(rows) == n:
                break
    return pd.DataFrame(rows, columns=["prompt", "passage_id", "next_word", "cut"])
