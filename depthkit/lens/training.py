"""Training a tuned lens on CPU.

A :class:`TunedLens` puts one affine *translator* in front of the model's own
readout at every layer ℓ < L: ``h ↦ h + A_ℓ h + b_ℓ``. With ``A = b = 0`` it is
exactly the logit lens. Training minimises KL(p_L ‖ q_ℓ) over ordinary text
positions (the final distribution is the target, the lens distribution the
model of it), as in the tuned-lens paper (Belrose et al. 2023); see the book's methods page for the reference recipe
and why we cannot afford it on two CPU cores.

What makes it affordable here:

* residuals of every layer are cached once for a fixed token budget; the target
  distribution is recomputed from the cached *final residual* on the fly (one
  extra unembedding per position instead of storing N x vocab log-probabilities);
* a closed-form start: per layer, a ridge regression from h_ℓ to the
  RMS-normalised final residual (the readout is scale-invariant, so the scale of
  the target does not matter). On smollm2-135m this alone cuts the held-out KL
  by 65-96 % at every layer, but it minimises squared error, not the KL;
* Adam steps on the KL itself (``steps``; 100 in the default budget), in
  standardised coordinates (see :func:`_adam`). The layers' logits are stacked
  into one unembedding product per group of layers that fits
  :data:`LOGIT_BUDGET_MB`, and the KL's gradient w.r.t. the logits, ``w (q - p)``,
  is formed by hand in that buffer (:func:`kl_gradient_`, tested against
  autograd); the unembedding products run in bfloat16 where a probe finds that
  safe and faster (see :mod:`depthkit.engine.precision`);
* held-out metrics with bfloat16 products too; each run records how far they are
  from float32 on a slice (``eval_dtype_check`` in the sidecar).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from depthkit.data.corpus import passage_digest
from depthkit.engine.precision import matmul_dtype
from depthkit.lens.base import Lens, Readout, TunedLens
from depthkit.lens.training_data import (
    FORMAT_VERSION,
    Downweight,
    LensTrainingData,
    ResidualCache,
    TrainConfig,
    as_texts,
    config_hash,
    default_texts,
    resolve_config,
    texts_digest,
)

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

# ---------------------------------------------------------------------------
# Metrics


# Positions per chunk of the held-out metrics.
EVAL_CHUNK = 256
# Most float32 logits alive at once, in training and in the held-out metrics.
# Layers are stacked into one unembedding product up to this size: on two CPU cores
# a product of ~2,500 rows runs about a third faster than one per layer's 128.
LOGIT_BUDGET_MB = 512.0


def layer_groups(n_layers: int, rows: int, d_vocab: int, budget_mb: float | None = None) -> list[range]:
    """Consecutive layers whose logits for ``rows`` positions fit ``budget_mb``
    (default :data:`LOGIT_BUDGET_MB`) together, at least one layer a group."""
    budget = LOGIT_BUDGET_MB if budget_mb is None else budget_mb
    size = max(1, min(n_layers, int(budget * 2**20 // (4 * rows * d_vocab))))
    return [range(a, min(n_layers, a + size)) for a in range(0, n_layers, size)]


def _product_rows(n_layers: int, rows: Sequence[int], d_vocab: int) -> tuple[int, ...]:
    """Row counts of the stacked unembedding products for chunks of ``rows`` positions
    (what the bfloat16 probe must run)."""
    return tuple(sorted({len(g) * r for r in rows if r > 0 for g in layer_groups(n_layers, r, d_vocab)}))


def _dtype_check_positions(n_held: int) -> int:
    """Positions of the float32 cross-check of bfloat16 metrics: a float32 pass costs
    as much as several bfloat16 ones, so 16 for the smoke budget, 128 by default."""
    return min(n_held, 128, max(16, n_held // 16))


@torch.no_grad()
def heldout_metrics(
    lens: Lens,
    resid: Float[Tensor, "depth n d_model"],
    *,
    chunk: int = EVAL_CHUNK,
    dtype: torch.dtype = torch.float32,
    variants: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Per layer ℓ < L: mean KL(p_L ‖ q_ℓ) in nats and the share of positions whose
    lens top-1 equals the final top-1, over the positions of ``resid`` (depths 0..L).
    ``dtype`` is that of the unembedding product (softmax and sums are float32 or
    wider). A :class:`TunedLens` is scored with and without its translators (rows
    "tuned" and "logit", or those named in ``variants``); any other lens as itself."""
    readout = Readout(lens.model, dtype)
    n_blocks, n = resid.shape[0] - 1, resid.shape[1]
    if variants is None:
        variants = ["logit", "tuned"] if isinstance(lens, TunedLens) else [lens.name]
    kl = {v: torch.zeros(n_blocks, dtype=torch.float64) for v in variants}
    agree = {v: torch.zeros(n_blocks, dtype=torch.float64) for v in variants}
    groups = layer_groups(n_blocks, min(chunk, n), lens.d_vocab)
    # KL(p ‖ q) = Σ p log p - Σ p z + logsumexp(z): no log-softmax of z is formed; the
    # logits of a group of layers live in one reused buffer, overwritten by exp(z - max).
    buf = torch.empty(len(groups[0]) * min(chunk, n) * lens.d_vocab)
    for s in range(0, n, chunk):
        sl = slice(s, min(n, s + chunk))
        zf = readout(resid[-1, sl])
        top_final = zf.argmax(-1)
        p_final = torch.softmax(zf, -1)
        neg_entropy = torch.einsum("nv,nv->n", p_final, zf) - torch.logsumexp(zf, -1)
        del zf
        for g in groups:
            for v in variants:
                if v == "logit":
                    h = resid[g.start : g.stop, sl]
                else:
                    h = torch.stack([lens.translate(resid[l, sl], l) for l in g])
                z = readout(h, out=buf)  # [layer, pos, vocab]
                top, arg = z.max(-1)
                cross = torch.einsum("nv,gnv->gn", p_final, z)
                lse = top + torch.log(z.sub_(top[..., None]).exp_().sum(-1))
                kl[v][g.start : g.stop] += (neg_entropy - cross + lse).clamp_min(0).double().sum(-1)
                agree[v][g.start : g.stop] += (arg == top_final).double().sum(-1)
    rows = [
        {"layer": l, "lens": v, "kl": float(kl[v][l] / n), "top1_agreement": float(agree[v][l] / n)}
        for v in variants
        for l in range(n_blocks)
    ]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------
# Training


def _downweight_ids(model: Model, which: str) -> list[int]:
    tok = model.tokenizer
    if which == "the":
        ids = list(tok(" the", add_special_tokens=False)["input_ids"])
        if len(ids) != 1:
            raise ValueError(f"' the' is {len(ids)} tokens for this tokenizer; the 'the' down-weighting needs a single token.")
        return ids
    from depthkit.data.token_counts import token_frequencies

    freq = token_frequencies(tok)
    return [int(i) for i in freq.sort_values("rank")["token_id"].head(10)]


@torch.no_grad()
def _final_top1(readout: Readout, h_final: Float[Tensor, "n d_model"], chunk: int = 512) -> Int[Tensor, " n"]:
    return torch.cat([readout(h_final[s : s + chunk]).argmax(-1) for s in range(0, h_final.shape[0], chunk)])


@torch.no_grad()
def _ridge_init(
    lens: TunedLens, resid: Float[Tensor, "depth n d_model"], weights: Float[Tensor, " n"], ridge: float
) -> None:
    """Per layer, the weighted ridge regression of the RMS-normalised final residual
    on h_ℓ (intercept unpenalised), written as A = Wᵀ - I, b = intercept."""
    d = resid.shape[-1]
    y = resid[-1]
    y = y * (math.sqrt(d) / y.norm(dim=-1, keepdim=True).clamp_min(1e-12))
    w = (weights / weights.sum())[:, None]
    y_mean = (w * y).sum(0)
    yc = y - y_mean
    eye = torch.eye(d, dtype=torch.float64)
    for l in range(lens.n_blocks):
        # Centred float32 products (the slow part) are accurate enough; the solve
        # runs in float64.
        x = resid[l]
        x_mean = (w * x).sum(0)
        xc = x - x_mean
        wx = w * xc
        xtx = (xc.T @ wx).double()
        xty = (wx.T @ yc).double()
        lam = ridge * float(torch.diagonal(xtx).mean())
        W = torch.linalg.solve(xtx + lam * eye, xty)  # [d_in, d_out]
        lens.A.data[l] = (W.T - eye).float()
        lens.b.data[l] = (y_mean.double() - x_mean.double() @ W).float()


def train_tuned_lens(
    model: Model,
    texts: str | Sequence[str] | None = None,
    budget: str | Mapping[str, Any] | TrainConfig = "default",
    seed: int | None = None,
    progress: bool = True,
    downweight: Downweight = None,
    cache: ResidualCache | None = None,
) -> TunedLens:
    """Train a tuned lens for ``model`` on ``texts`` (default: the embedded Wikipedia
    passages). ``budget``: "default" (the benchmark's recipe), "smoke" (seconds) or
    a dict of :class:`TrainConfig` fields. ``downweight``: weight positions whose
    final top-1 is " the" ("the") or one of the Top-10 tokens ("top10") by
    ``downweight_factor`` (the paper's lens-bias check). Deterministic under ``seed``.

    The returned lens carries its sidecar in ``.meta`` (config, held-out per-layer
    KL and top-1 agreement for both lenses, timing).

    ``cache``: a :class:`~depthkit.lens.training_data.ResidualCache` of this model, to reuse
    the residuals of an earlier training on the same text and positions (without
    one they are computed for this call only)."""
    cfg = resolve_config(budget, seed=seed, downweight=downweight)
    texts_list = as_texts(texts)
    source = texts_list if texts_list is not None else default_texts()
    info = model.info
    t0, cpu0 = time.perf_counter(), time.process_time()
    load0 = _load_average()
    timing: dict[str, float] = {}
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)

    data: LensTrainingData = (cache or ResidualCache(model)).get(model, texts_list, cfg, progress)
    train, held, resid, resid_held = data.train, data.held, data.resid, data.resid_held
    timing["cache_s"] = time.perf_counter() - t0
    n = resid.shape[1]

    lens = TunedLens(model)
    # bfloat16 only where a child-process probe saw it run, right and faster
    # (a bad kernel kills the process: see depthkit.engine.precision).
    device = lens.model.unembed.W_U.device
    n_held = int(resid_held.shape[1])
    train_rows = (min(cfg.batch_positions, n),) if cfg.steps > 0 else ()
    eval_rows = (min(EVAL_CHUNK, n_held), n_held % EVAL_CHUNK, _dtype_check_positions(n_held))
    # The final layer's readout runs per chunk, every other layer's stacked.
    rows = tuple(sorted({*train_rows, *eval_rows, *_product_rows(lens.n_blocks, train_rows + eval_rows, info.d_vocab)} - {0}))
    dtype, train_verdict = matmul_dtype(cfg.matmul_dtype, lens.d_model, info.d_vocab, device, rows)
    fast = Readout(model, dtype)
    weights = torch.ones(n)
    down_ids: list[int] = []
    if cfg.downweight:
        down_ids = _downweight_ids(model, cfg.downweight)
        top1 = _final_top1(Readout(model, torch.float32), resid[-1])
        weights[torch.isin(top1, torch.tensor(down_ids))] = cfg.downweight_factor
    t1 = time.perf_counter()
    if cfg.init == "ridge":
        _ridge_init(lens, resid, weights, cfg.ridge)
    timing["init_s"] = time.perf_counter() - t1

    eval_dtype, eval_verdict = matmul_dtype(cfg.eval_dtype, lens.d_model, info.d_vocab, device, rows)
    t3 = time.perf_counter()
    metrics_init = None
    if cfg.init == "ridge" and cfg.steps > 0:
        # Recorded so the sidecar shows what the Adam steps add to the closed form.
        metrics_init = heldout_metrics(lens, resid_held, dtype=eval_dtype, variants=["tuned"])
    timing["eval_s"] = time.perf_counter() - t3

    t2 = time.perf_counter()
    losses = _adam(lens, fast, resid, weights, cfg, gen, progress)
    timing["train_s"] = time.perf_counter() - t2

    t3 = time.perf_counter()
    dkey = str(eval_dtype)
    if dkey not in data.logit_metrics:
        data.logit_metrics[dkey] = heldout_metrics(lens, resid_held, dtype=eval_dtype, variants=["logit"])
    metrics = pd.concat([data.logit_metrics[dkey], heldout_metrics(lens, resid_held, dtype=eval_dtype, variants=["tuned"])], ignore_index=True)
    timing["eval_s"] += time.perf_counter() - t3
    eval_check = None
    if eval_dtype != torch.float32:
        # How far the bfloat16 metrics are from float32 ones, on a slice.
        t4 = time.perf_counter()
        sub = resid_held[:, : _dtype_check_positions(n_held)]
        a, b = heldout_metrics(lens, sub, dtype=eval_dtype), heldout_metrics(lens, sub)
        eval_check = {
            "positions": int(sub.shape[1]),
            "max_abs_kl_diff": float((a["kl"] - b["kl"]).abs().max()),
            "max_abs_agreement_diff": float((a["top1_agreement"] - b["top1_agreement"]).abs().max()),
        }
        timing["eval_check_s"] = time.perf_counter() - t4
    timing["total_s"] = time.perf_counter() - t0
    # CPU seconds of all this process's threads: on a machine shared with other jobs,
    # cpu_s / torch threads estimates the wall time the same run takes when quiet.
    timing["cpu_s"] = time.process_time() - cpu0
    lens.meta = {
        "format": FORMAT_VERSION,
        "model": info.as_dict(),
        "config": dataclasses.asdict(cfg),
        "config_hash": config_hash(cfg, info, texts_list),
        "texts": texts_digest(texts_list),
        "shapes": {"A": list(lens.A.shape), "b": list(lens.b.shape)},
        "n_train_positions": n,
        "n_heldout_positions": int(resid_held.shape[1]),
        # Indices into the training texts, and the digests of those passages
        # (depthkit.data.embedded.passage_digest), so any analysis can check it avoids them.
        "train_passages": train.passages,
        "heldout_passages": held.passages,
        "train_passage_digests": [passage_digest(source[j]) for j in train.passages],
        "downweighted_token_ids": down_ids,
        "downweighted_share": float((weights < 1).float().mean()),
        "heldout": metrics.to_dict("records"),
        "eval_dtype_check": eval_check,
        # What ran, which may be float32 where the config asked for bfloat16.
        "dtypes_used": {"train": str(dtype).removeprefix("torch."), "eval": str(eval_dtype).removeprefix("torch.")},
        "bf16_probe": (train_verdict or eval_verdict).as_dict() if (train_verdict or eval_verdict) else None,
        "heldout_after_init": None if metrics_init is None else metrics_init.to_dict("records"),
        "train_loss": losses,
        "timing": timing,
        "load_average": {"start": load0, "end": _load_average()},
        "torch_threads": torch.get_num_threads(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return lens


def _adam(
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
        gA, gb, total = kl_gradients(lens, readout, resid, idx, w, (mu, sigma), (delta_A, delta_b), buf)
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
) -> tuple[Float[Tensor, "layer d_model d_model"], Float[Tensor, "layer d_model"], float]:
    """Gradients w.r.t. the corrections ``deltas`` = (Δ, δ) of the training loss
    ``Σ_ℓ Σ_pos w · KL(p_L ‖ q_ℓ) / L`` at positions ``idx``, where lens ℓ reads
    ``translate(h) + Δ_ℓ (h - μ_ℓ) / σ_ℓ + δ_ℓ`` (``standardise`` = (μ, σ)); and the
    sum over layers of the weighted KL. ``buf``: float32 scratch for the logits of
    one group of layers (:func:`layer_groups`)."""
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
        gA[g.start : g.stop], gb[g.start : g.stop] = torch.autograd.grad(x, (dA, db), readout.project_back(z).to(x.dtype))
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


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
