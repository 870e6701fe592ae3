"""Capture: the one place where depthkit runs a model with hooks.

Everything that reads or writes the residual stream goes through here:

* :func:`residual_hook_names`: the hook of every residual depth 0..L;
* :func:`collect_residuals` / :func:`residual_rows`: residual vectors at chosen
  depths and positions (optionally with one block's update removed);
* :func:`map_blocks`: each block's input, middle and output residual handed to a
  function as soon as the block has run, so only one block's residuals are alive;
* :func:`patched_final_residuals`: a run with a vector written into the residual
  stream at a layer and position.

The batches these runs take (:class:`Item`, padded and packed rows, shared
prefixes) are built in :mod:`depthkit.engine.batching`; its names are importable
from here too.
Layers follow :mod:`depthkit.lens.base`: depth 0 is the embedding output, depth ℓ the
input of block ℓ, depth L the final residual.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from depthkit.engine.attention import run_attention
from depthkit.engine.batching import (
    BATCH_OVERHEAD_TOKENS,
    PACK_WIDTH,
    Item,
    PrefixGroup,
    _device,
    _out_device,
    _sliding_window,
    batch_tensors,
    copy_attention_mask,
    length_batches,
    pack_rows,
    packed_attention_mask,
    packed_batches,
    packed_tensors,
    pad_id,
    shared_prefix_groups,
)
from depthkit.engine.prefix import SharedPrefix, encode_prefix

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

__all__ = [
    "BATCH_OVERHEAD_TOKENS",
    "PACK_WIDTH",
    "Item",
    "PrefixGroup",
    "batch_tensors",
    "check_layers",
    "collect_residuals",
    "copy_attention_mask",
    "length_batches",
    "map_blocks",
    "pack_rows",
    "packed_attention_mask",
    "packed_batches",
    "packed_tensors",
    "pad_id",
    "patched_final_residuals",
    "residual_hook_names",
    "residual_rows",
    "shared_prefix_groups",
]

T = TypeVar("T")


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
