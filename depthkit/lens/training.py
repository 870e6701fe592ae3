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
  standardised coordinates (see :func:`~depthkit.lens.training_steps.adam_steps`). The layers' logits are stacked
  into one unembedding product per group of layers that fits
  :data:`LOGIT_BUDGET_MB`, and the KL's gradient w.r.t. the logits, ``w (q - p)``,
  is formed by hand in that buffer (:func:`kl_gradient_`, tested against
  autograd); the unembedding products run in bfloat16 where a probe finds that
  safe and faster (see :mod:`depthkit.engine.precision`);
* held-out metrics with bfloat16 products too; each run records how far they are
  from float32 on a slice (``eval_dtype_check`` in the sidecar).

This module holds the ridge start and the run as a whole; the Adam steps are in
:mod:`depthkit.lens.training_steps`, the held-out metrics and the logit budget in
:mod:`depthkit.lens.training_metrics` (their names are importable from here too).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from depthkit.data.corpus import passage_digest
from depthkit.engine.precision import matmul_dtype
from depthkit.lens.base import Readout, TunedLens
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
from depthkit.lens.training_metrics import EVAL_CHUNK, _dtype_check_positions, _product_rows, heldout_metrics, layer_groups
from depthkit.lens.training_steps import adam_steps, kl_gradient_, kl_gradients

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

__all__ = ["EVAL_CHUNK", "adam_steps", "heldout_metrics", "kl_gradient_", "kl_gradients", "layer_groups", "train_tuned_lens"]


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
def _ridge_init(lens: TunedLens, resid: Float[Tensor, "depth n d_model"], weights: Float[Tensor, " n"], ridge: float) -> None:
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
    start: TunedLens | None = None,
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
    one they are computed for this call only).

    ``start``: the trained lens that a budget with ``init="lens"`` (e.g. "finetune")
    continues from, instead of the ridge start; ignored by other budgets."""
    cfg = resolve_config(budget, seed=seed, downweight=downweight, start=start_hash(budget, start))
    texts_list = as_texts(texts)
    source = texts_list if texts_list is not None else default_texts()
    info = model.info
    t0, cpu0 = time.perf_counter(), time.process_time()
    load0 = _load_average()
    timing: dict[str, float] = {}
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)

    data: LensTrainingData = (cache or ResidualCache(model)).get(model, texts_list, cfg, progress)
    timing["cache_s"] = time.perf_counter() - t0
    lens = TunedLens(model)
    if cfg.init == "lens":
        _continue_from(lens, start, cfg)
    fit = _fit(lens, model, data, cfg, gen, progress, timing)
    timing["total_s"] = time.perf_counter() - t0
    # CPU seconds of all this process's threads: on a machine shared with other jobs,
    # cpu_s / torch threads estimates the wall time the same run takes when quiet.
    timing["cpu_s"] = time.process_time() - cpu0
    lens.meta = _sidecar(lens, info, cfg, texts_list, source, data, fit, timing, load0)
    return lens


def start_hash(budget: str | Mapping[str, Any] | TrainConfig, start: TunedLens | None) -> str | None:
    """The config hash of ``start`` where ``budget`` continues from a lens, else None."""
    if resolve_config(budget).init != "lens":
        return None
    if start is None:
        raise ValueError(
            f"The tuned-lens budget {budget!r} continues from a trained lens (init='lens'): pass that lens as "
            "start=..., e.g. get_tuned_lens(model, budget, downweight='the', start=get_tuned_lens(model))."
        )
    saved = start.meta.get("config_hash")
    if not saved:
        raise ValueError("The start lens has no config hash in its sidecar (.meta): start from a lens that depthkit trained and saved.")
    return str(saved)


# The TrainConfig fields that choose a lens's training positions.
_POSITION_FIELDS = ("train_tokens", "heldout_tokens", "seq_len", "seed")


@torch.no_grad()
def _continue_from(lens: TunedLens, start: TunedLens | None, cfg: TrainConfig) -> None:
    if start is None or start.meta.get("config_hash") != cfg.start:
        raise ValueError(f"init='lens' needs the lens whose config hash is {cfg.start}; pass it as start=.")
    if start.A.shape != lens.A.shape:
        raise ValueError(f"The start lens has translators of shape {tuple(start.A.shape)}, this model needs {tuple(lens.A.shape)}.")
    lens.A.copy_(start.A)
    lens.b.copy_(start.b)
    # Continuing on other positions still works, but it is no longer "the same lens,
    # re-weighted": say so rather than let a bias check compare unlike lenses.
    was = {k: (start.meta.get("config") or {}).get(k) for k in _POSITION_FIELDS}
    now = {k: getattr(cfg, k) for k in _POSITION_FIELDS}
    if was != now:
        differ = ", ".join(f"{k} {was[k]} there, {now[k]} here" for k in _POSITION_FIELDS if was[k] != now[k])
        warnings.warn(
            f"The start lens was trained on other positions than this lens continues on ({differ}); give both budgets "
            f"the same {', '.join(_POSITION_FIELDS)} to continue on the positions the start lens was trained on.",
            stacklevel=3,
        )


@dataclass
class _Fit:
    """What fitting a lens found and used, for its sidecar."""

    dtype: torch.dtype
    eval_dtype: torch.dtype
    probe: Any  # the bfloat16 probe's verdict, None where none ran
    weights: Float[Tensor, " n"]
    down_ids: list[int]
    metrics_init: pd.DataFrame | None
    losses: list[float]
    metrics: pd.DataFrame
    eval_check: dict[str, Any] | None


def _fit(
    lens: TunedLens, model: Model, data: LensTrainingData, cfg: TrainConfig, gen: torch.Generator, progress: bool,
    timing: dict[str, float],
) -> _Fit:  # fmt: skip
    """Ridge start, Adam steps and held-out metrics of ``lens`` on ``data``, timed into ``timing``."""
    resid, resid_held = data.resid, data.resid_held
    d_vocab = model.info.d_vocab
    n = resid.shape[1]
    # bfloat16 only where a child-process probe saw it run, right and faster
    # (a bad kernel kills the process: see depthkit.engine.precision).
    device = model.backend.out_device
    n_held = int(resid_held.shape[1])
    train_rows = (min(cfg.batch_positions, n),) if cfg.steps > 0 else ()
    eval_rows = (min(EVAL_CHUNK, n_held), n_held % EVAL_CHUNK, _dtype_check_positions(n_held))
    # The final layer's readout runs per chunk, every other layer's stacked.
    rows = tuple(sorted({*train_rows, *eval_rows, *_product_rows(lens.n_blocks, train_rows + eval_rows, d_vocab)} - {0}))
    dtype, train_verdict = matmul_dtype(cfg.matmul_dtype, lens.d_model, d_vocab, device, rows)
    fast = Readout(model, dtype)
    weights, down_ids = _position_weights(model, cfg, data)
    t1 = time.perf_counter()
    if cfg.init == "ridge":
        _ridge_init(lens, resid, weights, cfg.ridge)
    timing["init_s"] = time.perf_counter() - t1

    eval_dtype, eval_verdict = matmul_dtype(cfg.eval_dtype, lens.d_model, d_vocab, device, rows)
    t3 = time.perf_counter()
    metrics_init = None
    if cfg.init == "ridge" and cfg.steps > 0:
        # Recorded so the sidecar shows what the Adam steps add to the closed form.
        metrics_init = heldout_metrics(lens, resid_held, dtype=eval_dtype, variants=["tuned"])
    timing["eval_s"] = time.perf_counter() - t3

    t2 = time.perf_counter()
    losses = adam_steps(lens, fast, resid, weights, cfg, gen, progress)
    timing["train_s"] = time.perf_counter() - t2
    metrics, eval_check = _final_metrics(lens, data, eval_dtype, timing)
    return _Fit(dtype, eval_dtype, train_verdict or eval_verdict, weights, down_ids, metrics_init, losses, metrics, eval_check)


def _position_weights(model: Model, cfg: TrainConfig, data: LensTrainingData) -> tuple[Float[Tensor, " n"], list[int]]:
    """Training weight of every position (down-weighted where ``cfg`` says), and the
    token ids whose positions are down-weighted."""
    weights = torch.ones(data.resid.shape[1])
    down_ids: list[int] = []
    if cfg.downweight:
        down_ids = _downweight_ids(model, cfg.downweight)
        if data.final_top1 is None:
            data.final_top1 = _final_top1(Readout(model, torch.float32), data.resid[-1])
        weights[torch.isin(data.final_top1, torch.tensor(down_ids))] = cfg.downweight_factor
    return weights, down_ids


def _final_metrics(
    lens: TunedLens, data: LensTrainingData, eval_dtype: torch.dtype, timing: dict[str, float]
) -> tuple[pd.DataFrame, dict[str, Any] | None]:
    """Held-out metrics of the trained lens and of the logit lens (kept in ``data``
    for the next lens trained on it), and how far they are from float32 ones."""
    resid_held = data.resid_held
    t3 = time.perf_counter()
    dkey = str(eval_dtype)
    if dkey not in data.logit_metrics:
        data.logit_metrics[dkey] = heldout_metrics(lens, resid_held, dtype=eval_dtype, variants=["logit"])
    metrics = pd.concat(
        [data.logit_metrics[dkey], heldout_metrics(lens, resid_held, dtype=eval_dtype, variants=["tuned"])], ignore_index=True
    )
    timing["eval_s"] += time.perf_counter() - t3
    eval_check = None
    if eval_dtype != torch.float32:
        # How far the bfloat16 metrics are from float32 ones, on a slice.
        t4 = time.perf_counter()
        sub = resid_held[:, : _dtype_check_positions(int(resid_held.shape[1]))]
        a, b = heldout_metrics(lens, sub, dtype=eval_dtype), heldout_metrics(lens, sub)
        eval_check = {
            "positions": int(sub.shape[1]),
            "max_abs_kl_diff": float((a["kl"] - b["kl"]).abs().max()),
            "max_abs_agreement_diff": float((a["top1_agreement"] - b["top1_agreement"]).abs().max()),
        }
        timing["eval_check_s"] = time.perf_counter() - t4
    return metrics, eval_check


def _sidecar(
    lens: TunedLens, info: Any, cfg: TrainConfig, texts_list: list[str] | None, source: Sequence[str], data: LensTrainingData,
    fit: _Fit, timing: dict[str, float], load0: list[float] | None,
) -> dict[str, Any]:  # fmt: skip
    """The ``.meta`` of a trained lens, saved next to it."""
    return {
        "format": FORMAT_VERSION,
        "model": info.as_dict(),
        "config": dataclasses.asdict(cfg),
        "config_hash": config_hash(cfg, info, texts_list),
        "texts": texts_digest(texts_list),
        "shapes": {"A": list(lens.A.shape), "b": list(lens.b.shape)},
        "n_train_positions": data.resid.shape[1],
        "n_heldout_positions": int(data.resid_held.shape[1]),
        # Indices into the training texts, and the digests of those passages
        # (depthkit.data.embedded.passage_digest), so any analysis can check it avoids them.
        "train_passages": data.train.passages,
        "heldout_passages": data.held.passages,
        "train_passage_digests": [passage_digest(source[j]) for j in data.train.passages],
        "downweighted_token_ids": fit.down_ids,
        "downweighted_share": float((fit.weights < 1).float().mean()),
        "heldout": fit.metrics.to_dict("records"),
        "eval_dtype_check": fit.eval_check,
        # What ran, which may be float32 where the config asked for bfloat16.
        "dtypes_used": {"train": str(fit.dtype).removeprefix("torch."), "eval": str(fit.eval_dtype).removeprefix("torch.")},
        "bf16_probe": fit.probe.as_dict() if fit.probe else None,
        "heldout_after_init": None if fit.metrics_init is None else fit.metrics_init.to_dict("records"),
        "train_loss": fit.losses,
        "timing": timing,
        "load_average": {"start": load0, "end": _load_average()},
        "torch_threads": torch.get_num_threads(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
