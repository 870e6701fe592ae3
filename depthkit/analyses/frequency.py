"""Frequency buckets: where a token's frequency rank puts it.

The paper's first analysis asks whether a lens's early top-1 guesses are the most
frequent tokens of the language. The counts come from
:mod:`depthkit.data.token_counts` (re-exported here); this module ranks tokens and
groups them into buckets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from jaxtyping import Int

from depthkit.data.token_counts import bigram_successors, default_cache_dir, token_frequencies

__all__ = [
    "BUCKETS",
    "bigram_successors",
    "bucket_of",
    "bucket_of_mass",
    "corpus_share_of_top",
    "default_cache_dir",
    "equal_mass_buckets",
    "mass_bucket_labels",
    "ranks_of",
    "token_frequencies",
]

BUCKETS: tuple[str, ...] = ("Top 1-10", "11-100", "101-1000", "rest")
_BUCKET_UPPER = (10, 100, 1000)


def ranks_of(freq: pd.DataFrame, token_ids: Sequence[int] | np.ndarray) -> Int[np.ndarray, " n"]:
    """Frequency ranks of token ids. Ids beyond the table (a model whose unembedding
    has more rows than its tokenizer has tokens) were never seen: they get rank
    ``len(freq) + 1``, i.e. the last bucket."""
    ids = np.asarray(token_ids, dtype=np.int64)
    if (ids < 0).any():
        raise ValueError("Token ids must be >= 0.")
    if not np.array_equal(freq["token_id"].to_numpy(), np.arange(len(freq))):
        raise ValueError("freq must hold one row per token id 0..V-1 in order, as token_frequencies returns.")
    table = freq["rank"].to_numpy()
    out = np.full(ids.shape, len(table) + 1, dtype=np.int64)
    inside = ids < len(table)
    out[inside] = table[ids[inside]]
    return out


# ---------------------------------------------------------------- buckets


def _check_ranks(ranks: Any) -> np.ndarray:
    r = np.asarray(ranks)
    if r.dtype == object or not np.issubdtype(r.dtype, np.number):
        raise TypeError(f"ranks must be numbers, got an array of {r.dtype}.")
    if np.isnan(r.astype(float)).any():
        raise ValueError("ranks contain NaN; look the ranks up for every token first (ranks_of).")
    if (r < 1).any():
        raise ValueError(f"ranks start at 1; got {r.min()}.")
    return r


def bucket_of(ranks: Any) -> np.ndarray:
    """The paper's frequency bucket of each rank: "Top 1-10", "11-100", "101-1000" or
    "rest" (:data:`BUCKETS`)."""
    r = _check_ranks(ranks)
    return np.select([r <= u for u in _BUCKET_UPPER], BUCKETS[:-1], BUCKETS[-1]).astype(object)


def equal_mass_buckets(freq: pd.DataFrame, n: int = 4) -> Int[np.ndarray, " n_plus_1"]:
    """Rank edges of ``n`` buckets holding (about) equal shares of the corpus.

    Returns ``edges`` of length n+1: bucket k (1..n) holds ranks ``edges[k-1]+1 ..
    edges[k]``, where ``edges[k]`` is the smallest rank whose cumulative share
    reaches k/n (exact integer arithmetic on counts), ``edges[0] = 0`` and
    ``edges[n] = len(freq)``. When one token alone holds more than 1/n of the
    corpus, edges are pushed apart so that no bucket is empty (that bucket then
    holds more than 1/n).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= len(freq):
        raise ValueError(f"n must be an integer between 1 and the vocabulary size {len(freq)}, got {n!r}.")
    counts = freq.sort_values("rank")["count"].to_numpy(dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        raise ValueError("The frequency table counts no tokens; count over a non-empty corpus first.")
    cumulative = np.cumsum(counts)
    edges = np.zeros(n + 1, dtype=np.int64)
    for k in range(1, n):
        # smallest rank r with cumulative[r-1] * n >= k * total
        edges[k] = max(int(np.searchsorted(cumulative * n, k * total, side="left")) + 1, edges[k - 1] + 1)
    edges[n] = max(len(freq), edges[n - 1] + 1)
    return edges


def mass_bucket_labels(edges: Sequence[int] | np.ndarray) -> tuple[str, ...]:
    """Labels of equal-mass buckets, e.g. ("Top 1-9", "10-150", "151-3000", "3001+")."""
    e = [int(x) for x in edges]
    labels = []
    for k in range(1, len(e)):
        lo, hi = e[k - 1] + 1, e[k]
        if k == len(e) - 1:
            labels.append(f"{lo}+" if k > 1 else "all")
        elif k == 1:
            labels.append(f"Top 1-{hi}")
        else:
            labels.append(f"{lo}-{hi}")
    return tuple(labels)


def bucket_of_mass(ranks: Any, edges: Sequence[int] | np.ndarray) -> np.ndarray:
    """The equal-mass bucket label (:func:`mass_bucket_labels`) of each rank; ranks
    beyond the last edge fall in the last bucket."""
    r = _check_ranks(ranks)
    e = np.asarray(edges, dtype=np.int64)
    if len(e) < 2 or e[0] != 0 or (np.diff(e) <= 0).any():
        raise ValueError(f"edges must start at 0 and increase, as equal_mass_buckets returns; got {list(e)}.")
    labels = np.asarray(mass_bucket_labels(e), dtype=object)
    index = np.searchsorted(e[1:-1], r, side="left")  # rank == edge belongs to the lower bucket
    return labels[index]


def corpus_share_of_top(freq: pd.DataFrame, ks: Sequence[int] = (10, 100, 1000)) -> pd.DataFrame:
    """Share of all corpus tokens that are one of the ``k`` most frequent tokens:
    DataFrame[top_k, share]. (The paper reports 23 / 47 / 69 % for the Llama-2
    tokenizer on Wikipedia.)"""
    counts = freq.sort_values("rank")["count"].to_numpy(dtype=np.int64)
    total = counts.sum()
    if total == 0:
        raise ValueError("The frequency table counts no tokens.")
    cumulative = np.cumsum(counts)
    rows = []
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"ks must be positive integers, got {k!r}.")
        rows.append((int(k), float(cumulative[min(int(k), len(counts)) - 1] / total)))
    return pd.DataFrame(rows, columns=["top_k", "share"])
