"""Decoding residuals into top-k tables: every step of a layer plan read through a
lens, reduced at once to what the trajectory tables keep (top-k tokens and
probabilities, entropy, KL to the final distribution, rank, probability and logit
of target tokens).

Vocabulary-sized logits exist only for a chunk of positions at a time
(``budget_mb``), in one buffer a caller may keep across batches (:class:`Workspace`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from depthkit.lens.base import LayerStep, Lens, Workspace


@dataclass
class _Decoded:
    """What :func:`decode_residuals` returns, by plan step and position (``target``:
    the final top-1 first, then the extra targets in their order)."""

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
    workspace = workspace or Workspace()
    logits = workspace.get(n_steps * chunk * d_vocab, resid.device)
    # A GPU takes each statistic over all of a step's positions at once; a CPU over
    # blocks of positions that fit its cache.
    on_cpu = resid.device.type == "cpu"
    block = max(1, int(STAT_BLOCK_BYTES // (d_vocab * 4))) if on_cpu else chunk
    scratch = torch.empty(min(block, chunk) * d_vocab, device=resid.device)
    last = resid.shape[0] - 1
    final_step = next((i for i, st in enumerate(plan) if st.layer == last and st.translator is None), None)
    parts = [
        _decode_chunk(lens, plan, resid, slice(start, min(start + chunk, n_pos)), extra_targets, logits, final_step, top_k,
                      (block, scratch))
        for start in range(0, n_pos, chunk)
    ]  # fmt: skip
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


def _decode_chunk(
    lens: Lens,
    plan: Sequence[LayerStep],
    resid: Float[Tensor, "depth pos d_model"],
    sl: slice,
    extra_targets: Int[Tensor, "pos target"] | None,
    logits: Float[Tensor, " n"],
    final_step: int | None,
    top_k: int,
    blocks: tuple[int, Tensor],
) -> _Decoded:
    """:func:`decode_residuals` of the positions ``sl``, with the logits in ``logits``
    and the statistics taken ``blocks`` = (rows, scratch) at a time."""
    h = torch.stack([lens.translate(resid[s.layer, sl], s.translator) for s in plan])
    z = lens.readout(h, out=logits)  # [step, c, vocab]
    del h
    pf, neg_h_f, final_top1 = _final_distribution(lens, z, resid, sl, final_step)
    tgt = final_top1[:, None]
    if extra_targets is not None and extra_targets.shape[1]:
        tgt = torch.cat([tgt, extra_targets[sl].to(tgt.device)], 1)
    top_v, top_i, t_logit, rank, mass, dot_e, dot_p = _block_statistics(z, tgt, pf, top_k, *blocks)
    del z
    rank += 1
    lse = top_v[..., 0] + torch.log(mass)
    entropy = lse - dot_e / mass
    kl = (neg_h_f[None] - dot_p + lse).clamp_min(0.0)
    return _Decoded(
        top_ids=top_i,
        top_probs=torch.exp(top_v - lse[..., None]),
        target_logit=t_logit,
        target_prob=torch.exp(t_logit - lse[..., None]),
        target_rank=rank,
        entropy=entropy,
        kl=kl,
        final_top1=final_top1,
    )


def _final_distribution(
    lens: Lens, z: Float[Tensor, "step pos vocab"], resid: Float[Tensor, "depth pos d_model"], sl: slice, final_step: int | None
) -> tuple[Float[Tensor, "pos vocab"], Float[Tensor, " pos"], Int[Tensor, " pos"]]:
    """The final distribution, Σ p log p of it, and its top-1, at the positions ``sl``."""
    # The model's own output: a plain readout of the final residual, a row of z
    # wherever the plan has one (both conventions end with it).
    zf = z[final_step] if final_step is not None else lens.readout(resid[-1, sl])
    lse_f = torch.logsumexp(zf, -1)
    pf = torch.softmax(zf, -1)
    neg_h_f = (pf * zf).sum(-1) - lse_f
    final_top1 = zf.argmax(-1)
    return pf, neg_h_f, final_top1


def _block_statistics(
    z: Float[Tensor, "step pos vocab"], tgt: Int[Tensor, "pos target"], pf: Float[Tensor, "pos vocab"], top_k: int, block: int, scratch: Tensor
):
    """Per step and position: top-k logits and ids, target logits, the count of logits
    above each target, the unnormalised softmax mass (max entry 1) and its dot
    products with the logits and with the final distribution. Rows are taken
    ``block`` at a time, with ``scratch`` for the elementwise passes."""
    n_steps, c = z.shape[0], z.shape[1]
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
    return top_v, top_i, t_logit, rank, mass, dot_e, dot_p
