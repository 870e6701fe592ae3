"""The trajectory engine: decode every layer of a model through a lens.

``trajectories(model, prompts)`` runs the prompts through the model in padded
batches, keeps the residual stream only at the positions of interest (default:
the last token of each prompt), decodes every layer through a lens, and returns a
:class:`Trajectories` object holding tidy DataFrames:

* ``steps``: one row per (item, position, layer): top-1 token and probability,
  entropy, KL(final ‖ layer);
* ``topk``: the top-k tokens and probabilities of every row;
* ``targets``: rank, probability and logit of requested tokens (always the
  model's final top-1, named ``"final"``; plus gold answers, options, ...).

Memory stays bounded: residuals are kept as ``d_model`` vectors, and
vocabulary-sized logits exist only for a chunk of positions at a time
(``budget_mb``), so Gemma's 262k vocabulary over long texts fits.

Prompts become items in :mod:`depthkit.lens.prompts`, residuals are decoded in
:mod:`depthkit.lens.decode`; this module runs the batches and builds the tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from depthkit.core.model_info import ModelInfo
from depthkit.engine.capture import (
    Item,
    PrefixGroup,
    batch_tensors,
    collect_residuals,
    length_batches,
    packed_batches,
    residual_batches,
    residual_hook_names,
    shared_prefix_groups,
)
from depthkit.engine.contexts import ContextKeeper
from depthkit.engine.prefix import encode_prefix
from depthkit.lens.base import DEFAULT_LENS, Convention, LayerStep, Lens, layer_plan
from depthkit.lens.decode import BYTES_PER_VOCAB_ENTRY, Workspace, _Decoded, decode_residuals
from depthkit.lens.prompts import Overflow, PromptTooLongError, answer_token_ids, encode, make_items
from depthkit.lens.registry import get_lens

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

# Item, batch_tensors, collect_residuals and residual_hook_names live in
# depthkit.engine.capture, encode and its kin in depthkit.lens.prompts, and
# decode_residuals in depthkit.lens.decode; they are importable from here too, as before.
__all__ = [
    "BYTES_PER_VOCAB_ENTRY",
    "Item",
    "PromptTooLongError",
    "Trajectories",
    "Workspace",
    "answer_token_ids",
    "batch_tensors",
    "collect_residuals",
    "decode_residuals",
    "encode",
    "make_items",
    "residual_hook_names",
    "trajectories",
]


@dataclass
class Trajectories:
    """Per-layer lens readings for a set of items (see the module docstring)."""

    steps: pd.DataFrame
    topk: pd.DataFrame
    targets: pd.DataFrame
    model: ModelInfo
    lens: str
    convention: str

    @property
    def n_blocks(self) -> int:
        return self.model.n_blocks

    @property
    def layers(self) -> list[int]:
        return sorted(self.steps["layer"].unique().tolist())

    def target(self, name: str) -> pd.DataFrame:
        """Rows of one target, e.g. ``traj.target("final")``."""
        out = self.targets[self.targets["target"] == name]
        if out.empty:
            raise KeyError(f"No target {name!r}; have {sorted(self.targets['target'].unique())}.")
        return out

    def top1_table(self, item: int = 0, position: int | None = None) -> pd.DataFrame:
        """One position's top-1 token per layer (the last position by default)."""
        s = self.steps[self.steps["item"] == item]
        if position is None:
            position = int(s["position"].max())
        return s[s["position"] == position][["layer", "top1_token", "top1_prob", "entropy", "kl_to_final"]].reset_index(drop=True)


# Items per forward pass by default. Bigger batches multiply bigger matrices, which
# a CPU does faster per row (16 -> 64 one-position prompts: 5-10 % more prompts
# per second on 2 cores); but a batch holds every depth's residual at every
# position it reads, so items that read many positions (whole passages) stay at 16.
ONE_POSITION_BATCH = 64
MANY_POSITION_BATCH = 16


class TokenNames:
    """Decoded strings of token ids, cached (decoding Gemma's whole vocabulary up
    front would be wasteful)."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        out = np.empty(len(ids), dtype=object)
        for j, i in enumerate(ids.tolist()):
            s = self.cache.get(i)
            if s is None:
                s = self.cache[i] = self.tok.decode([i])
            out[j] = s
        return out


def trajectories(
    model: Model,
    prompts: Sequence[str] | Sequence[Item],
    *,
    lens: str | Lens = DEFAULT_LENS,
    convention: Convention = "canonical",
    positions: Literal["last", "all"] = "last",
    targets: Mapping[str, Sequence[int | str]] | None = None,
    top_k: int = 5,
    batch_size: int | None = None,
    budget_mb: float = 512.0,
    on_overflow: Overflow = "error",
    share_prefix: bool = True,
    progress: bool = True,
    keep: Callable[[Sequence[Item], Tensor], None] | None = None,
    keep_contexts: ContextKeeper | None = None,
) -> Trajectories:
    """Decode every layer of ``model`` at the positions of interest of ``prompts``.

    ``prompts`` are strings (then ``positions`` and ``targets`` say what to read, see
    :func:`make_items`) or ready-made :class:`Item` objects (teacher forcing, several
    positions with targets each). Items are batched by length; the ``item`` column keeps the input order.

    ``batch_size``: items per forward pass; by default :data:`ONE_POSITION_BATCH`
    when every item reads one position, else :data:`MANY_POSITION_BATCH`.
    ``share_prefix``: prompts that start with the same tokens (few-shot
    demonstrations) before any position of interest run those tokens once and
    feed only the rest (:func:`depthkit.engine.capture.shared_prefix_groups`).
    ``keep``: called per batch with its items and their residuals at every depth 0..L
    (``[depth, row, d_model]``, rows item by item, position by position), for a later
    pass over the same prompts (:meth:`depthkit.analyses.patching.CleanRuns.keep`);
    ``keep_contexts`` gets the key/value states of the prompts it wants (:mod:`depthkit.engine.contexts`).

    >>> import depthkit as dk
    >>> model = dk.load_model("tiny-llama", seed=0)
    >>> traj = dk.trajectories(model, ["The capital of France is", "One two"], progress=False)
    >>> traj.layers, len(traj.steps), len(traj.topk)
    ([0, 1, 2, 3, 4], 10, 50)
    >>> list(traj.steps.columns)
    ['item', 'position', 'layer', 'top1_id', 'top1_token', 'top1_prob', 'entropy', 'kl_to_final']
    """
    items, names, batch_size = _items_to_read(
        model, prompts, top_k, batch_size, positions=positions, targets=targets, on_overflow=on_overflow
    )
    lens_obj = get_lens(model, lens)
    plan = layer_plan(model.info.n_blocks, convention)
    share_prefix = share_prefix and model.backend.supports_prefix  # a remote run keeps no cache
    groups = shared_prefix_groups(items) if share_prefix else [PrefixGroup([], list(range(len(items))), list(items))]
    bar = tqdm(total=len(items), desc=f"{lens_obj.name} lens", unit="prompt", disable=not progress, leave=False)
    step_rows, topk_rows, target_rows = _read_batches(model, lens_obj, plan, items, groups, names, batch_size=batch_size,
        top_k=top_k, budget_mb=budget_mb, bar=bar, keep=keep, keep_contexts=keep_contexts)  # fmt: skip
    bar.close()
    return Trajectories(
        steps=_finish(step_rows, ["item", "position", "layer"]),
        topk=_finish(topk_rows, ["item", "position", "layer", "k"]),
        targets=_finish(target_rows, ["item", "position", "target", "layer"]),
        model=model.info,
        lens=lens_obj.name,
        convention=convention,
    )


def _items_to_read(
    model: Model,
    prompts: Sequence[str] | Sequence[Item],
    top_k: int,
    batch_size: int | None,
    *,
    positions: Literal["last", "all"],
    targets: Mapping[str, Sequence[int | str]] | None,
    on_overflow: Overflow,
) -> tuple[list[Item], list[str], int]:
    """The items of ``prompts``, the target names they all carry, and the batch size;
    arguments that cannot work are refused before the model runs."""
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}.")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    if len(prompts) == 0:
        raise ValueError("No prompts given: the dataset is empty.")
    items = (
        list(prompts)
        if isinstance(prompts[0], Item)
        else make_items(model, prompts, positions=positions, targets=targets, on_overflow=on_overflow)  # type: ignore[arg-type]
    )
    names = sorted(items[0].targets)
    for it in items:
        if sorted(it.targets) != names:
            raise ValueError("All items must name the same targets.")
    if batch_size is None:
        one = all(len(it.positions) == 1 for it in items)
        batch_size = ONE_POSITION_BATCH if one else MANY_POSITION_BATCH
    return items, names, batch_size


def _read_batches(
    model: Model,
    lens: Lens,
    plan: Sequence[LayerStep],
    items: list[Item],
    groups: list[PrefixGroup],
    names: list[str],
    *,
    batch_size: int,
    top_k: int,
    budget_mb: float,
    bar: tqdm,
    keep: Callable[[Sequence[Item], Tensor], None] | None = None,
    keep_contexts: ContextKeeper | None = None,
) -> tuple[list[pd.DataFrame], list[pd.DataFrame], list[pd.DataFrame]]:
    """Rows of the steps, top-k and targets tables, batch by batch, in the order run."""
    n_blocks = model.info.n_blocks
    # Reading a depth costs a copy of a few rows; ``keep`` gets them all.
    needed = list(range(n_blocks + 1)) if keep is not None else sorted({s.layer for s in plan} | {n_blocks})
    depth_index = {d: i for i, d in enumerate(needed)}
    local_plan = [LayerStep(depth_index[s.layer], s.translator) for s in plan]
    tok_names = TokenNames(model.tokenizer)
    step_rows, topk_rows, target_rows = [], [], []
    layer_ids = np.array([s.layer for s in plan])
    workspace = Workspace()
    for group in groups:
        prefix = encode_prefix(model, group.prefix) if group.prefix else None
        # Items that continue a shared prefix run in padded rows over its cache;
        # the rest are packed end to end.
        cut = length_batches(group.items, batch_size) if prefix else packed_batches(group.items, batch_size)
        chunks = [[group.items[j] for j in local] for local in cut]
        reads = residual_batches(model, chunks, needed, prefix=prefix, pack=prefix is None, contexts=keep_contexts)
        for local, resid in zip(cut, reads):
            batch = [group.indices[j] for j in local]
            chunk_items = [items[i] for i in batch]
            if keep is not None:
                keep(chunk_items, resid)
            extra = None
            if names:
                extra = torch.tensor([[it.targets[n][k] for n in names] for it in chunk_items for k in range(len(it.positions))])
            dec = decode_residuals(lens, local_plan, resid, extra, top_k=top_k, budget_mb=budget_mb, workspace=workspace)
            item_col = np.concatenate([[i] * len(items[i].positions) for i in batch])
            pos_col = np.concatenate([items[i].positions for i in batch])
            step_rows.append(_step_frame(dec, layer_ids, item_col, pos_col, tok_names))
            topk_rows.append(_topk_frame(dec, layer_ids, item_col, pos_col, tok_names))
            target_rows.append(_target_frame(dec, layer_ids, item_col, pos_col, ["final", *names], extra))
            bar.update(len(batch))
    return step_rows, topk_rows, target_rows


def _finish(frames: list[pd.DataFrame], keys: list[str]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True).sort_values(keys, kind="stable").reset_index(drop=True)


def _grid(dec: _Decoded, layer_ids: np.ndarray, item_col: np.ndarray, pos_col: np.ndarray):
    n_steps, n_pos = dec.entropy.shape
    layer = np.repeat(layer_ids, n_pos)
    item = np.tile(item_col, n_steps)
    pos = np.tile(pos_col, n_steps)
    return layer, item, pos


def _step_frame(dec, layer_ids, item_col, pos_col, tok_names) -> pd.DataFrame:
    layer, item, pos = _grid(dec, layer_ids, item_col, pos_col)
    top1 = dec.top_ids[..., 0].reshape(-1).cpu().numpy()
    return pd.DataFrame(
        {
            "item": item.astype(np.int64),
            "position": pos.astype(np.int64),
            "layer": layer.astype(np.int64),
            "top1_id": top1.astype(np.int64),
            "top1_token": tok_names(top1),
            "top1_prob": dec.top_probs[..., 0].reshape(-1).cpu().numpy(),
            "entropy": dec.entropy.reshape(-1).cpu().numpy(),
            "kl_to_final": dec.kl.reshape(-1).cpu().numpy(),
        }
    )


def _topk_frame(dec, layer_ids, item_col, pos_col, tok_names) -> pd.DataFrame:
    layer, item, pos = _grid(dec, layer_ids, item_col, pos_col)
    k = dec.top_ids.shape[-1]
    ids = dec.top_ids.reshape(-1).cpu().numpy()
    return pd.DataFrame(
        {
            "item": np.repeat(item, k).astype(np.int64),
            "position": np.repeat(pos, k).astype(np.int64),
            "layer": np.repeat(layer, k).astype(np.int64),
            "k": np.tile(np.arange(1, k + 1), len(layer)).astype(np.int64),
            "token_id": ids.astype(np.int64),
            "token": tok_names(ids),
            "prob": dec.top_probs.reshape(-1).cpu().numpy(),
        }
    )


def _target_frame(dec, layer_ids, item_col, pos_col, target_names, extra: Tensor | None) -> pd.DataFrame:
    layer, item, pos = _grid(dec, layer_ids, item_col, pos_col)
    n_t = len(target_names)
    n_steps, n_pos = dec.entropy.shape
    final = dec.final_top1.cpu().numpy()
    ids = np.empty((n_pos, n_t), dtype=np.int64)  # per position, the final top-1 first
    ids[:, 0] = final
    if extra is not None:
        ids[:, 1:] = extra.cpu().numpy()
    return pd.DataFrame(
        {
            "item": np.repeat(item, n_t).astype(np.int64),
            "position": np.repeat(pos, n_t).astype(np.int64),
            "layer": np.repeat(layer, n_t).astype(np.int64),
            "target": np.tile(np.array(target_names, dtype=object), n_steps * n_pos),
            "token_id": np.tile(ids, (n_steps, 1)).reshape(-1),
            "rank": dec.target_rank.reshape(-1).cpu().numpy().astype(np.int64),
            "prob": dec.target_prob.reshape(-1).cpu().numpy(),
            "logit": dec.target_logit.reshape(-1).cpu().numpy(),
        }
    )
