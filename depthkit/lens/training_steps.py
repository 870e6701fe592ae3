"""The Adam steps of tuned-lens training: Adam on the (weighted) KL in
standardised coordinates, with the KL's gradient w.r.t. the logits formed by hand
(:func:`kl_gradient_`) and the layers' logits stacked into as few unembedding
products as :data:`~depthkit.lens.training_metrics.LOGIT_BUDGET_MB` allows.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from depthkit.lens.base import Readout, TunedLens
from depthkit.lens.training_data import TrainConfig
from depthkit.lens.training_metrics import layer_groups


def adam_steps(
    lens: TunedLens,
    readout: Readout,
    resid: Float[Tensor, "depth n d_model"],
    weights: Float[Tensor, " n"],
    cfg: TrainConfig,
    gen: torch.Generator,
    progress: bool,
) -> list[float]:
    """Adam on the (weighted) KL, linear learning-rate decay, gradient clipping per
    layer. Returns the mean-over-layers training loss of every step.

    Adam moves every weight by about ``lr`` per step whatever its gradient, which
    is ruinous for weights that multiply the residual's few huge dimensions (massive
    activations): on smollm2 plain Adam on A took the ridge start from a training KL
    of 2.2 to about 16 nats in two steps. So the steps act on a correction in
    standardised coordinates, ``Δ (h - μ) / σ + δ``, folded into A and b at the end.
    """
    if cfg.steps == 0:
        return []
    L, n, d = lens.n_blocks, resid.shape[1], lens.d_model
    rows = min(cfg.batch_positions, n)
    buf = torch.empty(len(layer_groups(L, rows, lens.d_vocab)[0]) * rows * lens.d_vocab)
    mu = torch.stack([resid[l].mean(0) for l in range(L)])  # [L, d]
    sigma = torch.stack([resid[l].std(0) for l in range(L)]).clamp_min(1e-6)
    delta_A = torch.zeros(L, d, d, requires_grad=True)
    delta_b = torch.zeros(L, d, requires_grad=True)
    opt = torch.optim.Adam([delta_A, delta_b], lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / cfg.steps)
    losses: list[float] = []
    bar = tqdm(range(cfg.steps), desc="tuned lens: training", disable=not progress, leave=False)
    running = None
    for _ in bar:
        idx = torch.randint(0, n, (rows,), generator=gen)
        w = weights[idx]
        w = w / w.sum()
        sampled = (cfg.backward_samples, gen) if cfg.backward_samples else None
        gA, gb, total = kl_gradients(lens, readout, resid, idx, w, (mu, sigma), (delta_A, delta_b), buf, sampled)
        # Clip each layer's gradient on its own: layers are independent problems.
        norms = (gA.flatten(1).square().sum(1) + gb.square().sum(1)).sqrt()
        scale = (cfg.grad_clip / (norms + 1e-12)).clamp(max=1.0)
        delta_A.grad = gA * scale[:, None, None]
        delta_b.grad = gb * scale[:, None]
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total / L)
        running = losses[-1] if running is None else 0.9 * running + 0.1 * losses[-1]
        bar.set_postfix(kl=f"{running:.3f}")
    with torch.no_grad():
        # Δ (h - μ)/σ + δ = (Δ/σ) h + (δ - (Δ/σ) μ)
        scaled = delta_A / sigma[:, None, :]
        lens.A += scaled
        lens.b += delta_b - torch.einsum("lij,lj->li", scaled, mu)
    return losses


def kl_gradients(
    lens: TunedLens,
    readout: Readout,
    resid: Float[Tensor, "depth n d_model"],
    idx: Int[Tensor, " pos"],
    w: Float[Tensor, " pos"],
    standardise: tuple[Float[Tensor, "layer d_model"], Float[Tensor, "layer d_model"]],
    deltas: tuple[Float[Tensor, "layer d_model d_model"], Float[Tensor, "layer d_model"]],
    buf: Float[Tensor, " n"] | None = None,
    sampled: tuple[int, torch.Generator] | None = None,
) -> tuple[Float[Tensor, "layer d_model d_model"], Float[Tensor, "layer d_model"], float]:
    """Gradients w.r.t. the corrections ``deltas`` = (Δ, δ) of the training loss
    ``Σ_ℓ Σ_pos w · KL(p_L ‖ q_ℓ) / L`` at positions ``idx``, where lens ℓ reads
    ``translate(h) + Δ_ℓ (h - μ_ℓ) / σ_ℓ + δ_ℓ`` (``standardise`` = (μ, σ)); and the
    sum over layers of the weighted KL. ``buf``: float32 scratch for the logits of
    one group of layers (:func:`layer_groups`). ``sampled`` = (samples, generator):
    take the gradient back through the unembedding as an unbiased sampled estimate
    (:meth:`~depthkit.lens.base.Readout.project_back_sampled`) instead of exactly."""
    mu, sigma = standardise
    delta_A, delta_b = deltas
    L = lens.n_blocks
    groups = layer_groups(L, len(idx), lens.d_vocab)
    if buf is None:
        buf = torch.empty(len(groups[0]) * len(idx) * lens.d_vocab)
    with torch.no_grad():
        logp = torch.log_softmax(readout(resid[-1, idx]), -1)
        p = logp.exp()
        neg_entropy = (p * logp).sum(-1)
    gA = torch.zeros_like(delta_A)
    gb = torch.zeros_like(delta_b)
    total = 0.0
    for g in groups:
        # The layers' losses are independent, so a group's gradient is its own.
        dA = delta_A[g.start : g.stop].detach().requires_grad_()
        db = delta_b[g.start : g.stop].detach().requires_grad_()
        h = resid[g.start : g.stop, idx]  # [layer, pos, d]
        with torch.no_grad():
            base = torch.stack([lens.translate(h[i], l) for i, l in enumerate(g)])
        z_std = (h - mu[g.start : g.stop, None]) / sigma[g.start : g.stop, None]
        x = readout.norm((base + torch.baddbmm(db[:, None], z_std, dA.transpose(1, 2))).to(readout.norm_dtype))
        z = readout.project(x.detach(), out=buf)
        kl = kl_gradient_(readout, z, p, neg_entropy, w / L)
        # The model's parameters get no gradient (grads are taken w.r.t. the
        # corrections only), and the unembedding's own gradient, the most expensive
        # product of all, is never formed.
        back = readout.project_back(z) if sampled is None else readout.project_back_sampled(z, *sampled)
        gA[g.start : g.stop], gb[g.start : g.stop] = torch.autograd.grad(x, (dA, db), back.to(x.dtype))
        total += float((w * kl).sum())
    return gA, gb, total


@torch.no_grad()
def kl_gradient_(
    readout: Readout,
    z: Float[Tensor, "layer pos d_vocab"],
    p: Float[Tensor, "pos d_vocab"],
    neg_entropy: Float[Tensor, " pos"],
    w: Float[Tensor, " pos"],
) -> Float[Tensor, "layer pos"]:
    """KL(p ‖ softmax(cap(z))) per layer and position, for logits ``z`` before the
    soft-cap; ``z`` is overwritten, in place, with the gradient of
    ``Σ_pos w · KL`` w.r.t. it: ``w (q - p)``, times the soft-cap's derivative.
    By hand rather than by autograd: autograd's log-softmax keeps several
    vocabulary-sized tensors per layer, and on CPU each pass over them costs about
    as much as a tenth of the unembedding product."""
    slope = None
    if readout.softcap > 0:
        readout.cap_(z)
        slope = 1 - (z / readout.softcap).square()  # d cap(u) / du, from cap(u)
    cross = torch.einsum("nv,gnv->gn", p, z)
    top = z.amax(-1, keepdim=True)
    mass = z.sub_(top).exp_().sum(-1, keepdim=True)
    kl = neg_entropy - cross + (top + mass.log()).squeeze(-1)
    z.mul_(w[:, None] / mass).sub_(p * w[:, None])
    if slope is not None:
        z.mul_(slope)
    return kl
