"""Patched runs: a vector written into the residual stream of a prompt's last
position at one depth, and the final residual that comes out.

* :func:`patched_final_residuals`: many (target, depth, vector) rows, every target's
  context run once (or not at all, when its unpatched run kept it:
  :mod:`depthkit.engine.contexts`), its patched rows riding along as copies of its
  last token;
* :func:`check_layers`: depths given by a user, checked against 0..L.

Re-exported by :mod:`depthkit.engine.capture`, the engine's one entry point for
reading and writing the residual stream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from depthkit.engine.batching import (
    Item,
    PrefixGroup,
    _device,
    _options,
    _out_device,
    copy_attention_mask,
    masks_by_layer_type,
    shared_prefix_groups,
    token_key,
)
from depthkit.engine.contexts import KeptContext, can_keep, context_batch
from depthkit.engine.prefix import SharedPrefix, encode_prefix
from depthkit.engine.work import Call, ForwardWork, depth_site

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

# Patched rows in one pass over kept contexts. Each target has one row per patched
# layer (31 for SmolLM2-135M); a pass of so few rows spends its time reading the
# weights, so several targets share one.
KEPT_ROWS_PER_PASS = 256

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
    contexts: Mapping[tuple[int, ...], KeptContext] | None = None,
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
    and is patched at its own depth. ``contexts``: kept contexts by
    :func:`~depthkit.engine.batching.token_key` of the target; a target found there
    runs only its copies, over that context, several targets to a pass
    (:mod:`depthkit.engine.contexts`).
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
    size = int(run["batch_size"])
    bar = tqdm(total=n, desc="patching", unit="run", disable=not run["progress"], leave=False)
    # A sliding-window layer lets the last token see only so far back: a kept context
    # longer than that would show it more (can_keep; the contexts of such runs are never kept).
    contexts = contexts or {}
    kept = [(contexts[k], rows_of.pop(k)) for k in list(rows_of) if k in contexts and can_keep(model, len(contexts[k].prompt))]
    _patch_kept(model, out, kept, layers, vectors, bar)
    targets = [Item(list(seq), [len(seq) - 1]) for seq in rows_of]
    rows_of_target = list(rows_of.values())  # in the order of ``targets``
    groups = (
        shared_prefix_groups(targets) if model.backend.supports_prefix else [PrefixGroup([], list(range(len(targets))), targets)]
    )
    for group in groups:
        prefix = encode_prefix(model, group.prefix) if group.prefix else None
        tokens = [rest.tokens for rest in group.items]
        _patch_rows(model, out, tokens, [rows_of_target[i] for i in group.indices], layers, vectors, prefix, size, bar)
    bar.close()
    return out


def _patch_kept(
    model: Model, out: Tensor, kept: list[tuple[KeptContext, list[int]]], layers: list[int], vectors: Tensor, bar: tqdm
) -> None:
    """Fill ``out[rows]`` for every ``(context, rows)`` of ``kept``: the copies of
    several targets in one pass, each target's in its own row over its own context,
    up to :data:`KEPT_ROWS_PER_PASS` patched rows a pass."""
    batches: list[list[tuple[KeptContext, list[int]]]] = []
    width = 0
    # Similar context lengths share a pass, so its rows pad little.
    for ctx, rows in sorted(kept, key=lambda t: len(t[0].prompt)):
        for s in range(0, len(rows), KEPT_ROWS_PER_PASS):
            chunk = rows[s : s + KEPT_ROWS_PER_PASS]
            if not batches or (len(batches[-1]) + 1) * max(width, len(chunk)) > KEPT_ROWS_PER_PASS:
                batches.append([])
                width = 0
            batches[-1].append((ctx, chunk))
            width = max(width, len(chunk))
    calls = [_kept_call(model, batch, layers, vectors) for batch in batches]
    for batch, got in zip(batches, model.backend.execute_all(calls)):
        rows = [r for _, chunk in batch for r in chunk]
        out[rows] = got["final"].to(out.device)
        bar.update(len(rows))


def _kept_call(model: Model, batch: list[tuple[KeptContext, list[int]]], layers: list[int], vectors: Tensor) -> Call:
    """One pass of copies of each target's last token, row i continuing ``batch[i]``'s
    context: every copy sees that context and itself (row r of ``vectors`` written
    in at depth ``layers[r]``); the final residuals come out as ``"final"``, row by row."""
    device, n_blocks = _device(model), model.info.n_blocks
    contexts = context_batch([ctx for ctx, _ in batch])
    n = max(len(chunk) for _, chunk in batch)
    ids = torch.tensor([[ctx.prompt[-1]] * n for ctx, _ in batch], dtype=torch.long, device=device)
    lengths = torch.tensor(contexts.lengths)
    seen = torch.arange(contexts.length)[None, None, :] < lengths[:, None, None]  # padding columns stay unseen
    mask = torch.cat([seen.expand(-1, n, -1), torch.eye(n, dtype=torch.bool).expand(len(batch), -1, -1)], 2)[:, None]
    flat = [r for _, chunk in batch for r in chunk]
    row = torch.cat([torch.full((len(chunk),), i) for i, (_, chunk) in enumerate(batch)])
    col = torch.cat([torch.arange(len(chunk)) for _, chunk in batch])
    work = _patch_work(n_blocks, torch.tensor([layers[r] for r in flat]), row, col, vectors[flat])
    position_ids = lengths[:, None].expand(-1, n).to(device)
    return Call(ids, mask.to(device), work, position_ids, contexts)


def _patch_work(
    n_blocks: int, depths: Int[Tensor, " row"], rows: Int[Tensor, " row"], positions: Int[Tensor, " row"],
    vectors: Float[Tensor, "row d_model"],
) -> ForwardWork:  # fmt: skip
    """``vectors[k]`` written at ``(rows[k], positions[k])`` at depth ``depths[k]``, and
    the final residual of every such position read as ``"final"``, in that order. A
    patch at depth L comes before the read at the same site, so it is what is read out."""
    work = ForwardWork()
    for depth in sorted(set(depths.tolist())):
        sel = torch.nonzero(depths == depth).flatten()
        work.write(depth_site(depth, n_blocks), rows[sel], positions[sel], vectors[sel])
    return work.read("final", depth_site(n_blocks, n_blocks), rows, positions)


def _patch_rows(
    model: Model,
    out: Tensor,
    tokens: list[list[int]],
    rows: list[list[int]],
    layers: list[int],
    vectors: Tensor,
    prefix: SharedPrefix | None,
    size: int,
    bar: tqdm,
) -> None:
    """Fill ``out[rows[i]]`` with the patched runs of ``tokens[i]`` (continuing
    ``prefix``), ``size`` patched rows per pass."""
    chunks = [(t, r[s : s + size]) for t, r in zip(tokens, rows) for s in range(0, len(r), size)]
    calls = [_patch_call(model, t, [layers[r] for r in chunk], vectors[chunk], prefix) for t, chunk in chunks]
    for (_, chunk), got in zip(chunks, model.backend.execute_all(calls)):
        out[chunk] = got["final"].to(out.device)
        bar.update(len(chunk))


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
    mask = masks_by_layer_type(
        model, n_prefix + len(context) + 1, lambda window: copy_attention_mask(n_prefix, len(context), n_copies, window).to(device)
    )
    copies = torch.arange(len(context), len(context) + n_copies)
    work = _patch_work(model.info.n_blocks, torch.tensor(layers), torch.zeros_like(copies), copies, vec)
    return Call(ids, mask, work, position_ids, prefix)
