"""The tuned lens, trained on CPU.

A :class:`TunedLens` puts one affine *translator* in front of the model's own
readout at every layer ℓ < L: ``h ↦ h + A_ℓ h + b_ℓ``. With ``A = b = 0`` it is
exactly the logit lens. Training minimises KL(p_L ‖ q_ℓ) over ordinary text
positions (the final distribution is the target, the lens distribution the
model of it), as in the tuned-lens paper; see PAPER.md for the reference recipe
and why we cannot afford it on two CPU cores.

What makes it affordable here:

* residuals of every layer are cached once for a fixed token budget; the target
  distribution is recomputed from the cached *final residual* on the fly (one
  extra unembedding per position instead of storing N x vocab log-probabilities);
* a closed-form start: per layer, a ridge regression from h_ℓ to the
  RMS-normalised final residual (the readout is scale-invariant, so the scale of
  the target does not matter). On smollm2-135m this alone cuts the held-out KL
  by 65-96 % at every layer, which is why the default budget stops there;
* optional Adam steps on the KL itself (``steps`` > 0), layer by layer (the
  layers' losses are independent, so each backward pass holds one layer's
  logits), in standardised coordinates (see :func:`_adam`), with the unembedding
  products in bfloat16 (two to three times faster than float32 on these CPUs);
* held-out metrics with bfloat16 products too; each run records how far they are
  from float32 on a slice (``eval_dtype_check`` in the sidecar).

Saved lenses are safetensors weights plus a JSON sidecar in
``<cache>/lenses/<model>/<config-hash>.safetensors|.json`` (cache: env
``DEPTHKIT_CACHE`` or ``~/.cache/depthkit``). Nothing is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from depthkit.cache import atomic_write
from depthkit.cache import cache_dir as default_cache_dir
from depthkit.lenses import Lens
from depthkit.models import ModelInfo, model_info, tokenizer_of
from depthkit.precision import matmul_dtype
from depthkit.results import model_slug

Downweight = Literal["the", "top10"] | None
DOWNWEIGHT_SETS: tuple[str, ...] = ("the", "top10")
FORMAT_VERSION = 1


class LensFileError(ValueError):
    """A saved lens that cannot be used: missing, damaged, not safetensors, or made
    for another model. The message says what is wrong and how to fix it."""


# ---------------------------------------------------------------------------
# The lens


class TunedLens(Lens):
    """Logit lens plus one learned affine translator per layer ℓ < L.

    ``A``: [L, d_model, d_model], ``b``: [L, d_model]; translator ℓ maps
    ``h ↦ h + h @ A[ℓ].T + b[ℓ]``. Both start at zero, so an untrained tuned lens
    *is* the logit lens. The model stays a plain attribute (see :class:`Lens`):
    ``state_dict()`` holds only ``A`` and ``b``.
    """

    name = "tuned"

    def __init__(self, model) -> None:
        super().__init__(model)
        L, d = self.n_blocks, self.d_model
        self.A = torch.nn.Parameter(torch.zeros(L, d, d))
        self.b = torch.nn.Parameter(torch.zeros(L, d))
        self.meta: dict[str, Any] = {}  # sidecar of a trained/saved lens
        self.path: Path | None = None  # where it was loaded from or saved to

    def translate(self, h: Float[Tensor, "... d_model"], translator: int | None) -> Float[Tensor, "... d_model"]:
        if translator is None:
            return h
        if not 0 <= int(translator) < self.n_blocks:
            raise ValueError(f"Translator {translator} does not exist; a tuned lens has translators 0..{self.n_blocks - 1}.")
        A, b = self.A[translator], self.b[translator]
        return h + torch.nn.functional.linear(h.to(A.dtype), A, b)

    def heldout(self) -> pd.DataFrame:
        """Held-out per-layer metrics recorded at training time, tidy: layer, lens
        ("logit" | "tuned"), kl (nats), top1_agreement."""
        rows = self.meta.get("heldout")
        if not rows:
            raise ValueError("This lens has no held-out metrics (it was not trained or loaded from a sidecar).")
        return pd.DataFrame(rows)


# ---------------------------------------------------------------------------
# Training configuration


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a trained lens (hashed into its file name)."""

    train_tokens: int = 16384  # positions cached for training
    heldout_tokens: int = 2048  # positions of other passages, for the metrics
    seq_len: int = 128
    init: Literal["ridge", "zero"] = "ridge"
    ridge: float = 1e-3  # ridge penalty, relative to the mean variance of h_ℓ
    # The closed-form start alone meets the targets on smollm2 (see the benchmark);
    # Adam steps are optional refinement, priced at ~3 s a step there on 2 quiet cores.
    steps: int = 0
    batch_positions: int = 128
    lr: float = 1e-4
    grad_clip: float = 1.0
    matmul_dtype: Literal["bfloat16", "float32"] = "bfloat16"  # training products
    eval_dtype: Literal["bfloat16", "float32"] = "bfloat16"  # held-out metrics
    downweight: str | None = None  # None | "the" | "top10"
    downweight_factor: float = 1e-3
    seed: int = 0

    def validate(self) -> TrainConfig:
        ints = {"train_tokens": 8, "heldout_tokens": 8, "seq_len": 4, "steps": 0, "batch_positions": 1}
        for key, lo in ints.items():
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"Tuned-lens config {key}={v!r}: must be an integer >= {lo}.")
        if self.init not in ("ridge", "zero"):
            raise ValueError(f"Tuned-lens config init={self.init!r}: choose 'ridge' or 'zero'.")
        for key in ("matmul_dtype", "eval_dtype"):
            if getattr(self, key) not in ("bfloat16", "float32"):
                raise ValueError(f"Tuned-lens config {key}={getattr(self, key)!r}: choose 'bfloat16' or 'float32'.")
        if self.downweight not in (None, *DOWNWEIGHT_SETS):
            raise ValueError(f"downweight={self.downweight!r}: choose None, 'the' or 'top10'.")
        for key in ("ridge", "lr", "grad_clip", "downweight_factor"):
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"Tuned-lens config {key}={v!r}: must be a positive number.")
        return self


BUDGETS: dict[str, dict[str, Any]] = {
    # The benchmark's recipe: <= 15 min for smollm2-135m on 2 cores.
    "default": {},
    # Seconds: for CI smoke runs of the chapters. Ridge start + a handful of steps.
    "smoke": dict(train_tokens=384, heldout_tokens=128, seq_len=64, steps=5, batch_positions=32),
}


def resolve_config(budget: str | Mapping[str, Any] | TrainConfig = "default", **overrides: Any) -> TrainConfig:
    """A :class:`TrainConfig` from a budget name, a dict of fields or a config."""
    if isinstance(budget, TrainConfig):
        base = dataclasses.asdict(budget)
    elif isinstance(budget, str):
        if budget not in BUDGETS:
            raise ValueError(f"Unknown tuned-lens budget {budget!r}; choose one of {', '.join(BUDGETS)} or pass a dict of TrainConfig fields.")
        base = dict(BUDGETS[budget])
    elif isinstance(budget, Mapping):
        fields = {f.name for f in dataclasses.fields(TrainConfig)}
        unknown = sorted(set(budget) - fields)
        if unknown:
            raise ValueError(f"Unknown tuned-lens config keys {unknown}; valid keys: {', '.join(sorted(fields))}.")
        base = dict(budget)
    else:
        raise ValueError(f"budget must be 'default', 'smoke', a dict or a TrainConfig, got {type(budget).__name__}.")
    base.update({k: v for k, v in overrides.items() if v is not None or k == "downweight"})
    return TrainConfig(**base).validate()


# ---------------------------------------------------------------------------
# Text -> cached residuals


def _default_texts() -> list[str]:
    from depthkit.data import wikipedia_passages

    return wikipedia_passages()


def _texts_digest(texts: Sequence[str] | None) -> str:
    if texts is None:
        return "wikipedia_passages"
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    return "sha256:" + h.hexdigest()[:16]


def _as_texts(text: str | Sequence[str] | None) -> list[str] | None:
    if text is None:
        return None
    texts = [text] if isinstance(text, str) else list(text)
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    if not texts:
        raise ValueError("No training text: pass a non-empty string or list of strings, or None for the embedded Wikipedia passages.")
    return texts


@dataclass
class _Split:
    sequences: list[list[int]]
    positions: list[list[int]]  # per sequence, the positions that count (ordinary text)
    passages: list[int]  # indices into the texts that this split read from

    @property
    def n_positions(self) -> int:
        return sum(len(p) for p in self.positions)


def _make_splits(model, texts: list[str], cfg: TrainConfig) -> tuple[_Split, _Split]:
    """Pack shuffled passages into sequences of ``seq_len``; the first passages (in
    the seeded order) feed the held-out split, the rest the training split, so the
    two never share a passage. Position 0 of each sequence and special tokens are
    left out: their residuals (attention sinks, BOS) are not ordinary text."""
    tok = tokenizer_of(model)
    with_special = list(tok("a", add_special_tokens=True)["input_ids"])
    plain = list(tok("a", add_special_tokens=False)["input_ids"])
    prefix = with_special[: len(with_special) - len(plain)] if with_special[-len(plain):] == plain else []
    special = set(int(i) for i in getattr(tok, "all_special_ids", []) or [])
    body = cfg.seq_len - len(prefix)
    if body < 2:
        raise ValueError(f"seq_len={cfg.seq_len} is too short for this tokenizer's prefix of {len(prefix)} tokens.")
    order = np.random.default_rng(cfg.seed).permutation(len(texts))

    def build(want: int, start: int) -> tuple[_Split, int]:
        seqs: list[list[int]] = []
        poss: list[list[int]] = []
        stream: list[int] = []
        have, i = 0, start
        while have < want:
            while len(stream) < body and i < len(order):
                stream += list(tok(texts[order[i]] + "\n\n", add_special_tokens=False)["input_ids"])
                i += 1
            if not stream:
                break
            chunk, stream = stream[:body], stream[body:]
            seq = prefix + chunk
            pos = [p for p in range(1, len(seq)) if seq[p] not in special][: want - have]
            if pos:
                seqs.append(seq[: pos[-1] + 1])
                poss.append(pos)
                have += len(pos)
        # Passages only partly used stay out of the other split.
        return _Split(seqs, poss, sorted(int(j) for j in order[start:i])), i

    held, used = build(cfg.heldout_tokens, 0)
    train, _ = build(cfg.train_tokens, used)
    for name, split, want in (("held-out", held, cfg.heldout_tokens), ("training", train, cfg.train_tokens)):
        if split.n_positions < min(want, 8):
            raise ValueError(
                f"The text gives only {split.n_positions} {name} positions ({want} wanted): pass more text "
                "or lower train_tokens / heldout_tokens."
            )
    return train, held


@torch.no_grad()
def _cache_residuals(
    model, split: _Split, desc: str, progress: bool, batch_size: int = 8
) -> Float[Tensor, "depth n d_model"]:
    from depthkit.trajectories import Item, collect_residuals

    n_blocks, d = int(model.cfg.n_layers), int(model.cfg.d_model)
    out = torch.empty(n_blocks + 1, split.n_positions, d)
    at = 0
    bar = tqdm(total=split.n_positions, desc=desc, unit="tok", disable=not progress, leave=False)
    for s in range(0, len(split.sequences), batch_size):
        items = [Item(q, p) for q, p in zip(split.sequences[s : s + batch_size], split.positions[s : s + batch_size])]
        r = collect_residuals(model, items)
        out[:, at : at + r.shape[1]] = r
        at += r.shape[1]
        bar.update(r.shape[1])
    bar.close()
    return out


# Residuals of the most recent training text, kept in memory: the lens variants of
# the bias check (and retraining with another optimiser setting) use the very same
# positions, and caching them is the slowest part of training.
_RESIDUALS: dict[tuple, tuple[_Split, _Split, Tensor, Tensor]] = {}


def _residuals_for(
    model, texts: list[str] | None, cfg: TrainConfig, progress: bool
) -> tuple[_Split, _Split, Float[Tensor, "depth n d_model"], Float[Tensor, "depth m d_model"]]:
    key = (
        model_info(model).fingerprint,
        id(model),
        _texts_digest(texts),
        cfg.train_tokens,
        cfg.heldout_tokens,
        cfg.seq_len,
        cfg.seed,
    )
    if key not in _RESIDUALS:
        _RESIDUALS.clear()
        train, held = _make_splits(model, texts if texts is not None else _default_texts(), cfg)
        resid = _cache_residuals(model, train, "tuned lens: caching residuals", progress)
        resid_held = _cache_residuals(model, held, "tuned lens: caching held-out", progress)
        _RESIDUALS[key] = (train, held, resid, resid_held)
    return _RESIDUALS[key]


def clear_residual_cache() -> None:
    """Free the residuals kept in memory from the last training run."""
    _RESIDUALS.clear()


# ---------------------------------------------------------------------------
# A fast copy of the readout


class _Readout:
    """The model's final norm and unembedding with the unembedding held as a
    contiguous copy in the matmul dtype (TransformerBridge exposes W_U as a
    transposed view, which is several times slower to multiply with on CPU).
    The norm is the model's own module, so every architecture is covered."""

    def __init__(self, lens: Lens, dtype: torch.dtype) -> None:
        model = lens.model
        W = model.unembed.W_U.detach()  # [d_model, d_vocab]
        self.W = W.to(dtype).contiguous()
        b = getattr(model.unembed, "b_U", None)
        self.b = None if b is None or not bool(b.detach().abs().sum() > 0) else b.detach().float()
        self.norm = model.ln_final
        self.norm_dtype = W.dtype  # the model's own precision
        self.softcap = lens.softcap
        self.dtype = dtype

    def __call__(self, h: Float[Tensor, "n d_model"]) -> Float[Tensor, "n d_vocab"]:
        z = (self.norm(h.to(self.norm_dtype)).to(self.dtype) @ self.W).float()
        if self.b is not None:
            z = z + self.b
        if self.softcap > 0:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z


# ---------------------------------------------------------------------------
# Metrics


# Positions per unembedding product in the held-out metrics.
EVAL_CHUNK = 256


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
    readout = _Readout(lens, dtype)
    n_blocks, n = resid.shape[0] - 1, resid.shape[1]
    if variants is None:
        variants = ["logit", "tuned"] if isinstance(lens, TunedLens) else [lens.name]
    kl = {v: torch.zeros(n_blocks, dtype=torch.float64) for v in variants}
    agree = {v: torch.zeros(n_blocks, dtype=torch.float64) for v in variants}
    # KL(p ‖ q) = Σ p log p - Σ p z + logsumexp(z): no log-softmax of z is formed, and
    # exp(z - max) goes into one reused buffer (fresh vocabulary-sized allocations
    # cost page faults on every chunk).
    scratch = torch.empty(min(chunk, n) * readout.W.shape[1])
    for s in range(0, n, chunk):
        sl = slice(s, min(n, s + chunk))
        zf = readout(resid[-1, sl])
        top_final = zf.argmax(-1)
        p_final = torch.softmax(zf, -1)
        neg_entropy = torch.einsum("nv,nv->n", p_final, zf) - torch.logsumexp(zf, -1)
        del zf
        for l in range(n_blocks):
            for v in variants:
                h = resid[l, sl] if v == "logit" else lens.translate(resid[l, sl], l)
                z = readout(h)
                top, arg = z.max(-1)
                e = scratch[: z.numel()].view(z.shape)
                lse = top + torch.log(torch.sub(z, top[:, None], out=e).exp_().sum(-1))
                kl[v][l] += (neg_entropy - torch.einsum("nv,nv->n", p_final, z) + lse).clamp_min(0).double().sum()
                agree[v][l] += (arg == top_final).double().sum()
    rows = [
        {"layer": l, "lens": v, "kl": float(kl[v][l] / n), "top1_agreement": float(agree[v][l] / n)}
        for v in variants
        for l in range(n_blocks)
    ]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------
# Training


def _downweight_ids(model, which: str) -> list[int]:
    tok = tokenizer_of(model)
    if which == "the":
        ids = list(tok(" the", add_special_tokens=False)["input_ids"])
        if len(ids) != 1:
            raise ValueError(f"' the' is {len(ids)} tokens for this tokenizer; the 'the' down-weighting needs a single token.")
        return ids
    from depthkit.frequency import token_frequencies

    freq = token_frequencies(tok)
    return [int(i) for i in freq.sort_values("rank")["token_id"].head(10)]


@torch.no_grad()
def _final_top1(readout: _Readout, h_final: Float[Tensor, "n d_model"], chunk: int = 512) -> Int[Tensor, " n"]:
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
    model,
    texts: str | Sequence[str] | None = None,
    budget: str | Mapping[str, Any] | TrainConfig = "default",
    seed: int = 0,
    progress: bool = True,
    downweight: Downweight = None,
) -> TunedLens:
    """Train a tuned lens for ``model`` on ``texts`` (default: the embedded Wikipedia
    passages). ``budget``: "default" (the benchmark's recipe), "smoke" (seconds) or
    a dict of :class:`TrainConfig` fields. ``downweight``: weight positions whose
    final top-1 is " the" ("the") or one of the Top-10 tokens ("top10") by
    ``downweight_factor`` (PAPER.md item 8). Deterministic under ``seed``.

    The returned lens carries its sidecar in ``.meta`` (config, held-out per-layer
    KL and top-1 agreement for both lenses, timing)."""
    cfg = resolve_config(budget, seed=seed, downweight=downweight)
    texts_list = _as_texts(texts)
    info = model_info(model)
    t0, cpu0 = time.perf_counter(), time.process_time()
    load0 = _load_average()
    timing: dict[str, float] = {}
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)

    train, held, resid, resid_held = _residuals_for(model, texts_list, cfg, progress)
    timing["cache_s"] = time.perf_counter() - t0
    n = resid.shape[1]

    lens = TunedLens(model)
    # bfloat16 only where a child-process probe saw it run, right and faster
    # (a bad kernel kills the process: see depthkit.precision).
    device = lens.model.unembed.W_U.device
    n_held = int(resid_held.shape[1])
    train_rows = (min(cfg.batch_positions, n),) if cfg.steps > 0 else ()
    eval_rows = (min(EVAL_CHUNK, n_held), n_held % EVAL_CHUNK, _dtype_check_positions(n_held))
    dtype, train_verdict = matmul_dtype(cfg.matmul_dtype, lens.d_model, info.d_vocab, device, train_rows + eval_rows)
    fast = _Readout(lens, dtype)
    weights = torch.ones(n)
    down_ids: list[int] = []
    if cfg.downweight:
        down_ids = _downweight_ids(model, cfg.downweight)
        top1 = _final_top1(_Readout(lens, torch.float32), resid[-1])
        weights[torch.isin(top1, torch.tensor(down_ids))] = cfg.downweight_factor
    t1 = time.perf_counter()
    if cfg.init == "ridge":
        _ridge_init(lens, resid, weights, cfg.ridge)
    timing["init_s"] = time.perf_counter() - t1

    eval_dtype, eval_verdict = matmul_dtype(cfg.eval_dtype, lens.d_model, info.d_vocab, device, train_rows + eval_rows)
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
    metrics = heldout_metrics(lens, resid_held, dtype=eval_dtype)
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
        "texts": _texts_digest(texts_list),
        "shapes": {"A": list(lens.A.shape), "b": list(lens.b.shape)},
        "n_train_positions": n,
        "n_heldout_positions": int(resid_held.shape[1]),
        # Indices into the training texts (for the default texts: passage ids of
        # depthkit.data.wikipedia_passages()), so analyses can avoid training text.
        "train_passages": train.passages,
        "heldout_passages": held.passages,
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
    readout: _Readout,
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
    mu = torch.stack([resid[l].mean(0) for l in range(L)])  # [L, d]
    sigma = torch.stack([resid[l].std(0) for l in range(L)]).clamp_min(1e-6)
    delta_A = torch.zeros(L, d, d, requires_grad=True)
    delta_b = torch.zeros(L, d, requires_grad=True)
    opt = torch.optim.Adam([delta_A, delta_b], lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / cfg.steps)
    # The model's parameters must receive no gradient: grads are taken w.r.t. the
    # corrections only (torch.autograd.grad), which also skips the unembedding's
    # weight gradient, the most expensive product of all.
    losses: list[float] = []
    bar = tqdm(range(cfg.steps), desc="tuned lens: training", disable=not progress, leave=False)
    running = None
    for _ in bar:
        idx = torch.randint(0, n, (min(cfg.batch_positions, n),), generator=gen)
        w = weights[idx]
        w = w / w.sum()
        with torch.no_grad():
            logp = torch.log_softmax(readout(resid[-1, idx]), -1)
            p = logp.exp()
            neg_entropy = (p * logp).sum(-1)
        gA = torch.zeros_like(delta_A)
        gb = torch.zeros_like(delta_b)
        total = 0.0
        for l in range(L):
            dA = delta_A[l].detach().requires_grad_()
            db = delta_b[l].detach().requires_grad_()
            h = resid[l, idx]
            with torch.no_grad():
                base = lens.translate(h, l)
            z = (h - mu[l]) / sigma[l]
            logq = torch.log_softmax(readout(base + torch.nn.functional.linear(z, dA, db)), -1)
            kl = neg_entropy - (p * logq).sum(-1)
            loss = (w * kl).sum() / L
            gA[l], gb[l] = torch.autograd.grad(loss, (dA, db))
            total += float(loss.detach()) * L
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


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ---------------------------------------------------------------------------
# Saving and loading


def config_hash(cfg: TrainConfig, info: ModelInfo, texts: Sequence[str] | None) -> str:
    """Identifies what a lens was trained from: config, model weights, training text."""
    key = {
        "format": FORMAT_VERSION,
        "config": dataclasses.asdict(cfg),
        "fingerprint": info.fingerprint,
        "texts": _texts_digest(texts),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def lens_path(model, cfg: TrainConfig, texts: Sequence[str] | None = None, cache_dir: str | os.PathLike | None = None) -> Path:
    info = model_info(model)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / "lenses" / model_slug(info.name) / f"{config_hash(cfg, info, texts)}.safetensors"


def save_lens(lens: TunedLens, path: str | os.PathLike) -> Path:
    """Write ``path`` (.safetensors) and its sidecar ``path.with_suffix('.json')``,
    each atomically. The sidecar records the weights file's SHA-256, so a file
    changed or cut short afterwards is recognised on load."""
    from safetensors.torch import save

    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"Save a lens to a .safetensors path, got {path}.")
    info = model_info(lens.model)
    tensors = {"A": lens.A.detach().float().contiguous(), "b": lens.b.detach().float().contiguous()}
    data = save(tensors, metadata={"depthkit": "tuned_lens", "model": info.name, "fingerprint": info.fingerprint})
    meta = dict(lens.meta)
    meta.setdefault("format", FORMAT_VERSION)
    meta.setdefault("model", info.as_dict())
    meta["shapes"] = {k: list(v.shape) for k, v in tensors.items()}
    meta["weights_sha256"] = hashlib.sha256(data).hexdigest()
    atomic_write(path, data)
    atomic_write(path.with_suffix(".json"), json.dumps(meta, indent=1, sort_keys=True).encode())
    lens.meta, lens.path = meta, path
    return path


_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")


def load_lens(model, path: str | os.PathLike) -> TunedLens:
    """Load a saved tuned lens for ``model``, refusing (with :class:`LensFileError`)
    anything that does not fit: a missing or unreadable file, a pickle or zip
    payload, weights that do not match their sidecar (changed or truncated), wrong
    shapes, or a lens trained for another model."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    path = Path(path)
    if path.suffix == ".json":
        path = path.with_suffix(".safetensors")
    fix = f"Delete {path} and {path.with_suffix('.json')} and train the lens again (get_tuned_lens does both)."
    if not path.is_file():
        raise LensFileError(f"No saved lens at {path}. Train one with depthkit.tuned_lens.get_tuned_lens(model).")
    data = path.read_bytes()
    if data.startswith(_PICKLE_MAGIC):
        raise LensFileError(
            f"{path} holds a Python pickle / torch.save payload, not safetensors. depthkit never unpickles files "
            f"(that can run arbitrary code). {fix}"
        )
    sidecar = path.with_suffix(".json")
    if not sidecar.is_file():
        raise LensFileError(f"The sidecar {sidecar} of {path} is missing, so the lens cannot be checked. {fix}")
    try:
        meta = json.loads(sidecar.read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as err:
        raise LensFileError(f"The sidecar {sidecar} is not valid JSON ({err}). {fix}") from None
    digest = hashlib.sha256(data).hexdigest()
    if meta.get("weights_sha256") != digest:
        raise LensFileError(
            f"{path} does not match its sidecar (SHA-256 {digest[:12]}… vs {str(meta.get('weights_sha256'))[:12]}…): "
            f"the weights were changed, cut short or belong to another sidecar. {fix}"
        )
    try:
        tensors = load(data)
    except (SafetensorError, ValueError, RuntimeError) as err:
        raise LensFileError(f"{path} is not a readable safetensors file ({err}). {fix}") from None
    info = model_info(model)
    saved = meta.get("model") or {}
    if saved.get("fingerprint") != info.fingerprint or saved.get("name") != info.name:
        raise LensFileError(
            f"{path} is a tuned lens for model {saved.get('name')!r} (weights fingerprint {saved.get('fingerprint')}), "
            f"not for {info.name!r} ({info.fingerprint}). Use a lens trained for this model: "
            f"get_tuned_lens(model) trains and caches one."
        )
    lens = TunedLens(model)
    want = {"A": tuple(lens.A.shape), "b": tuple(lens.b.shape)}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if got != want or {k: tuple(v) for k, v in (meta.get("shapes") or {}).items()} != want:
        raise LensFileError(f"{path} has tensors {got}, this model needs {want}. {fix}")
    for k, v in tensors.items():
        if not torch.isfinite(v).all():
            raise LensFileError(f"{path}: tensor {k} holds NaN or infinite values. {fix}")
    with torch.no_grad():
        lens.A.copy_(tensors["A"])
        lens.b.copy_(tensors["b"])
    lens.meta, lens.path = meta, path
    return lens


def get_tuned_lens(
    model,
    budget: str | Mapping[str, Any] | TrainConfig = "default",
    text: str | Sequence[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    downweight: Downweight = None,
    seed: int = 0,
) -> TunedLens:
    """A tuned lens for ``model``: the saved one for this model, budget, text,
    down-weighting and seed if there is one, otherwise trained now and saved
    (``<cache>/lenses/<model>/<hash>.safetensors``). A saved file that is damaged
    raises :class:`LensFileError` saying which file to delete."""
    cfg = resolve_config(budget, seed=seed, downweight=downweight)
    texts = _as_texts(text)
    path = lens_path(model, cfg, texts, cache_dir)
    if path.exists():
        return load_lens(model, path)
    lens = train_tuned_lens(model, texts, cfg, seed=cfg.seed, progress=progress, downweight=cfg.downweight)
    save_lens(lens, path)
    return lens


# ---------------------------------------------------------------------------
# Comparing lenses on prompts


def compare_lenses(
    model,
    prompts: Sequence[str],
    lenses: Mapping[str, Lens],
    *,
    frequent_ids: Sequence[int] = (),
    convention: str = "canonical",
    batch_size: int = 16,
    on_overflow: Literal["error", "truncate"] = "error",
    progress: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Decode the last position of every prompt through each lens, with one forward
    pass for all lenses (the trajectory engine's residual collection and decoding).

    Returns ``(per_layer, steps)``: ``per_layer`` is DataFrame[lens, layer, kl,
    top1_agreement, frequent_share, n] — mean KL(final ‖ lens), share of prompts
    whose lens top-1 equals the model's final top-1, and share whose top-1 is in
    ``frequent_ids`` (e.g. the corpus's Top-10 tokens); ``steps`` has one row per
    (lens, item, layer): top1_id, top1_prob, kl_to_final, final_id, agrees, frequent."""
    from depthkit.lenses import LayerStep, layer_plan
    from depthkit.trajectories import collect_residuals, decode_residuals, make_items

    if not lenses:
        raise ValueError("compare_lenses needs at least one lens, e.g. {'logit': LogitLens(model)}.")
    items = make_items(model, list(prompts), positions="last", on_overflow=on_overflow)
    n_blocks = int(model.cfg.n_layers)
    plan = layer_plan(n_blocks, convention)  # type: ignore[arg-type]
    needed = sorted({s.layer for s in plan} | {n_blocks})
    local = [LayerStep(needed.index(s.layer), s.translator) for s in plan]
    layer_ids = np.array([s.layer for s in plan])
    frequent = np.asarray(list(frequent_ids), dtype=np.int64)
    order = sorted(range(len(items)), key=lambda i: len(items[i].tokens))
    frames = []
    bar = tqdm(total=len(items), desc=f"{len(lenses)} lenses", unit="prompt", disable=not progress, leave=False)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        resid = collect_residuals(model, [items[i] for i in batch], needed)
        for name, lens in lenses.items():
            dec = decode_residuals(lens, local, resid, None, top_k=1)
            n_steps, n_pos = dec.kl.shape
            top1 = dec.top_ids[..., 0].reshape(-1).numpy()
            final = np.tile(dec.final_top1.numpy(), n_steps)
            frames.append(
                pd.DataFrame(
                    {
                        "lens": name,
                        "item": np.tile(np.array(batch), n_steps),
                        "layer": np.repeat(layer_ids, n_pos),
                        "top1_id": top1,
                        "top1_prob": dec.top_probs[..., 0].reshape(-1).numpy(),
                        "kl_to_final": dec.kl.reshape(-1).numpy(),
                        "final_id": final,
                        "agrees": top1 == final,
                        "frequent": np.isin(top1, frequent),
                    }
                )
            )
        bar.update(len(batch))
    bar.close()
    steps = pd.concat(frames, ignore_index=True)
    steps["lens"] = pd.Categorical(steps["lens"], categories=list(lenses))
    steps = steps.sort_values(["lens", "item", "layer"], kind="stable").reset_index(drop=True)
    steps["lens"] = steps["lens"].astype(str)
    per_layer = (
        steps.groupby(["lens", "layer"], sort=False)
        .agg(kl=("kl_to_final", "mean"), top1_agreement=("agrees", "mean"), frequent_share=("frequent", "mean"), n=("item", "size"))
        .reset_index()
    )
    return per_layer, steps
