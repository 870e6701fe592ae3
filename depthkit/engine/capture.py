"""Capture: the one place where depthkit reads or writes the residual stream.

Each function here says what a forward pass must do as a
:class:`~depthkit.engine.work.ForwardWork` and hands it to the model's backend
(:mod:`depthkit.engine.backends`: TransformerLens hooks or an nnsight trace), so
every analysis runs unchanged on either. What goes through here:

* :func:`residual_hook_names`: the hook of every residual depth 0..L;
* :func:`collect_residuals` / :func:`residual_rows`: residual vectors at chosen
  depths and positions (optionally with one block's update removed);
* :func:`map_blocks`: each block's input, middle and output residual handed to a
  function as soon as the block has run, so only one block's residuals are alive;
* :func:`patched_final_residuals`: a run with a vector written into the residual
  stream at a layer and position;
* :func:`truncated_residuals` / :func:`model_logits`: a pass that stops at a depth,
  and the model's own logits.

The batches these runs take (:class:`Item`, padded and packed rows, shared
prefixes) are built in :mod:`depthkit.engine.batching`; its names are importable
from here too.
Layers follow :mod:`depthkit.lens.base`: depth 0 is the embedding output, depth ℓ the
input of block ℓ, depth L the final residual.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

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
    token_key,
)
from depthkit.engine.prefix import SharedPrefix, encode_prefix
from depthkit.engine.work import WHERE, Call, ForwardWork, depth_site

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
    "block_maps",
    "map_blocks",
    "model_logits",
    "pack_rows",
    "packed_attention_mask",
    "packed_batches",
    "packed_tensors",
    "pad_id",
    "patched_final_residuals",
    "residual_hook_names",
    "residual_batches",
    "residual_rows",
    "residual_runs",
    "shared_prefix_groups",
    "truncated_residuals",
    "truncated_runs",
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
    (out,) = residual_batches(model, [items], layers, skip_block=skip_block, prefix=prefix, pack=pack)
    return out


@torch.no_grad()
def residual_batches(
    model: Model,
    batches: Sequence[Sequence[Item]],
    layers: Sequence[int] | None = None,
    *,
    skip_block: int | None = None,
    prefix: SharedPrefix | None = None,
    pack: bool = False,
) -> Iterator[Float[Tensor, "layer position d_model"]]:
    """:func:`collect_residuals` of each batch, in order, as they are read: one
    forward pass each, which a remote backend sends several to a request."""
    return residual_runs(model, [(items, skip_block) for items in batches], layers, prefix=prefix, pack=pack)


@torch.no_grad()
def residual_runs(
    model: Model,
    runs: Sequence[tuple[Sequence[Item], int | None]],
    layers: Sequence[int] | None = None,
    *,
    prefix: SharedPrefix | None = None,
    pack: bool = False,
) -> Iterator[Float[Tensor, "layer position d_model"]]:
    """:func:`collect_residuals` of each ``(items, skip_block)`` run, in order, as
    they are read (a run with a block number removes that block's update)."""
    layers = list(range(model.info.n_blocks + 1)) if layers is None else list(layers)
    if pack and prefix is not None:
        raise ValueError("Packed rows cannot continue a shared prefix; pass pack=False.")
    calls = [_residual_call(model, items, layers, skip, prefix, pack) for items, skip in runs]
    for got in model.backend.execute_all(calls):
        yield torch.stack([got[str(d)] for d in layers])


def _residual_call(
    model: Model, items: Sequence[Item], layers: list[int], skip_block: int | None, prefix: SharedPrefix | None, pack: bool
) -> Call:
    n_blocks = model.info.n_blocks
    position_ids = None
    sizes = [len(it.tokens) for it in items]
    rows = pack_rows(sizes, max(PACK_WIDTH, *sizes)) if pack else []
    if 0 < len(rows) < len(items):
        tokens, position_ids, mask, bi, pi = packed_tensors(model, items, rows)
    else:
        tokens, mask, bi, pi = batch_tensors(model, items)
    work = ForwardWork()
    if skip_block is not None:
        work.skip(int(skip_block))
    for d in dict.fromkeys(layers):
        work.read(str(d), depth_site(d, n_blocks), bi, pi)
    if prefix is not None:
        mask = prefix.mask_for(mask)
    return Call(tokens, mask, work, position_ids, prefix)


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
    n_blocks, d = model.info.n_blocks, model.info.d_model
    depths = list(range(n_blocks + 1)) if layers is None else list(layers)
    starts = np.cumsum([0] + [len(it.positions) for it in items])
    out = torch.empty(len(depths), int(starts[-1]), d, device=_out_device(model))
    bar = _options(bar, {"desc": "residuals", "progress": False})
    pbar = tqdm(total=int(starts[-1]), desc=str(bar["desc"]), unit="tok", disable=not bar["progress"], leave=False)
    share_prefix = share_prefix and model.backend.supports_prefix
    groups = shared_prefix_groups(items) if share_prefix else [PrefixGroup([], list(range(len(items))), list(items))]
    for group in groups:
        prefix = encode_prefix(model, group.prefix) if group.prefix else None
        batches = (
            length_batches(group.items, batch_size)
            if share_prefix
            else [list(range(s, min(s + batch_size, len(group.items)))) for s in range(0, len(group.items), batch_size)]
        )
        reads = residual_batches(model, [[group.items[j] for j in local] for local in batches], depths, prefix=prefix)
        for local, r in zip(batches, reads):
            rows = torch.cat([torch.arange(starts[group.indices[j]], starts[group.indices[j] + 1]) for j in local])
            out[:, rows.to(out.device)] = r
            pbar.update(r.shape[1])
    pbar.close()
    return out


@torch.no_grad()
def map_blocks(model: Model, items: Sequence[Item], fn: Callable[[int, Tensor, Tensor, Tensor], T]) -> list[T]:
    """One forward pass of a batch of items; for every block ``b``,
    ``fn(b, h_pre, h_mid, h_post)`` with its input, middle (between attention and
    MLP, ``hook_resid_mid``) and output residuals at the positions of interest
    (float32, rows item by item). Returns the results block by block. The pass
    reads every block's three residuals at those positions (3·L·rows vectors), and
    each block's are freed once ``fn`` has used them."""
    (out,) = block_maps(model, [items], fn)
    return out


@torch.no_grad()
def block_maps(
    model: Model, batches: Sequence[Sequence[Item]], fn: Callable[[int, Tensor, Tensor, Tensor], T]
) -> Iterator[list[T]]:
    """:func:`map_blocks` of each batch, in order, as they are read."""
    n_blocks = model.info.n_blocks
    calls = []
    for items in batches:
        tokens, mask, bi, pi = batch_tensors(model, items)
        work = ForwardWork()
        for b in range(n_blocks):
            for where in WHERE:
                work.read(f"{b}.{where}", (b, where), bi, pi)
        calls.append(Call(tokens, mask, work))
    for got in model.backend.execute_all(calls):
        yield [fn(b, got.pop(f"{b}.pre"), got.pop(f"{b}.mid"), got.pop(f"{b}.post")) for b in range(n_blocks)]


def check_layers(layers: Sequence[int], n_blocks: int) -> list[int]:
    """``layers`` as ints, each a residual depth 0..L (raises otherwise)."""
    out = [int(l) for l in layers]
    bad = [l for l in out if not 0 <= l <= n_blocks]
    if bad:
        raise ValueError(f"Layers {bad} are outside 0..{n_blocks} (0 = embeddings, {n_blocks} = final residual).")
    return out


@torch.no_grad()
def patched_final_residuals(
    model: Model,
    sequences: Sequence[Sequence[int]],
    layers: Sequence[int],
    vectors: Float[Tensor, "row d_model"],
    **run: int | bool,
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
    n_blocks = model.info.n_blocks
    layers = check_layers(layers, n_blocks)
    out = torch.empty((n, model.info.d_model), dtype=torch.float32, device=_out_device(model))
    run = _options(run, {"batch_size": 64, "progress": False})
    rows_of: dict[tuple[int, ...], list[int]] = {}
    for r, seq in enumerate(sequences):
        if len(seq) == 0:
            raise ValueError(f"Target {r} has no tokens; remove empty prompts.")
        rows_of.setdefault(token_key(seq), []).append(r)
    targets = [Item(list(seq), [len(seq) - 1]) for seq in rows_of]
    rows_of_target = list(rows_of.values())  # in the order of ``targets``
    bar = tqdm(total=n, desc="patching", unit="run", disable=not run["progress"], leave=False)
    groups = (
        shared_prefix_groups(targets) if model.backend.supports_prefix else [PrefixGroup([], list(range(len(targets))), targets)]
    )
    for group in groups:
        prefix = encode_prefix(model, group.prefix) if group.prefix else None
        chunks = []
        for i, rest in zip(group.indices, group.items):
            rows = rows_of_target[i]
            size = int(run["batch_size"])
            chunks += [(rest.tokens, rows[s : s + size]) for s in range(0, len(rows), size)]
        calls = [_patch_call(model, tokens, [layers[r] for r in chunk], vectors[chunk], prefix) for tokens, chunk in chunks]
        for (_, chunk), got in zip(chunks, model.backend.execute_all(calls)):
            out[chunk] = got["final"].to(out.device)
            bar.update(len(chunk))
    bar.close()
    return out


def _patch_call(
    model: Model, tokens: list[int], layers: list[int], vec: Float[Tensor, "row d_model"], prefix: SharedPrefix | None
) -> Call:
    """The pass giving (as ``"final"``) the final residuals of ``tokens[-1]``
    continuing ``prefix`` + ``tokens[:-1]``, once per row, row r patched at depth
    ``layers[r]`` (see :func:`patched_final_residuals`)."""
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
        mask = {
            "full_attention": mask,
            "sliding_attention": copy_attention_mask(n_prefix, len(context), n_copies, window).to(device),
        }
    n_blocks = model.info.n_blocks
    at = torch.tensor(layers)
    work = ForwardWork()
    # A patch at depth L comes before the read at the same site, so it is what is read out.
    for depth in sorted(set(layers)):
        sel = torch.nonzero(at == depth).flatten()
        work.write(depth_site(depth, n_blocks), torch.zeros_like(sel), len(context) + sel, vec[sel])
    copies = torch.arange(len(context), len(context) + n_copies)
    work.read("final", depth_site(n_blocks, n_blocks), torch.zeros_like(copies), copies)
    return Call(ids, mask, work, position_ids, prefix)


@torch.no_grad()
def truncated_residuals(
    model: Model, tokens: Int[Tensor, "batch seq"], depth: int, attention_mask: Tensor | None = None
) -> Float[Tensor, "batch seq d_model"]:
    """The residual at ``depth`` (0..L) of every position, from a forward pass that
    stops there: the blocks from ``depth`` on never run (a real early exit)."""
    (out,) = truncated_runs(model, [(tokens, attention_mask, depth)])
    return out


@torch.no_grad()
def truncated_runs(
    model: Model, runs: Sequence[tuple[Int[Tensor, "batch seq"], Tensor | None, int]]
) -> Iterator[Float[Tensor, "batch seq d_model"]]:
    """:func:`truncated_residuals` of each ``(tokens, attention_mask, depth)``, in
    order, as they are read."""
    check_layers([d for _, _, d in runs], model.info.n_blocks)
    return model.backend.truncated_all([(t, m, int(d)) for t, m, d in runs])


@torch.no_grad()
def model_logits(
    model: Model, tokens: Int[Tensor, "batch seq"], attention_mask: Tensor | None = None
) -> Float[Tensor, "batch seq d_vocab"]:
    """The model's own logits at every position."""
    return model.backend.logits(tokens, attention_mask)
