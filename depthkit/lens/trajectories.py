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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
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
    residual_hook_names,
    shared_prefix_groups,
)
from depthkit.engine.prefix import encode_prefix
from depthkit.lens.base import DEFAULT_LENS, Convention, LayerStep, Lens, layer_plan
from depthkit.lens.registry import get_lens

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

# Item, batch_tensors, collect_residuals and residual_hook_names live in
# depthkit.engine.capture; they are importable from here too, as before.
__all__ = [
    "Item",
    "PromptTooLongError",
    "Trajectories",
    "answer_token_ids",
    "batch_tensors",
    "collect_residuals",
    "decode_residuals",
    "encode",
    "make_items",
    "residual_hook_names",
    "trajectories",
]

Overflow = Literal["error", "truncate"]


class PromptTooLongError(ValueError):
    """A prompt exceeds the model's context window."""


def encode(model: Model, text: str, *, on_overflow: Overflow = "error", max_tokens: int | None = None) -> list[int]:
    """Token ids of ``text`` as the model's own tokenizer makes them (special tokens
    included, e.g. Gemma's BOS). Too-long texts raise, or lose their *start* with a
    warning when ``on_overflow="truncate"`` (the end is what the prediction reads)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"Empty prompt ({text!r}): every prompt needs some text.")
    tok = model.tokenizer
    ids = list(tok(text, add_special_tokens=True)["input_ids"])
    limit = max_tokens or _context(model)
    if len(ids) > limit:
        if on_overflow == "truncate":
            import warnings

            warnings.warn(
                f"Prompt of {len(ids)} tokens exceeds the context of {limit}; keeping its last {limit} tokens.",
                stacklevel=2,
            )
            ids = ids[-limit:]
        else:
            raise PromptTooLongError(
                f"Prompt of {len(ids)} tokens exceeds the model's context of {limit} tokens "
                f"(it starts {text[:60]!r}). Shorten it, or pass on_overflow='truncate' to keep its last {limit} tokens."
            )
    return ids


def answer_token_ids(model: Model, prompt: str, answer: str) -> list[int]:
    """Token ids of ``answer`` as they follow ``prompt`` (for teacher forcing by ids).

    Encodes ``prompt + answer`` and keeps what follows the prompt's own tokens, so a
    leading space is tokenised as in running text. If the tokenizer merges across the
    boundary, falls back to encoding the answer alone.
    """
    tok = model.tokenizer
    p = list(tok(prompt, add_special_tokens=True)["input_ids"])
    full = list(tok(prompt + answer, add_special_tokens=True)["input_ids"])
    if full[: len(p)] == p and len(full) > len(p):
        return full[len(p) :]
    ids = list(tok(answer, add_special_tokens=False)["input_ids"])
    if not ids:
        raise ValueError(f"Answer {answer!r} tokenizes to nothing; give a non-empty answer.")
    return ids


def make_items(
    model: Model,
    prompts: Sequence[str],
    *,
    positions: Literal["last", "all"] = "last",
    targets: Mapping[str, Sequence[int | str]] | None = None,
    on_overflow: Overflow = "error",
) -> list[Item]:
    """Items for plain prompts. ``targets`` maps a name to one entry per prompt: a
    token id, or a string whose first token (as it follows the prompt) is the target.
    Targets need ``positions="last"``."""
    if len(prompts) == 0:
        raise ValueError("No prompts given: the dataset is empty.")
    targets = dict(targets or {})
    if targets and positions != "last":
        raise ValueError("Named targets are per prompt and need positions='last'; build Item objects for more.")
    items = []
    for i, text in enumerate(prompts):
        ids = encode(model, text, on_overflow=on_overflow)
        pos = [len(ids) - 1] if positions == "last" else list(range(len(ids)))
        tg = {}
        for name, values in targets.items():
            if len(values) != len(prompts):
                raise ValueError(f"Target {name!r} has {len(values)} entries for {len(prompts)} prompts.")
            v = values[i]
            tg[name] = [int(v) if not isinstance(v, str) else answer_token_ids(model, text, v)[0]]
        items.append(Item(ids, pos, tg))
    return items


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
        return s[s["position"] == position][["layer", "top1_token", "top1_prob", "entropy", "kl_to_final"]].reset_index(
            drop=True
        )


def _context(model: Model) -> int:
    return int(model.info.n_ctx)


@dataclass
class _Decoded:
    top_ids: Int[Tensor, "step pos k"]
    top_probs: Float[Tensor, "step pos k"]
    target_logit: Float[Tensor, "step pos target"]
    target_prob: Float[Tensor, "step pos target"]
    target_rank: Int[Tensor, "step pos target"]
    entropy: Float[Tensor, "step pos"]
    kl: Float[Tensor, "step pos"]
    final_top1: Int[Tensor, " pos"]


# What decoding may keep alive per vocabulary entry of a row: the float32 logits and
# as much again for scratch (the statistics use at most one step's rows of it; the
# rest is headroom, and keeps chunk sizes as they were).
BYTES_PER_VOCAB_ENTRY = 4 + 4
# Rows of logits whose statistics (top-k, ranks, softmax sums) are taken together
# on CPU: a block this small stays in a core's cache across those six-odd passes
# instead of streaming a whole chunk from memory for each (same-process A/B on 2
# cores: 5-12 % more prompts per second for the whole engine).
STAT_BLOCK_BYTES = 3 * 2**19


# Items per forward pass by default. Bigger batches multiply bigger matrices, which
# a CPU does faster per row (16 -> 64 one-position prompts: 5-10 % more prompts
# per second on 2 cores); but a batch holds every depth's residual at every
# position it reads, so items that read many positions (whole passages) stay at 16.
ONE_POSITION_BATCH = 64
MANY_POSITION_BATCH = 16


class Workspace:
    """One float32 buffer reused for the logits of every chunk a caller decodes: a
    fresh vocabulary-sized tensor per chunk costs a round of page faults, which on
    CPU takes as long as a fifth of the unembedding product."""

    def __init__(self) -> None:
        self.buf: Tensor | None = None

    def get(self, n: int, device: torch.device) -> Float[Tensor, " n"]:
        if self.buf is None or self.buf.numel() < n or self.buf.device != device:
            self.buf = None  # free the old one before allocating its successor
            self.buf = torch.empty(n, device=device)
        return self.buf[:n]


@torch.no_grad()
def decode_residuals(
    lens: Lens,
    plan: Sequence[LayerStep],
    resid: Float[Tensor, "depth pos d_model"],
    extra_targets: Int[Tensor, "pos target"] | None,
    *,
    top_k: int = 5,
    budget_mb: float = 512.0,
    workspace: Workspace | None = None,
) -> _Decoded:
    """Decode residuals (depths 0..L along dim 0) through ``lens`` following ``plan``.

    Works through positions in chunks so that at most about ``budget_mb`` of
    vocabulary-sized tensors exist at once. ``workspace``: a :class:`Workspace` to
    hold the logits, kept by a caller that decodes many batches.
    """
    n_steps, n_pos = len(plan), resid.shape[1]
    d_vocab = lens.d_vocab
    per_pos = n_steps * d_vocab * BYTES_PER_VOCAB_ENTRY
    chunk = min(n_pos, max(1, int(budget_mb * 2**20 // per_pos)))
    n_extra = 0 if extra_targets is None else extra_targets.shape[1]
    workspace = workspace or Workspace()
    logits = workspace.get(n_steps * chunk * d_vocab, resid.device)
    # A GPU takes each statistic over all of a step's positions at once; a CPU over
    # blocks of positions that fit its cache.
    on_cpu = resid.device.type == "cpu"
    block = max(1, int(STAT_BLOCK_BYTES // (d_vocab * 4))) if on_cpu else chunk
    scratch = torch.empty(min(block, chunk) * d_vocab, device=resid.device)
    last = resid.shape[0] - 1
    final_step = next((i for i, st in enumerate(plan) if st.layer == last and st.translator is None), None)
    parts: list[_Decoded] = []
    for start in range(0, n_pos, chunk):
        sl = slice(start, min(start + chunk, n_pos))
        c = sl.stop - sl.start
        h = torch.stack([lens.translate(resid[s.layer, sl], s.translator) for s in plan])
        z = lens.readout(h, out=logits)  # [step, c, vocab]
        del h
        # The model's own output: a plain readout of the final residual, a row of z
        # wherever the plan has one (both conventions end with it).
        zf = z[final_step] if final_step is not None else lens.readout(resid[-1, sl])
        lse_f = torch.logsumexp(zf, -1)
        pf = torch.softmax(zf, -1)
        neg_h_f = (pf * zf).sum(-1) - lse_f  # Σ p log p of the final distribution
        final_top1 = zf.argmax(-1)
        del zf
        tgt = final_top1[:, None]
        if n_extra:
            tgt = torch.cat([tgt, extra_targets[sl].to(tgt.device)], 1)
        n_t = tgt.shape[1]
        top_v = torch.empty((n_steps, c, top_k), device=z.device)
        top_i = torch.empty((n_steps, c, top_k), dtype=torch.long, device=z.device)
        t_logit = torch.empty((n_steps, c, n_t), device=z.device)
        rank = torch.empty((n_steps, c, n_t), dtype=torch.long, device=z.device)
        mass, dot_e, dot_p = (torch.empty((n_steps, c), device=z.device) for _ in range(3))
        for s in range(n_steps):
            for p0 in range(0, c, block):
                p1 = min(p0 + block, c)
                zb = z[s, p0:p1]
                e = scratch[: zb.numel()].view(zb.shape)
                torch.topk(zb, top_k, dim=-1, out=(top_v[s, p0:p1], top_i[s, p0:p1]))
                tl = t_logit[s, p0:p1]
                torch.gather(zb, -1, tgt[p0:p1], out=tl)
                # rank = 1 + #{v: z_v > z_target}; counting 0/1 floats is several times
                # faster than summing a bool mask, and exact below 2**24 entries.
                for j in range(n_t):
                    rank[s, p0:p1, j] = torch.sub(zb, tl[:, j : j + 1], out=e).gt_(0).sum(-1)
                torch.sub(zb, top_v[s, p0:p1, :1], out=e).exp_()  # unnormalised softmax, max entry 1
                torch.sum(e, -1, out=mass[s, p0:p1])
                dot_e[s, p0:p1] = torch.linalg.vecdot(e, zb)
                dot_p[s, p0:p1] = torch.linalg.vecdot(pf[p0:p1], zb)  # Σ p_final · z
        del z
        rank += 1
        lse = top_v[..., 0] + torch.log(mass)
        entropy = lse - dot_e / mass
        kl = (neg_h_f[None] - dot_p + lse).clamp_min(0.0)
        parts.append(
            _Decoded(
                top_ids=top_i,
                top_probs=torch.exp(top_v - lse[..., None]),
                target_logit=t_logit,
                target_prob=torch.exp(t_logit - lse[..., None]),
                target_rank=rank,
                entropy=entropy,
                kl=kl,
                final_top1=final_top1,
            )
        )
    cat = lambda name, dim: torch.cat([getattr(p, name) for p in parts], dim)  # noqa: E731
    return _Decoded(
        top_ids=cat("top_ids", 1),
        top_probs=cat("top_probs", 1),
        target_logit=cat("target_logit", 1),
        target_prob=cat("target_prob", 1),
        target_rank=cat("target_rank", 1),
        entropy=cat("entropy", 1),
        kl=cat("kl", 1),
        final_top1=cat("final_top1", 0),
    )


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
) -> Trajectories:
    """Decode every layer of ``model`` at the positions of interest of ``prompts``.

    ``prompts`` are strings (then ``positions`` and ``targets`` say what to read, see
    :func:`make_items`) or ready-made :class:`Item` objects (teacher forcing, several
    positions with targets each). Items are batched by length; results keep the input
    order in the ``item`` column.

    ``batch_size``: items per forward pass; by default
    :data:`ONE_POSITION_BATCH` when every item reads one position, else
    :data:`MANY_POSITION_BATCH`.

    ``share_prefix``: prompts that start with the same tokens (few-shot
    demonstrations) before any position of interest run those tokens once and
    feed only the rest (:func:`depthkit.engine.capture.shared_prefix_groups`).
    """
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
    lens_obj = get_lens(model, lens)
    n_blocks = int(model.bridge.cfg.n_layers)
    plan = layer_plan(n_blocks, convention)
    needed = sorted({s.layer for s in plan} | {n_blocks})
    depth_index = {d: i for i, d in enumerate(needed)}
    local_plan = [LayerStep(depth_index[s.layer], s.translator) for s in plan]
    tok_names = TokenNames(model.tokenizer)

    groups = shared_prefix_groups(items) if share_prefix else [PrefixGroup([], list(range(len(items))), list(items))]
    step_rows, topk_rows, target_rows = [], [], []
    layer_ids = np.array([s.layer for s in plan])
    bar = tqdm(total=len(items), desc=f"{lens_obj.name} lens", unit="prompt", disable=not progress, leave=False)
    workspace = Workspace()
    for group in groups:
        prefix = encode_prefix(model, group.prefix) if group.prefix else None
        # Items that continue a shared prefix run in padded rows over its cache;
        # the rest are packed end to end.
        cut = length_batches(group.items, batch_size) if prefix else packed_batches(group.items, batch_size)
        for local in cut:
            batch = [group.indices[j] for j in local]
            chunk_items = [items[i] for i in batch]
            resid = collect_residuals(model, [group.items[j] for j in local], needed, prefix=prefix, pack=prefix is None)
            extra = None
            if names:
                extra = torch.tensor([[it.targets[n][k] for n in names] for it in chunk_items for k in range(len(it.positions))])
            dec = decode_residuals(lens_obj, local_plan, resid, extra, top_k=top_k, budget_mb=budget_mb, workspace=workspace)
            item_col = np.concatenate([[i] * len(items[i].positions) for i in batch])
            pos_col = np.concatenate([items[i].positions for i in batch])
            step_rows.append(_step_frame(dec, layer_ids, item_col, pos_col, tok_names))
            topk_rows.append(_topk_frame(dec, layer_ids, item_col, pos_col, tok_names))
            target_rows.append(_target_frame(dec, layer_ids, item_col, pos_col, ["final", *names], extra))
            bar.update(len(batch))
    bar.close()

    def finish(frames: list[pd.DataFrame], keys: list[str]) -> pd.DataFrame:
        return pd.concat(frames, ignore_index=True).sort_values(keys, kind="stable").reset_index(drop=True)

    return Trajectories(
        steps=finish(step_rows, ["item", "position", "layer"]),
        topk=finish(topk_rows, ["item", "position", "layer", "k"]),
        targets=finish(target_rows, ["item", "position", "target", "layer"]),
        model=model.info,
        lens=lens_obj.name,
        convention=convention,
    )


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

