"""How often each token of a tokenizer occurs in a corpus, and its most frequent
successor: the counts behind the frequency analyses and the down-weighted lenses.

Tokens are counted with the tokenizer's own ids over running text (default: the
embedded Wikipedia paragraphs), each passage encoded on its own, without special
tokens. Tables are cached as Parquet, keyed by a hash of the tokenizer and of the
corpus.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from jaxtyping import Int

# Functions here take a `cache_dir` argument, hence the other name.
from depthkit.core.files import atomic_path
from depthkit.core.files import cache_dir as default_cache_dir

__all__ = ["bigram_successors", "default_cache_dir", "token_frequencies"]

_FORMAT = 1  # bump when the cached tables' layout or counting rule changes


# ---------------------------------------------------------------- counting


def _tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of everything that decides how text is split into ids: the backend's
    full serialisation (vocabulary, merges, normaliser, pre-tokeniser) when the
    tokenizer has one, else its vocabulary."""
    h = hashlib.sha256()
    h.update(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode())
    h.update(str(len(tokenizer)).encode())
    return h.hexdigest()


def _corpus_fingerprint(texts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _texts(texts: Iterable[str] | None) -> list[str]:
    if texts is None:
        from depthkit.data.embedded import wikipedia_passages

        return wikipedia_passages()
    if isinstance(texts, str):
        raise TypeError("texts must be a list of passages, not one string; wrap it: texts=[text].")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is a {type(t).__name__}, not a string.")
    if not out:
        raise ValueError("texts is empty: give at least one passage to count tokens over.")
    return out


def _encode(tokenizer: Any, texts: Sequence[str], batch: int = 256) -> list[np.ndarray]:
    """Token ids of every passage, each encoded on its own without special tokens."""
    out: list[np.ndarray] = []
    for start in range(0, len(texts), batch):
        enc = tokenizer(list(texts[start : start + batch]), add_special_tokens=False)["input_ids"]
        out.extend(np.asarray(ids, dtype=np.int64) for ids in enc)
    return out


def _vocab_size(tokenizer: Any, ids: Sequence[np.ndarray]) -> int:
    largest = max((int(a.max()) for a in ids if len(a)), default=-1)
    return max(len(tokenizer), largest + 1)


def _cached(
    kind: str,
    tokenizer: Any,
    texts: Sequence[str],
    cache_dir: str | os.PathLike[str] | None,
    compute: Callable[[], pd.DataFrame],
    valid: Callable[[pd.DataFrame], bool],
) -> pd.DataFrame:
    key = hashlib.sha256(
        f"{kind}|{_FORMAT}|{_tokenizer_fingerprint(tokenizer)}|{_corpus_fingerprint(texts)}".encode()
    ).hexdigest()[:32]
    path = (
        (Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir())
        / "frequency"
        / f"{kind}-{key}.parquet"
    )
    if path.exists():
        try:
            frame = pd.read_parquet(path)
            if valid(frame):
                return frame
            problem = "its contents fail the consistency check"
        except Exception as e:  # noqa: BLE001 - a damaged file can fail in pyarrow in many ways
            problem = f"{type(e).__name__}: {e}"
        warnings.warn(f"The cached {kind} table {path} is damaged ({problem}); recomputing it.", stacklevel=3)
    frame = compute()
    try:
        with atomic_path(path) as tmp:
            frame.to_parquet(tmp, index=False, compression="zstd")
    except OSError as e:
        warnings.warn(
            f"Could not cache the {kind} table under {path.parent} ({e}); it will be recomputed next time.",
            stacklevel=3,
        )
    return frame


def token_frequencies(
    tokenizer: Any, texts: Iterable[str] | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> pd.DataFrame:
    """Counts of every token of ``tokenizer`` over ``texts`` (default: the embedded
    Wikipedia paragraphs, :func:`depthkit.data.embedded.wikipedia_passages`).

    Returns DataFrame[token_id, count, rank, share], one row per vocabulary entry
    (``len(tokenizer)``), ordered by token id (so ``freq.rank.to_numpy()[ids]`` looks
    ranks up). ``rank`` 1 is the most frequent token; equal counts are ranked by
    token id, so tokens never seen rank after all seen ones. ``share`` = count / all
    tokens counted. Cached under ``cache_dir`` (default :func:`default_cache_dir`)
    in ``frequency/``; a different tokenizer or corpus gets its own file.
    """
    corpus = _texts(texts)

    def compute() -> pd.DataFrame:
        ids = _encode(tokenizer, corpus)
        size = _vocab_size(tokenizer, ids)
        flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        counts = np.bincount(flat, minlength=size).astype(np.int64)
        return _frequency_frame(counts)

    def valid(frame: pd.DataFrame) -> bool:
        return (
            list(frame.columns) == ["token_id", "count", "rank", "share"]
            and len(frame) >= len(tokenizer)
            and np.array_equal(frame["token_id"].to_numpy(), np.arange(len(frame)))
            and np.array_equal(np.sort(frame["rank"].to_numpy()), np.arange(1, len(frame) + 1))
            and bool((frame["count"].to_numpy() >= 0).all())
        )

    return _cached("unigram", tokenizer, corpus, cache_dir, compute, valid)


def _frequency_frame(counts: Int[np.ndarray, " vocab"]) -> pd.DataFrame:
    size = len(counts)
    token_id = np.arange(size, dtype=np.int64)
    order = np.lexsort((token_id, -counts))  # by count descending, then token id
    rank = np.empty(size, dtype=np.int64)
    rank[order] = np.arange(1, size + 1)
    total = counts.sum()
    share = counts / total if total else np.zeros(size)
    return pd.DataFrame({"token_id": token_id, "count": counts, "rank": rank, "share": share})


# ---------------------------------------------------------------- bigrams


def bigram_successors(
    tokenizer: Any, texts: Iterable[str] | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> pd.DataFrame:
    """The most frequent next token after each token (a bigram guess baseline).

    Pairs are counted inside each passage (encoded as in :func:`token_frequencies`).
    Returns DataFrame[prev_id, next_id, count, total], one row per token that has a
    successor in the corpus, ordered by ``prev_id``: ``next_id`` its most frequent
    successor (ties: smallest id), ``count`` how often that pair occurs, ``total``
    how often ``prev_id`` is followed by anything. Cached like the unigram table.
    """
    corpus = _texts(texts)

    def compute() -> pd.DataFrame:
        ids = _encode(tokenizer, corpus)
        size = _vocab_size(tokenizer, ids)
        prev = np.concatenate([a[:-1] for a in ids]) if ids else np.zeros(0, dtype=np.int64)
        nxt = np.concatenate([a[1:] for a in ids]) if ids else np.zeros(0, dtype=np.int64)
        codes, counts = np.unique(prev * size + nxt, return_counts=True)
        p, q = codes // size, codes % size
        order = np.lexsort((q, -counts, p))
        p, q, counts = p[order], q[order], counts[order]
        first = np.r_[True, p[1:] != p[:-1]]
        totals = np.bincount(p, weights=counts, minlength=size).astype(np.int64)
        best_p = p[first]
        return pd.DataFrame(
            {"prev_id": best_p, "next_id": q[first], "count": counts[first].astype(np.int64), "total": totals[best_p]}
        )

    def valid(frame: pd.DataFrame) -> bool:
        return (
            list(frame.columns) == ["prev_id", "next_id", "count", "total"]
            and bool(frame["prev_id"].is_monotonic_increasing and frame["prev_id"].is_unique)
            and bool((frame["count"] >= 1).all() and (frame["count"] <= frame["total"]).all())
        )

    return _cached("bigram", tokenizer, corpus, cache_dir, compute, valid)
