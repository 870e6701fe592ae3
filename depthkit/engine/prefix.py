"""Shared prefixes: compute the tokens that many runs have in common once.

Few-shot prompts repeat the same demonstrations before every question, and a
patching sweep runs one target prompt once per layer with only its last position
changed. Both spend most of their time on tokens whose residuals cannot differ
between the runs (attention is causal). Here such a prefix runs once, keeping the
model's key/value cache (Hugging Face's own cache object, through the backend);
later runs feed only their suffix tokens, attending to the cached prefix.

* :func:`common_prefix_length`: how many leading tokens a set of sequences shares;
* :func:`encode_prefix`: one run of the prefix, returning a :class:`SharedPrefix`;
* :meth:`SharedPrefix.cache_for`: a fresh copy of the cache for a batch of suffixes
  (the forward pass appends to the cache it is given, so every run needs its own).

Residuals read after a cached run are those of the suffix positions only, equal
(to float rounding) to the same positions of the uncached run; the tests check
this on a tiny model of every family and on the embedded model.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

# Below this many shared tokens, one more forward call costs more than it saves.
MIN_SHARED_TOKENS = 16


@dataclass
class SharedPrefix:
    """The key/value cache after running ``tokens`` (batch of one)."""

    tokens: list[int]
    cache: Any

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """Bytes of the cached keys and values."""
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.cache.layers)

    def cache_for(self, batch: int) -> Any:
        """A copy of the cache repeated ``batch`` times along the batch axis."""
        out = copy.deepcopy(self.cache)
        if batch > 1:
            out.batch_repeat_interleave(batch)
        return out

    def mask_for(self, suffix_mask: torch.Tensor) -> torch.Tensor:
        """The attention mask of prefix + suffix: the prefix is real tokens in every row."""
        ones = torch.ones((suffix_mask.shape[0], self.length), dtype=suffix_mask.dtype, device=suffix_mask.device)
        return torch.cat([ones, suffix_mask], 1)


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Number of leading tokens shared by every sequence."""
    if not sequences:
        return 0
    first = sequences[0]
    n = min(len(s) for s in sequences)
    for s in sequences[1:]:
        k = 0
        while k < n and s[k] == first[k]:
            k += 1
        n = k
        if n == 0:
            break
    return n


@torch.no_grad()
def encode_prefix(model: Model, tokens: Sequence[int]) -> SharedPrefix:
    """Run ``tokens`` once and keep the cache for later suffix runs."""
    ids = [int(t) for t in tokens]
    if not ids:
        raise ValueError("A shared prefix needs at least one token.")
    x = torch.tensor([ids], device=model.backend.device)
    cache = model.backend.encode_prefix(x)
    if cache is None:
        raise RuntimeError(f"{model.info.name} returned no key/value cache; run without a shared prefix.")
    return SharedPrefix(ids, cache)
