"""Kept contexts: a prompt's key/value states from one run, for a later run that
continues it.

A patching sweep writes into the last position of a target prompt only, so every
earlier position of the target is what its unpatched run computed (attention is
causal). When that unpatched run has already happened (chapter 02 reads every
prompt through the lens first), its keys and values at those positions can be kept
and the patched runs then feed only copies of the last token
(:func:`depthkit.engine.capture.patched_final_residuals`).

* :class:`KeptContext`: all tokens of a prompt but its last, as a shared prefix's
  cache (or none) and the prompt's own key/value states after it;
* :class:`ContextKeeper`: what a pass asks before keeping a prompt's states, and
  whom it gives them to (:class:`depthkit.analyses.patching.CleanRuns`);
* :func:`can_keep`: whether this model's runs can hand their states out;
* :func:`contexts_of_run`: the kept contexts of one batched pass, cut from its cache;
* :func:`context_batch`: several kept contexts as one cache (a :class:`ContextBatch`),
  for one pass that continues each in its own row.

A sliding-window layer's cache drops positions older than its window, so its
columns no longer line up with the prompt's tokens: a model with such layers keeps
the contexts of passes shorter than the window only, and runs its other patched
targets' context again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from depthkit.engine.batching import Item, _sliding_window
from depthkit.engine.prefix import SharedPrefix

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

# The key under which a backend returns the key/value cache of a pass that asked to keep it.
CACHE = ":cache"


@dataclass
class KeptContext:
    """A ``prompt`` without its last token as key/value states: the cache of a shared
    ``prefix`` (its leading tokens) or none, and per layer the prompt's own
    ``(keys, values)`` after it, each ``[1, kv_heads, own tokens, head_dim]``."""

    prompt: list[int]
    prefix: SharedPrefix | None
    own: list[tuple[Tensor, Tensor]]

    @property
    def own_bytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.own)

    def states(self, layer: int) -> tuple[Tensor, Tensor]:
        """Keys and values of every context token at ``layer``, ``[1, kv_heads, tokens, head_dim]``."""
        k, v = self.own[layer]
        if self.prefix is None:
            return k, v
        cached = self.prefix.cache.layers[layer]
        return torch.cat([cached.keys, k], 2), torch.cat([cached.values, v], 2)


@dataclass
class ContextBatch:
    """Several kept contexts as one cache, one row each, padded on the right to the
    longest; ``lengths``: where each row's context ends (the columns after it are
    padding, to be masked out)."""

    cache: Any
    lengths: list[int]

    @property
    def length(self) -> int:
        return max(self.lengths)

    def cache_for(self, batch: int) -> Any:
        """The cache, for a pass of one row per context (it is used once, so not copied)."""
        if batch != len(self.lengths):
            raise ValueError(f"A batch of {len(self.lengths)} contexts continues {len(self.lengths)} rows, not {batch}.")
        return self.cache


def empty_cache() -> Any:
    """A fresh Hugging Face key/value cache, for a pass that keeps its states."""
    from transformers import DynamicCache  # the import costs seconds; most runs never need it

    return DynamicCache()


def context_batch(contexts: Sequence[KeptContext]) -> ContextBatch:
    """``contexts`` as one :class:`ContextBatch`, in their order."""
    lengths = [len(c.prompt) - 1 for c in contexts]
    cache = empty_cache()
    for layer in range(len(contexts[0].own)):
        parts = [c.states(layer) for c in contexts]
        k0 = parts[0][0]
        keys = k0.new_zeros((len(parts), k0.shape[1], max(lengths), k0.shape[3]))
        values = keys.clone()
        for row, ((k, v), n) in enumerate(zip(parts, lengths)):
            keys[row, :, :n], values[row, :, :n] = k[0], v[0]
        cache.update(keys, values, layer)
    return ContextBatch(cache, lengths)


class ContextKeeper(Protocol):
    def wants_context(self, tokens: Sequence[int]) -> bool:
        """Whether to keep the context of the prompt ``tokens`` (the whole prompt)."""
        ...

    def keep_context(self, context: KeptContext) -> None: ...


def can_keep(model: Model, columns: int | None = None) -> bool:
    """Whether ``model``'s passes (of ``columns`` key positions, a continued prefix
    included) can hand out their key/value states for later runs. A model with
    sliding-window layers can when a pass is shorter than the window: then no
    layer has dropped a position, and a later run's last token still sees every
    context token, as those layers would let it."""
    if not getattr(model.backend, "keeps_cache", False):
        return False
    window = _sliding_window(model)
    return window is None or (columns is not None and columns < window)


def contexts_of_run(
    cache: Any, items: Sequence[Item], wanted: Sequence[int], rows: Tensor, columns: Tensor, prefix: SharedPrefix | None
) -> list[KeptContext]:
    """The contexts of ``items[i]`` for ``i`` in ``wanted``, from the ``cache`` of a pass
    over ``items`` (continuing ``prefix``, if any). ``rows``/``columns``: where each
    item's read positions sat in the pass, item by item (its last token must be
    one). The states are copied, so the pass's cache can go."""
    first_read = [0]
    for it in items:
        first_read.append(first_read[-1] + len(it.positions))
    offset = prefix.length if prefix is not None else 0
    out = []
    for i in wanted:
        it = items[i]
        last = len(it.tokens) - 1
        k = first_read[i] + it.positions.index(last)
        row, stop = int(rows[k]), offset + int(columns[k])
        start = stop - last
        own = [(layer.keys[row : row + 1, :, start:stop].clone(), layer.values[row : row + 1, :, start:stop].clone())
               for layer in cache.layers]
        out.append(KeptContext((prefix.tokens if prefix is not None else []) + list(it.tokens), prefix, own))
    return out
