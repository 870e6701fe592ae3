"""Batches of items: what one forward pass reads, and how items are laid out in it.

* :class:`Item`: one token sequence and the positions whose residuals count;
* :func:`length_batches` / :func:`batch_tensors`: right-padded batches (with an
  attention mask), items sorted by length so that little padding is needed;
* :func:`pack_rows` / :func:`packed_batches` / :func:`packed_tensors`: several
  items end to end in one row, each attending only to itself and counting its
  positions from 0, so that a batch of short prompts of mixed lengths computes
  almost no padding;
* :func:`shared_prefix_groups`: items grouped by the leading tokens they share, so
  that those run once;
* :func:`copy_attention_mask`: the mask of a run that reads copies of one token;
* :func:`masks_by_layer_type`: a pass's mask, one per layer type where a
  sliding-window layer hides some of its key positions.

Nothing here runs the model: :mod:`depthkit.engine.capture` does, with these.
Right padding with an attention mask: real tokens keep their positions and causal
attention never looks at the pads after them, so padding cannot change results.
Packed rows: every item counts its positions from 0 and sees only its own tokens,
so packing cannot either (beyond float summation order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from depthkit.engine.prefix import MIN_SHARED_TOKENS, common_prefix_length

if TYPE_CHECKING:
    from depthkit.engine.handle import Model


@dataclass
class Item:
    """One input sequence and what to read from it.

    ``positions``: token positions whose next-token prediction is decoded.
    ``targets``: name → one token id per position (e.g. ``{"gold": [...]}``).
    """

    tokens: list[int]
    positions: list[int]
    targets: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if n == 0:
            raise ValueError("An item has no tokens: the prompt is empty after tokenisation. Remove empty prompts.")
        for p in self.positions:
            if not 0 <= p < n:
                raise ValueError(f"Position {p} is outside a sequence of {n} tokens.")
        for name, ids in self.targets.items():
            if len(ids) != len(self.positions):
                raise ValueError(
                    f"Target {name!r} has {len(ids)} token ids for {len(self.positions)} positions; give one per position."
                )


def token_key(tokens: Sequence[int]) -> tuple[int, ...]:
    """A sequence as a dictionary key: its token ids, whatever their integer type
    (Python ints, numpy or tensor elements), so equal prompts meet under one key."""
    return tuple(int(t) for t in tokens)


def pad_id(model: Model) -> int:
    """The token id used for padding: the tokenizer's pad, else its EOS, else 0."""
    tok = model.tokenizer
    for v in (tok.pad_token_id, tok.eos_token_id, 0):
        if v is not None:
            return int(v)
    return 0


def _options(given: dict, allowed: dict) -> dict:
    """Keyword options with defaults; a misspelt one raises instead of being ignored."""
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise TypeError(f"Unknown option(s) {unknown}; valid: {', '.join(allowed)}.")
    return {**allowed, **given}


def _device(model: Model) -> torch.device:
    return model.backend.device


def _out_device(model: Model) -> torch.device:
    # With device_map the blocks may sit on several devices; residuals are gathered
    # where the readout (unembedding) lives, which is where they are decoded.
    return model.backend.out_device


# What one more forward call costs, in padded tokens' worth of compute (a pass over
# every block and hook regardless of the batch's size).
BATCH_OVERHEAD_TOKENS = 32


def length_batches(items: Sequence[Item] | Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    """Indices of ``items`` (or of token sequences) sorted by length, cut into
    batches of at most ``batch_size``: the cut that computes the fewest padded
    tokens, counting :data:`BATCH_OVERHEAD_TOKENS` for every batch. A long item then
    does not pad a whole batch of short ones to its length."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    size = [len(it.tokens) if isinstance(it, Item) else len(it) for it in items]
    order = sorted(range(len(items)), key=lambda i: size[i])
    lengths = np.array([size[i] for i in order], dtype=np.float64)
    # cost[j]: fewest padded tokens for the j shortest items; a batch ending at item
    # j - 1 pads to that item's length.
    cost = np.zeros(len(order) + 1)
    start = np.zeros(len(order) + 1, dtype=np.int64)
    for j in range(1, len(order) + 1):
        first = np.arange(max(0, j - batch_size), j)
        total = cost[first] + (j - first) * lengths[j - 1] + BATCH_OVERHEAD_TOKENS
        k = int(np.argmin(total))
        cost[j], start[j] = total[k], first[k]
    cuts, j = [], len(order)
    while j > 0:
        cuts.append((int(start[j]), j))
        j = int(start[j])
    return [order[a:b] for a, b in reversed(cuts)]


def batch_tensors(model: Model, items: Sequence[Item]):
    """Right-padded token ids, attention mask, and (batch, position) indices of the
    positions of interest, item by item."""
    device = _device(model)
    width = max(len(it.tokens) for it in items)
    tokens = torch.full((len(items), width), pad_id(model), dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    rows_b, rows_p = [], []
    for b, it in enumerate(items):
        tokens[b, : len(it.tokens)] = torch.tensor(it.tokens)
        mask[b, : len(it.tokens)] = 1
        rows_b += [b] * len(it.positions)
        rows_p += it.positions
    return (
        tokens.to(device),
        mask.to(device),
        torch.tensor(rows_b, device=device),
        torch.tensor(rows_p, device=device),
    )


# Tokens a packed row may hold when no item is longer. Wider rows waste more
# attention on the masked-out pairs between items: at most 4 * width * d_model
# FLOPs per token and block, against 2 * the block's parameters for its matrices
# (4 % more for SmolLM2-135M, 3 % for Gemma 3 270M, less for larger models).
PACK_WIDTH = 128


def pack_rows(lengths: Sequence[int], width: int) -> list[list[int]]:
    """Indices of items of ``lengths`` tokens grouped into rows of at most ``width``
    tokens: first fit, longest first (no item is split)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order:
        if lengths[i] > width:
            raise ValueError(f"An item of {lengths[i]} tokens does not fit a row of {width}.")
        for r, room in enumerate(free):
            if lengths[i] <= room:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(width - lengths[i])
    return rows


def packed_batches(items: Sequence[Item], batch_size: int) -> list[list[int]]:
    """Indices of ``items`` sorted by length, cut every ``batch_size`` items: packed
    rows (:func:`packed_tensors`) waste little on mixed lengths, so batches can be
    as large as allowed, and sorting keeps long items (wide rows) together."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    order = sorted(range(len(items)), key=lambda i: len(items[i].tokens))
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


def packed_attention_mask(segment: Int[Tensor, "row col"], position: Int[Tensor, "row col"], window: int | None = None) -> Tensor:
    """Boolean attention mask [row, 1, query, key] of packed rows: a token sees the
    earlier tokens of its own segment (``window``: only those fewer than
    ``window`` positions back, as a sliding-window layer does)."""
    col = torch.arange(segment.shape[1], device=segment.device)
    mask = (segment[:, :, None] == segment[:, None, :]) & (col[None, :] <= col[:, None])[None]
    if window is not None:
        mask &= (position[:, :, None] - position[:, None, :]) < window
    return mask[:, None]


def packed_tensors(model: Model, items: Sequence[Item], rows: list[list[int]] | None = None):
    """Items packed into rows (``rows`` from :func:`pack_rows`, by default rows
    ``max(PACK_WIDTH, longest item)`` tokens wide): token ids, position ids (from 0
    in every item), attention mask (:func:`packed_attention_mask`; a dict by layer
    type for models with sliding-window layers when a row is wider than the
    window), and the (row, column) indices of the positions of interest, item by
    item. Pads after the last item of a row are segments of their own."""
    device = _device(model)
    sizes = [len(it.tokens) for it in items]
    rows = pack_rows(sizes, max(PACK_WIDTH, *sizes)) if rows is None else rows
    n_cols = max(sum(sizes[i] for i in row) for row in rows)
    tokens = torch.full((len(rows), n_cols), pad_id(model), dtype=torch.long)
    position = torch.zeros((len(rows), n_cols), dtype=torch.long)
    # Pads get segment ids above every item's, one per column, so each sees itself only.
    segment = (len(items) + torch.arange(n_cols)).repeat(len(rows), 1)
    where = [(0, 0)] * len(items)
    for r, row in enumerate(rows):
        col = 0
        for i in row:
            n = sizes[i]
            tokens[r, col : col + n] = torch.tensor(items[i].tokens)
            position[r, col : col + n] = torch.arange(n)
            segment[r, col : col + n] = i
            where[i] = (r, col)
            col += n
    rows_b = [where[i][0] for i, it in enumerate(items) for _ in it.positions]
    rows_p = [where[i][1] + p for i, it in enumerate(items) for p in it.positions]
    return (
        tokens.to(device),
        position.to(device),
        masks_by_layer_type(model, n_cols, lambda window: packed_attention_mask(segment, position, window).to(device)),
        torch.tensor(rows_b, device=device),
        torch.tensor(rows_p, device=device),
    )


@dataclass
class PrefixGroup:
    """Items that share ``prefix`` (possibly empty): their indices in the input and
    the items with the prefix removed (positions shifted to match)."""

    prefix: list[int]
    indices: list[int]
    items: list[Item]


def shared_prefix_groups(items: Sequence[Item], min_shared: int = MIN_SHARED_TOKENS) -> list[PrefixGroup]:
    """Group ``items`` by the leading tokens they share (few-shot prompts of one task
    or subject share their demonstrations). A group's prefix holds no position that
    an item reads; items that share fewer than ``min_shared`` tokens with any other
    item form one group with an empty prefix."""
    order = sorted(range(len(items)), key=lambda i: items[i].tokens)
    runs: list[tuple[int, list[int]]] = []
    for i in order:
        it = items[i]
        limit = min(it.positions) if it.positions else 0
        if runs:
            n, members = runs[-1]
            first = items[members[0]].tokens
            k = min(n, limit, common_prefix_length([first, it.tokens]))
            if k >= max(1, min_shared):
                runs[-1] = (k, [*members, i])
                continue
        runs.append((limit, [i]))
    groups, alone = [], []
    for n, members in runs:
        if len(members) == 1:
            alone += members
            continue
        rest = [Item(items[i].tokens[n:], [p - n for p in items[i].positions], items[i].targets) for i in members]
        groups.append(PrefixGroup(list(items[members[0]].tokens[:n]), members, rest))
    if alone:
        alone.sort()
        groups.append(PrefixGroup([], alone, [items[i] for i in alone]))
    return groups


def copy_attention_mask(n_prefix: int, n_context: int, n_copies: int, window: int | None = None) -> Tensor:
    """Boolean attention mask [1, 1, query, key] of a run that continues ``n_prefix``
    cached tokens with ``n_context`` context tokens and ``n_copies`` copies of one
    more token: context tokens attend causally; every copy attends to the prefix, the
    context and itself, never to another copy. ``window``: a sliding-window layer's
    span (a query at position p sees keys at positions > p - window); its cache keeps
    only the last ``window - 1`` prefix tokens, and the key axis covers only those.
    """
    kept = n_prefix if window is None else min(n_prefix, window - 1)
    q = n_context + n_copies
    new = torch.zeros((q, q), dtype=torch.bool)
    new[:n_context, :n_context] = torch.ones((n_context, n_context), dtype=torch.bool).tril()
    new[n_context:, :n_context] = True
    new[n_context:, n_context:] = torch.eye(n_copies, dtype=torch.bool)
    mask = torch.cat([torch.ones((q, kept), dtype=torch.bool), new], 1)
    if window is not None:
        q_pos = torch.arange(q).clamp(max=n_context) + n_prefix
        k_pos = torch.cat([torch.arange(n_prefix - kept, n_prefix), q_pos])
        mask &= k_pos[None, :] > q_pos[:, None] - window
    return mask[None, None]


def masks_by_layer_type(model: Model, columns: int, mask: Callable[[int | None], Tensor]) -> Tensor | dict[str, Tensor]:
    """The attention mask of a pass whose tokens span ``columns`` positions, from
    ``mask(window)`` (``None``: no window): one mask, or for a model with
    sliding-window layers whose window is narrower than that span, one per layer
    type (Hugging Face's keys)."""
    window = _sliding_window(model)
    if window is None or columns <= window:
        return mask(None)
    return {"full_attention": mask(None), "sliding_attention": mask(window)}


def _sliding_window(model: Model) -> int | None:
    cfg = model.backend.config
    types = getattr(cfg, "layer_types", None) or ()
    window = getattr(cfg, "sliding_window", None)
    return int(window) if window and "sliding_attention" in types else None
