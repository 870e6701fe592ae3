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
    _options,
    _out_device,
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
from depthkit.engine.contexts import CACHE, ContextKeeper, can_keep, contexts_of_run
from depthkit.engine.patched import check_layers, patched_final_residuals
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
    contexts: ContextKeeper | None = None,
) -> Iterator[Float[Tensor, "layer position d_model"]]:
    """:func:`collect_residuals` of each batch, in order, as they are read: one
    forward pass each, which a remote backend sends several to a request.
    ``contexts``: see :func:`residual_runs`."""
    return residual_runs(model, [(items, skip_block) for items in batches], layers, prefix=prefix, pack=pack, contexts=contexts)


@torch.no_grad()
def residual_runs(
    model: Model,
    runs: Sequence[tuple[Sequence[Item], int | None]],
    layers: Sequence[int] | None = None,
    *,
    prefix: SharedPrefix | None = None,
    pack: bool = False,
    contexts: ContextKeeper | None = None,
) -> Iterator[Float[Tensor, "layer position d_model"]]:
    """:func:`collect_residuals` of each ``(items, skip_block)`` run, in order, as
    they are read (a run with a block number removes that block's update).
    ``contexts``: the unpatched runs of items it wants (that read their last token)
    hand it their context (:mod:`depthkit.engine.contexts`), where the model allows."""
    layers = list(range(model.info.n_blocks + 1)) if layers is None else list(layers)
    if pack and prefix is not None:
        raise ValueError("Packed rows cannot continue a shared prefix; pass pack=False.")
    calls = [_residual_call(model, items, layers, skip, prefix, pack) for items, skip in runs]
    wanted = [_wanted(model, contexts, items, skip, call, prefix) for (items, skip), call in zip(runs, calls)]
    for call, w in zip(calls, wanted):
        call.work.keep_cache = bool(w)
    for (items, _), w, call, got in zip(runs, wanted, calls, model.backend.execute_all(calls)):
        if w:
            _, rows, columns = call.work.steps()[0].reads[0]  # every depth reads the same rows
            for ctx in contexts_of_run(got.pop(CACHE), items, w, rows, columns, prefix):
                contexts.keep_context(ctx)  # type: ignore[union-attr]
        yield torch.stack([got[str(d)] for d in layers])


def _wanted(
    model: Model, keeper: ContextKeeper | None, items: Sequence[Item], skip_block: int | None, call: Call, prefix: SharedPrefix | None
) -> list[int]:
    """The items of one run whose context ``keeper`` wants: those that read their last
    token and have a context (a token before it). None where the run removes a block
    (it is not the prompt's own run) or the model cannot hand out its states."""
    head = prefix.tokens if prefix is not None else []
    if keeper is None or skip_block is not None or not can_keep(model, len(head) + call.tokens.shape[1]):
        return []
    return [i for i, it in enumerate(items)
            if len(it.tokens) - 1 in it.positions and len(head) + len(it.tokens) >= 2 and keeper.wants_context(head + list(it.tokens))]  # fmt: skip


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
