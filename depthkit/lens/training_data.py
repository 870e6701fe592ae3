"""What a tuned lens is trained from: its configuration (budgets), the text split
into training and held-out positions, and those positions' residuals.

Caching the residuals of every layer is the slowest part of training. They are
computed once per :class:`LensTrainingData` and the caller decides how long they
live: a :class:`ResidualCache` handed to several trainings (e.g. the lens
variants of the bias check, which read the very same positions) computes them once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from depthkit.core.model_info import ModelInfo
from depthkit.engine.capture import Item, residual_rows

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

Downweight = Literal["the", "top10"] | None
DOWNWEIGHT_SETS: tuple[str, ...] = ("the", "top10")
FORMAT_VERSION = 1


# ---------------------------------------------------------------------------
# Training configuration


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a trained lens (hashed into its file name)."""

    train_tokens: int = 16384  # positions cached for training
    heldout_tokens: int = 2048  # positions of other passages, for the metrics
    seq_len: int = 128
    # "lens": continue from an already trained lens (``start``), e.g. the bias check's
    # down-weighted lenses from the plain tuned lens of the same data.
    init: Literal["ridge", "zero", "lens"] = "ridge"
    ridge: float = 1e-3  # ridge penalty, relative to the mean variance of h_ℓ
    # Adam steps on the KL after the closed-form start, linear decay from ``lr``. On
    # smollm2-135m (2 AVX-512 cores, native bfloat16 products) 100 steps take 2.8 min and
    # lower the mean held-out KL from 2.54 nats (ridge start) to 1.96. 75 steps from
    # 1.333e-4 are within 0.9 % of that at every layer there, but 2-16 % worse on
    # gemma3-270m (`benchmarks/tuned_lens.py --compare`), so the default keeps 100.
    steps: int = 100
    batch_positions: int = 128
    lr: float = 1e-4
    # 0: the KL's gradient goes back through the whole unembedding (exact). n > 0: an
    # unbiased estimate from n tokens per position and layer, drawn in proportion to
    # the gradient's size (systematic sampling), which skips the transposed product
    # (see :func:`~depthkit.lens.training_steps.kl_gradients`).
    backward_samples: int = 0
    grad_clip: float = 1.0
    matmul_dtype: Literal["bfloat16", "float32"] = "bfloat16"  # training products
    eval_dtype: Literal["bfloat16", "float32"] = "bfloat16"  # held-out metrics
    downweight: str | None = None  # None | "the" | "top10"
    downweight_factor: float = 1e-3
    seed: int = 0
    # Config hash of the lens that ``init="lens"`` continues from (part of this lens's
    # identity; set from that lens by get_tuned_lens).
    start: str | None = None

    def validate(self) -> TrainConfig:
        ints = {"train_tokens": 8, "heldout_tokens": 8, "seq_len": 4, "steps": 0, "batch_positions": 1, "backward_samples": 0}
        for key, lo in ints.items():
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"Tuned-lens config {key}={v!r}: must be an integer >= {lo}.")
        if self.init not in ("ridge", "zero", "lens"):
            raise ValueError(f"Tuned-lens config init={self.init!r}: choose 'ridge', 'zero' or 'lens'.")
        if self.start is not None and self.init != "lens":
            raise ValueError(f"Tuned-lens config start={self.start!r} is only read with init='lens' (init is {self.init!r}).")
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
    # Ridge start + 100 Adam steps on the KL (smollm2-135m: 5.6 min on 2 AVX-512 cores, longer on AVX2).
    "default": {},
    # Seconds: for CI smoke runs of the chapters. Ridge start + a handful of steps.
    "smoke": dict(train_tokens=384, heldout_tokens=64, seq_len=64, steps=3, batch_positions=16),
    # The bias check's down-weighted lenses: continue from the plain tuned lens (same
    # positions) with a few Adam steps on the down-weighted KL, a fraction of a lens's cost.
    "finetune": dict(init="lens", steps=30, lr=3e-4),
}


def parse_budget(text: str) -> dict[str, Any]:
    """``"steps=200,lr=1e-4"`` as TrainConfig fields (numbers as numbers): the form a
    budget takes on the command line and in a notebook's parameters cell, where
    the default budget plus these fields is meant."""
    out: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",")):
        key, eq, value = part.partition("=")
        if not eq or not key.strip().isidentifier() or not value.strip():
            raise ValueError(f"Tuned-lens budget {text!r}: write fields as key=value separated by commas, e.g. 'steps=200'.")
        v = value.strip()
        try:
            out[key.strip()] = int(v)
        except ValueError:
            try:
                out[key.strip()] = float(v)
            except ValueError:
                out[key.strip()] = None if v.lower() == "none" else v
    return out


def resolve_config(budget: str | Mapping[str, Any] | TrainConfig = "default", **overrides: Any) -> TrainConfig:
    """A :class:`TrainConfig` from a budget name, a dict of fields or a config;
    ``overrides`` that are None leave the budget's value (so ``seed=None`` keeps the
    seed of ``"seed=1"``)."""
    if isinstance(budget, TrainConfig):
        base = dataclasses.asdict(budget)
    elif isinstance(budget, str) and "=" in budget:
        return resolve_config(parse_budget(budget), **overrides)
    elif isinstance(budget, str):
        if budget not in BUDGETS:
            raise ValueError(
                f"Unknown tuned-lens budget {budget!r}; choose one of {', '.join(BUDGETS)}, fields such as "
                "'steps=200,batch_positions=64', or pass a dict of TrainConfig fields."
            )
        base = dict(BUDGETS[budget])
    elif isinstance(budget, Mapping):
        fields = {f.name for f in dataclasses.fields(TrainConfig)}
        unknown = sorted(set(budget) - fields)
        if unknown:
            raise ValueError(f"Unknown tuned-lens config keys {unknown}; valid keys: {', '.join(sorted(fields))}.")
        base = dict(budget)
    else:
        raise ValueError(f"budget must be 'default', 'smoke', a dict or a TrainConfig, got {type(budget).__name__}.")
    base.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig(**base).validate()



def config_hash(cfg: TrainConfig, info: ModelInfo, texts: Sequence[str] | None) -> str:
    """Identifies what a lens was trained from: config, model weights, training text."""
    config = dataclasses.asdict(cfg)
    if config["start"] is None:
        del config["start"]  # lenses that start from none keep the hashes they had before the field
    if config["backward_samples"] == 0:
        del config["backward_samples"]  # likewise for exact gradients
    key = {
        "format": FORMAT_VERSION,
        "config": config,
        "fingerprint": info.fingerprint,
        "texts": texts_digest(texts),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]



# ---------------------------------------------------------------------------
# Text -> cached residuals


def default_texts() -> list[str]:
    """The lens split of the embedded passages: chapters never analyse these."""
    from depthkit.data.embedded import wikipedia_passages

    return wikipedia_passages("lens")


def texts_digest(texts: Sequence[str] | None) -> str:
    if texts is None:
        return "wikipedia_passages:lens"
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    return "sha256:" + h.hexdigest()[:16]


def as_texts(text: str | Sequence[str] | None) -> list[str] | None:
    if text is None:
        return None
    texts = [text] if isinstance(text, str) else list(text)
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    if not texts:
        raise ValueError("No training text: pass a non-empty string or list of strings, or None for the embedded Wikipedia passages.")
    return texts


@dataclass
class Split:
    sequences: list[list[int]]
    positions: list[list[int]]  # per sequence, the positions that count (ordinary text)
    passages: list[int]  # indices into the texts that this split read from

    @property
    def n_positions(self) -> int:
        return sum(len(p) for p in self.positions)


def make_splits(model: Model, texts: list[str], cfg: TrainConfig) -> tuple[Split, Split]:
    """Pack shuffled passages into sequences of ``seq_len``; the first passages (in
    the seeded order) feed the held-out split, the rest the training split, so the
    two never share a passage. Position 0 of each sequence and special tokens are
    left out: their residuals (attention sinks, BOS) are not ordinary text."""
    tok = model.tokenizer
    with_special = list(tok("a", add_special_tokens=True)["input_ids"])
    plain = list(tok("a", add_special_tokens=False)["input_ids"])
    prefix = with_special[: len(with_special) - len(plain)] if with_special[-len(plain):] == plain else []
    special = set(int(i) for i in getattr(tok, "all_special_ids", []) or [])
    body = cfg.seq_len - len(prefix)
    if body < 2:
        raise ValueError(f"seq_len={cfg.seq_len} is too short for this tokenizer's prefix of {len(prefix)} tokens.")
    order = np.random.default_rng(cfg.seed).permutation(len(texts))

    def build(want: int, start: int) -> tuple[Split, int]:
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
        return Split(seqs, poss, sorted(int(j) for j in order[start:i])), i

    held, used = build(cfg.heldout_tokens, 0)
    train, _ = build(cfg.train_tokens, used)
    for name, split, want in (("held-out", held, cfg.heldout_tokens), ("training", train, cfg.train_tokens)):
        if split.n_positions < min(want, 8):
            raise ValueError(
                f"The text gives only {split.n_positions} {name} positions ({want} wanted): pass more text "
                "or lower train_tokens / heldout_tokens."
            )
    return train, held



@dataclass
class LensTrainingData:
    """The training and held-out positions of one text and configuration, with the
    residuals of every depth 0..L at those positions (float32, [depth, n, d_model])."""

    train: Split
    held: Split
    resid: Float[Tensor, "depth n d_model"]
    resid_held: Float[Tensor, "depth m d_model"]
    key: tuple
    # Held-out metrics of the logit lens by product dtype: they depend on these
    # residuals alone, so the lenses trained on the same data share them.
    logit_metrics: dict[str, pd.DataFrame] = field(default_factory=dict)
    # The model's own top-1 at the training positions (float32 readout), read by
    # every down-weighted lens trained on them: computed once.
    final_top1: Int[Tensor, " n"] | None = None

    @staticmethod
    def key_for(model: Model, texts: Sequence[str] | None, cfg: TrainConfig) -> tuple:
        """What the residuals depend on: model weights, text, positions and seed
        (not the optimiser settings or the down-weighting)."""
        return (
            model.info.fingerprint,
            texts_digest(texts),
            cfg.train_tokens,
            cfg.heldout_tokens,
            cfg.seq_len,
            cfg.seed,
        )

    @classmethod
    @torch.no_grad()
    def build(cls, model, texts: Sequence[str] | None, cfg: TrainConfig, progress: bool = True) -> LensTrainingData:
        """Split ``texts`` (None: the embedded Wikipedia passages) and cache the
        residuals of both splits."""
        texts = None if texts is None else list(texts)
        train, held = make_splits(model, texts if texts is not None else default_texts(), cfg)
        resid = _split_residuals(model, train, "tuned lens: caching residuals", progress)
        resid_held = _split_residuals(model, held, "tuned lens: caching held-out", progress)
        return cls(train, held, resid, resid_held, cls.key_for(model, texts, cfg))


def _split_residuals(model: Model, split: Split, desc: str, progress: bool) -> Float[Tensor, "depth n d_model"]:
    items = [Item(q, p) for q, p in zip(split.sequences, split.positions)]
    return residual_rows(model, items, batch_size=8, desc=desc, progress=progress).cpu()


class ResidualCache:
    """Training residuals of one model, kept by the caller between lens trainings.

    Holds the data of the last text/configuration asked for: the lens variants of the
    bias check (and retraining with another optimiser setting) use the very same
    positions. Pass it as ``cache=`` to :func:`depthkit.lens.training.train_tuned_lens`
    or :func:`depthkit.lens.store.get_tuned_lens`; drop it (or :meth:`clear`) to
    free the memory.
    """

    def __init__(self, model) -> None:
        self.model = model
        self.data: LensTrainingData | None = None

    def get(self, model, texts: Sequence[str] | None, cfg: TrainConfig, progress: bool = True) -> LensTrainingData:
        if model is not self.model:
            raise ValueError("This ResidualCache holds residuals of another model; make one per model: ResidualCache(model).")
        key = LensTrainingData.key_for(model, texts, cfg)
        if self.data is None or self.data.key != key:
            self.data = None  # free the old residuals before computing new ones
            self.data = LensTrainingData.build(model, texts, cfg, progress)
        return self.data

    def clear(self) -> None:
        self.data = None
