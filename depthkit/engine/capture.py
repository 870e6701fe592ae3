"""Capture: the one place where depthkit runs a model with hooks.

Everything that reads or writes the residual stream goes through here:

* :class:`Item`: one token sequence and the positions whose residuals count;
* :func:`batch_tensors` / :func:`length_batches`: right-padded batches (with an
  attention mask), items sorted by length so that little padding is needed;
* :func:`pack_rows` / :func:`packed_tensors`: several items end to end in one row,
  each attending only to itself and counting its positions from 0, so that a
  batch of short prompts of mixed lengths computes almost no padding;
* :func:`residual_hook_names`: the hook of every residual depth 0..L;
* :func:`collect_residuals` / :func:`residual_rows`: residual vectors at chosen
  depths and positions (optionally with one block's update removed);
* :func:`map_blocks`: each block's input, middle and output residual handed to a
  function as soon as the block has run, so only one block's residuals are alive;
* :func:`patched_final_residuals`: a run with a vector written into the residual
  stream at a layer and position.

Right padding with an attention mask: real tokens keep their positions and causal
attention never looks at the pads after them, so padding cannot change results. Packed rows:
every item counts its positions from 0 and sees only its own tokens, so packing
cannot either (beyond float summation order).
Layers follow :mod:`depthkit.lens.base`: depth 0 is the embedding output, depth ℓ the
input of block ℓ, depth L the final residual.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from depthkit.engine.attention import run_attention
from depthkit.engine.prefix import MIN_SHARED_TOKENS, SharedPrefix, common_prefix_length, encode_prefix

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

T = TypeVar("T")


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


def pad_id(model: Model) -> int:
    """The token id used for padding: the tokenizer's pad, else its EOS, else 0."""
    tok = model.tokenizer
    for v in (tok.pad_token_id, tok.eos_token_id, 0):
        if v is not None:
            return int(v)
    return 0


def _device(model: Model) -> torch.device:
    return next(model.bridge.parameters()).device


def _out_device(model: Model) -> torch.device:
    # With device_map the blocks may sit on several devices; residuals are gathered
    # where the readout (unembedding) lives, which is where they are decoded.
    return model.bridge.unembed.weight.device if hasattr(model.bridge.unembed, "weight") else _device(model)


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
    mask: Tensor | dict[str, Tensor] = packed_attention_mask(segment, position).to(device)
    window = _sliding_window(model)
    if window is not None and n_cols > window:
        mask = {"full_attention": mask, "sliding_attention": packed_attention_mask(segment, position, window).to(device)}
    return (
        tokens.to(device),
        position.to(device),
        mask,
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


def residual_hook_names(n_blocks: int) -> list[str]:
    """Hook names of the residual stream at depths 0..L."""
    return [f"blocks.{i}.hook_resid_pre" for i in range(n_blocks)] + [f"blocks.{n_blocks - 1}.hook_resid_post"]


def _options(given: dict, allowed: dict) -> dict:
    """Keyword options with defaults; a misspelt one raises instead of being ignored."""
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise TypeError(f"Unknown option(s) {unknown}; valid: {', '.join(allowed)}.")
    return {**allowed, **given}


def _run(
    model: Model, tokens: Tensor, mask: Tensor | dict[str, Tensor], hooks: list, prefix: SharedPrefix | None = None,
    position_ids: Tensor | None = None,
) -> None:  # fmt: skip
    # logits_to_keep=1: the model's full-sequence logits are never needed (readouts
    # are recomputed at the positions of interest) and would cost
    # batch x seq x vocab floats.
    with run_attention(model):
        if position_ids is not None:
            model.bridge.run_with_hooks(tokens, attention_mask=mask, position_ids=position_ids, fwd_hooks=hooks, logits_to_keep=1)
        elif prefix is None:
            model.bridge.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=hooks, logits_to_keep=1)
        else:
            model.bridge.run_with_hooks(
                tokens, attention_mask=prefix.mask_for(mask), cache=prefix.cache_for(len(tokens)), use_cache=True,
                fwd_hooks=hooks, logits_to_keep=1,
            )  # fmt: skip


def _skip_hooks(block: int) -> list:
    """Hooks that remove block ``block``'s update: its output is replaced by its input."""
    stash: dict[str, Tensor] = {}

    def save_in(x, hook):  # noqa: ARG001 - TransformerLens hook signature
        stash["h"] = x.clone()
        return x

    def drop_update(x, hook):  # noqa: ARG001
        return stash.pop("h")

    return [(f"blocks.{block}.hook_resid_pre", save_in), (f"blocks.{block}.hook_resid_post", drop_update)]


@torch.no_grad()
def collect_residuals(
    model: Model,
    items: Sequence[Item],
    layers: Sequence[int] | None = None,
    *,
    skip_block: int | None = None,
    prefix: SharedPrefix | None = None,
    pack: bool = False,
) -> Float[Tensor, "layer position d_model"]:
    """Residual vectors of one batch of items at their positions, for depths
    ``layers`` (default 0..L), as float32. Rows are ordered item by item, position
    by position.

    ``skip_block``: remove that block's update (``h_{b+1} := h_b``, the rest of the
    forward pass unchanged) before reading. ``prefix``: every item continues this
    already-run prefix; its tokens and positions count from the end of the prefix.
    ``pack``: lay the items end to end in rows (:func:`packed_tensors`) instead of
    one padded row each, where that puts two or more items in a row (long items
    alone in their rows gain nothing from a materialised mask); not with a prefix.
    """
    n_blocks = int(model.bridge.cfg.n_layers)
    layers = list(range(n_blocks + 1)) if layers is None else list(layers)
    names = residual_hook_names(n_blocks)
    out_device = _out_device(model)
    if pack and prefix is not None:
        raise ValueError("Packed rows cannot continue a shared prefix; pass pack=False.")
    position_ids = None
    sizes = [len(it.tokens) for it in items]
    rows = pack_rows(sizes, max(PACK_WIDTH, *sizes)) if pack else []
    if 0 < len(rows) < len(items):
        tokens, position_ids, mask, bi, pi = packed_tensors(model, items, rows)
    else:
        tokens, mask, bi, pi = batch_tensors(model, items)
    out: dict[int, Tensor] = {}

    def grab(depth: int):
        def hook(x, hook):  # noqa: ARG001 - TransformerLens hook signature
            out[depth] = x[bi.to(x.device), pi.to(x.device)].detach().float().to(out_device)
            return x

        return hook

    # Hooks run in registration order per name; a replacement must be registered
    # before the grab on the same hook point reads it.
    hooks = [] if skip_block is None else _skip_hooks(int(skip_block))
    hooks += [(names[d], grab(d)) for d in layers]
    _run(model, tokens, mask, hooks, prefix, position_ids)
    return torch.stack([out[d] for d in layers])


@torch.no_grad()
def residual_rows(
    model: Model,
    items: Sequence[Item],
    layers: Sequence[int] | None = None,
    *,
    batch_size: int = 8,
    share_prefix: bool = False,
    **bar: str | bool,
) -> Float[Tensor, "layer position d_model"]:
    """:func:`collect_residuals` over any number of items, in batches of
    ``batch_size``; rows item by item, in the given order. ``share_prefix``: items
    that share leading tokens run them once (:func:`shared_prefix_groups`); else
    batches are taken in the given order. ``bar``: ``desc`` and ``progress`` of the
    progress bar (off by default)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    n_blocks, d = int(model.bridge.cfg.n_layers), int(model.bridge.cfg.d_model)
    depths = list(range(n_blocks + 1)) if layers is None else list(layers)
    starts = np.cumsum([0] + [len(it.positions) for it in items])
    out = torch.empty(len(depths), int(starts[-1]), d, device=_out_device(model))
    bar = _options(bar, {"desc": "residuals", "progress": False})
    pbar = tqdm(total=int(starts[-1]), desc=str(bar["desc"]), unit="tok", disable=not bar["progress"], leave=False)
    groups = shared_prefix_groups(items) if share_prefix else [PrefixGroup([], list(range(len(items))), list(items))]
    for group in groups:
        prefix = encode_prefix(model, group.prefix) if group.prefix else None
        batches = length_batches(group.items, batch_size) if share_prefix else [
            list(range(s, min(s + batch_size, len(group.items)))) for s in range(0, len(group.items), batch_size)
        ]
        for local in batches:
            r = collect_residuals(model, [group.items[j] for j in local], depths, prefix=prefix)
            rows = torch.cat([torch.arange(starts[group.indices[j]], starts[group.indices[j] + 1]) for j in local])
            out[:, rows.to(out.device)] = r
            pbar.update(r.shape[1])
    pbar.close()
    return out


@torch.no_grad()
def map_blocks(model: Model, items: Sequence[Item], fn: Callable[[int, Tensor, Tensor, Tensor], T]) -> list[T]:
    """One forward pass of a batch of items; for every block ``b``, as soon as it has
    run, ``fn(b, h_pre, h_mid, h_post)`` with its input, middle (between attention
    and MLP, ``hook_resid_mid``) and output residuals at the positions of interest
    (float32, rows item by item). Returns the results block by block; only one
    block's residuals are alive at a time."""
    n_blocks = int(model.bridge.cfg.n_layers)
    tokens, mask, bi, pi = batch_tensors(model, items)
    held: dict[str, Tensor] = {}
    results: dict[int, T] = {}

    def keep(key: str):
        def hook(x, hook):  # noqa: ARG001 - TransformerLens hook signature
            held[key] = x[bi, pi].detach().float()
            return x

        return hook

    def finish(block: int):
        def hook(x, hook):  # noqa: ARG001
            results[block] = fn(block, held.pop("pre"), held.pop("mid"), x[bi, pi].detach().float())
            return x

        return hook

    hooks = []
    for b in range(n_blocks):
        hooks += [
            (f"blocks.{b}.hook_resid_pre", keep("pre")),
            (f"blocks.{b}.hook_resid_mid", keep("mid")),
            (f"blocks.{b}.hook_resid_post", finish(b)),
        ]
    _run(model, tokens, mask, hooks)
    if len(results) != n_blocks:
        raise RuntimeError(
            f"Only {len(results)} of {n_blocks} blocks reported their residuals; this architecture's bridge does not "
            "populate hook_resid_pre/mid/post on every block."
        )
    return [results[b] for b in range(n_blocks)]


def check_layers(layers: Sequence[int], n_blocks: int) -> list[int]:
    """``layers`` as ints, each a residual depth 0..L (raises otherwise)."""
    out = [int(l) for l in layers]
    bad = [l for l in out if not 0 <= l <= n_blocks]
    if bad:
        raise ValueError(f"Layers {bad} are outside 0..{n_blocks} (0 = embeddings, {n_blocks} = final residual).")
    return out


@torch.no_grad()
def patched_final_residuals(
    model: Model, sequences: Sequence[Sequence[int]], layers: Sequence[int], vectors: Float[Tensor, "row d_model"], **run: int | bool
) -> Float[Tensor, "row d_model"]:
    """The final residual at the last position of each sequence after writing
    ``vectors[r]`` into the residual stream of ``sequences[r]`` at depth
    ``layers[r]`` (last position), as float32. Rows are independent; results keep
    the input order. A patch at depth L is what comes out. ``run``: ``batch_size``
    (patched rows of one target per forward pass, 64) and ``progress`` (off).

    A patch at the last position cannot change any earlier position (attention is
    causal). So targets that share leading tokens (few-shot demonstrations) run
    them once (:func:`shared_prefix_groups`), each target then runs the rest of its
    context once, and all of its patched rows ride along in that same pass as
    extra copies of its last token: every copy sits at the last token's position,
    sees the context and itself but no other copy (:func:`copy_attention_mask`),
    and is patched at its own depth.
    """
    n = len(sequences)
    if not (len(layers) == n == vectors.shape[0]):
        raise ValueError(
            f"Give one layer and one vector per target: {n} targets, {len(layers)} layers, {vectors.shape[0]} vectors."
        )
    n_blocks = int(model.bridge.cfg.n_layers)
    layers = check_layers(layers, n_blocks)
    names = residual_hook_names(n_blocks)
    out = torch.empty((n, int(model.bridge.cfg.d_model)), dtype=torch.float32, device=_out_device(model))
    run = _options(run, {"batch_size": 64, "progress": False})
    rows_of: dict[tuple[int, ...], list[int]] = {}
    for r, seq in enumerate(sequences):
        if len(seq) == 0:
            raise ValueError(f"Target {r} has no tokens; remove empty prompts.")
        rows_of.setdefault(tuple(int(t) for t in seq), []).append(r)
    targets = [Item(list(seq), [len(seq) - 1]) for seq in rows_of]
    bar = tqdm(total=n, desc="patching", unit="run", disable=not run["progress"], leave=False)
    for group in shared_prefix_groups(targets):
        prefix = encode_prefix(model, group.prefix) if group.prefix else None
        for i, rest in zip(group.indices, group.items):
            rows = rows_of[tuple(targets[i].tokens)]
            for s in range(0, len(rows), int(run["batch_size"])):
                chunk = rows[s : s + int(run["batch_size"])]
                out[chunk] = _patch_copies(model, rest.tokens, [layers[r] for r in chunk], vectors[chunk], prefix, names)
                bar.update(len(chunk))
    bar.close()
    return out


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


def _sliding_window(model: Model) -> int | None:
    cfg = model.bridge.original_model.config
    types = getattr(cfg, "layer_types", None) or ()
    window = getattr(cfg, "sliding_window", None)
    return int(window) if window and "sliding_attention" in types else None


def _patch_copies(
    model: Model, tokens: list[int], layers: list[int], vec: Float[Tensor, "row d_model"], prefix: SharedPrefix | None, names: list[str]
) -> Float[Tensor, "row d_model"]:
    """Final residuals of ``tokens[-1]`` continuing ``prefix`` + ``tokens[:-1]``, once
    per row, row r patched at depth ``layers[r]`` (see :func:`patched_final_residuals`)."""
    device = _device(model)
    n_prefix = prefix.length if prefix is not None else 0
    context, n_copies = tokens[:-1], len(layers)
    ids = torch.tensor([context + [tokens[-1]] * n_copies], dtype=torch.long, device=device)
    position = torch.arange(n_prefix, n_prefix + len(context) + 1, device=device)
    position_ids = torch.cat([position[:-1], position[-1:].expand(n_copies)])[None]
    mask = copy_attention_mask(n_prefix, len(context), n_copies).to(device)
    window = _sliding_window(model)
    if window is not None and n_prefix + len(context) + 1 > window:
        # Models with sliding-window layers take one mask per layer type.
        mask = {"full_attention": mask, "sliding_attention": copy_attention_mask(n_prefix, len(context), n_copies, window).to(device)}
    at = np.array(layers)
    vec = vec.to(device=device)
    n_blocks = len(names) - 1
    final: dict[str, Tensor] = {}

    def hook_for(depth: int):
        rows = np.flatnonzero(at == depth)
        sel = torch.tensor(rows, device=device, dtype=torch.long)

        def hook(x, hook):  # noqa: ARG001 - TransformerLens hook signature
            if len(rows):
                x = x.clone()
                x[0, len(context) + sel] = vec[sel].to(x.dtype)
            if depth == n_blocks:
                # The patch (if any) comes first, so a layer-L patch is what is read out.
                final["h"] = x[0, len(context) :].float()
            return x

        return hook

    hooks = [(names[d], hook_for(d)) for d in sorted(set(layers) | {n_blocks})]
    options = {"attention_mask": mask, "position_ids": position_ids, "fwd_hooks": hooks, "logits_to_keep": 1}
    with run_attention(model):
        if prefix is None:
            model.bridge.run_with_hooks(ids, **options)
        else:
            model.bridge.run_with_hooks(ids, cache=prefix.cache_for(1), use_cache=True, **options)
    return final["h"].to(_out_device(model))
