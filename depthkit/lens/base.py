"""Lenses: maps from a residual-stream vector at some depth to next-token logits.

Layer index (the *canonical* convention of the book): ``layer = 0`` is the
embedding output (input of block 0), ``layer = i`` is the residual stream after
block ``i - 1``, ``layer = L`` is the final residual, whose readout is exactly the
model's own logits.

Every lens reads out through the model's own final norm and unembedding; the
logit lens does nothing else, the tuned lens (:mod:`depthkit.lens`) first
applies a learned affine *translator* per layer (:class:`TunedLens`; training
and storage live in :mod:`depthkit.lens.training` and :mod:`depthkit.lens.store`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

# The lens every engine call uses unless told otherwise (trajectories, mcq, facts,
# early_exit). A tuned lens is asked for explicitly: see depthkit.lens.lens_for.
DEFAULT_LENS = "logit"

Convention = Literal["canonical", "authors"]
CONVENTIONS: tuple[str, ...] = ("canonical", "authors")
# The held-out metrics' name for a tuned lens before its Adam steps.
RIDGE_START = "tuned (ridge start)"


@dataclass(frozen=True)
class LayerStep:
    """One row of a decoding plan: which residual is decoded with which translator."""

    layer: int  # residual depth: 0 = embeddings, L = final residual
    translator: int | None  # index of the translator applied (None: plain readout)


def layer_plan(n_blocks: int, convention: Convention = "canonical") -> list[LayerStep]:
    """The residuals a trajectory decodes and the translator each uses.

    ``canonical``: layers 0..L; layer ℓ < L uses translator ℓ (trained on that same
    residual); layer L is the plain readout, i.e. the model's logits.

    ``authors``: the paper's axis and its off-by-one. Rows 1..L, row j the output of
    block j (blocks counted from 1; the same residual as canonical layer j), decoded
    with translator j - 1, which was trained on block j's *input*; row L is the
    model's own output, as in canonical. There is no embedding row. For the logit
    lens the two conventions differ only by the missing layer 0, so a quantity read
    at row j means the same depth j/L in both.

    >>> from depthkit.lens.base import layer_plan
    >>> [(s.layer, s.translator) for s in layer_plan(3)]
    [(0, 0), (1, 1), (2, 2), (3, None)]
    >>> [(s.layer, s.translator) for s in layer_plan(3, "authors")]
    [(1, 0), (2, 1), (3, None)]
    """
    if convention == "canonical":
        return [LayerStep(l, l if l < n_blocks else None) for l in range(n_blocks + 1)]
    if convention == "authors":
        return [LayerStep(j, j - 1) for j in range(1, n_blocks)] + [LayerStep(n_blocks, None)]
    raise ValueError(f"Unknown layer convention {convention!r}; choose one of {', '.join(CONVENTIONS)}.")


class Workspace:
    """One buffer, reused for every product a caller writes into it (the logits of
    each chunk decoded, a readout's low-precision products): a fresh
    vocabulary-sized tensor each time costs a round of page faults, which on CPU
    takes as long as a fifth of the unembedding product."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype
        self.buf: Tensor | None = None

    def get(self, n: int, device: torch.device) -> Tensor:
        """The first ``n`` entries of the buffer (grown to hold them), 1-D."""
        if self.buf is None or self.buf.numel() < n or self.buf.device != device:
            self.buf = None  # free the old one before allocating its successor
            self.buf = torch.empty(n, dtype=self.dtype, device=device)
        return self.buf[:n]


class Readout:
    """The model's own readout: final norm, unembedding and, where the architecture
    has one, the final logit soft-cap; logits are float32.

    ``dtype=None`` (what :meth:`Lens.readout` uses) calls the model's own unembedding
    module, so the readout of the final residual *is* the model's logits. With a
    ``dtype`` (training and held-out metrics), the unembedding is held as a
    contiguous copy in that dtype (the backends expose W_U as a transposed
    view, which is several times slower to multiply with on CPU); choose the dtype
    with :func:`depthkit.engine.precision.matmul_dtype`. The norm is always the model's own
    module, so every architecture is covered.
    """

    def __init__(self, model, dtype: torch.dtype | None = None) -> None:
        parts = model.backend.readout_parts()
        self.softcap = parts.softcap
        self.norm = parts.norm
        self.unembed = parts.unembed
        W = parts.W_U  # [d_model, d_vocab]
        self.norm_dtype = W.dtype  # the model's own precision
        self.W: Tensor | None = None
        self.b: Tensor | None = None
        # Float32 rows of the unembedding, made on the first sampled back-projection
        # only: most readouts never need this second copy.
        self.rows: Float[Tensor, "d_vocab d_model"] | None = None
        # Whether every readout goes through W (a Readout with a dtype), or only
        # products written into a caller's buffer (below) while the rest call the module.
        self.own_copy = dtype is not None
        head = parts.head
        if dtype is not None:
            self.W = W.to(dtype).contiguous()
        elif (
            type(head) is torch.nn.Linear and head.weight.dtype == torch.float32
            and head.weight.device.type != "meta" and not hasattr(head, "_hf_hook")
        ):  # fmt: skip
            # The module is a plain in-memory float32 Linear: its own weight (a view,
            # no copy) gives its very product, written into a caller's buffer.
            self.W, dtype = head.weight.detach().T, torch.float32
        self.dtype = dtype
        # Scratch for products in a lower precision than float32 (see _low).
        self.scratch = Workspace(dtype) if dtype not in (None, torch.float32) else None
        if self.W is not None:
            # The bridge gives bias-free heads a zero bias; adding it would be one more
            # pass over the logits for nothing.
            b = parts.b_U
            self.b = None if b is None or not bool(b.abs().sum() > 0) else b.float()

    def __call__(self, h: Float[Tensor, "... d_model"], out: Float[Tensor, " n"] | None = None) -> Float[Tensor, "... d_vocab"]:
        """Logits of ``h``. ``out``: a float32 buffer of at least as many entries to
        hold them: a fresh vocabulary-sized tensor costs a round of page faults,
        which on CPU is as slow as a fifth of the product. Without a dtype, the
        product written there is the unembedding module's own (same weight, bias and
        matrix product); a module that cannot be mirrored that way is called."""
        # Residuals are captured in float32; a bfloat16/float16 model reads them in its
        # own precision, and logits are float32 whatever the model's dtype.
        x = self.norm(h.to(self.norm_dtype))
        # out= products do not record gradients: only used where none are taken.
        into = out is not None and self.W is not None and not torch.is_grad_enabled()
        if self.own_copy or into:
            return self.cap_(self.project(x, out))
        z = self.unembed(x).float()
        if self.softcap > 0:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z

    def project(self, x: Float[Tensor, "... d_model"], out: Float[Tensor, " n"] | None = None) -> Float[Tensor, "... d_vocab"]:
        """Normed residuals times the unembedding (plus its bias), float32, without
        the soft-cap; into ``out`` where given. Needs ``W`` (see :meth:`__init__`)."""
        assert self.W is not None, "project() needs a Readout with a dtype or a plain float32 unembedding"
        v = self.W.shape[1]
        x2 = x.reshape(-1, x.shape[-1]).to(self.dtype)
        if out is None:
            z = (x2 @ self.W).float()
        elif self.dtype == torch.float32:
            z = torch.mm(x2, self.W, out=out[: x2.shape[0] * v].view(-1, v))
        else:
            z = out[: x2.shape[0] * v].view(-1, v).copy_(torch.mm(x2, self.W, out=self._low(x2.shape[0], v)))
        if self.b is not None:
            z += self.b
        return z.view(*x.shape[:-1], v)

    def project_back(self, g: Float[Tensor, "... d_vocab"]) -> Float[Tensor, "... d_model"]:
        """The gradient of :meth:`project` w.r.t. its input: ``g`` times the
        transposed unembedding, in the readout's dtype, returned as float32."""
        assert self.W is not None, "project_back() needs a Readout with a dtype"
        g2 = g.reshape(-1, g.shape[-1])
        if self.dtype != torch.float32:
            g2 = self._low(*g2.shape).copy_(g2)
        return (g2 @ self.W.T).float().view(*g.shape[:-1], self.W.shape[0])

    def _low(self, rows: int, cols: int) -> Tensor:
        """A ``[rows, cols]`` scratch matrix in the readout's dtype, reused from call to
        call: a fresh vocabulary-sized one costs a round of page faults each time."""
        assert self.scratch is not None, "only a readout in a lower precision than float32 has scratch"
        return self.scratch.get(rows * cols, self.W.device).view(rows, cols)  # type: ignore[union-attr]

    def project_back_sampled(
        self, g: Float[Tensor, "... d_vocab"], samples: int, gen: torch.Generator, chunk: int = 512
    ) -> Float[Tensor, "... d_model"]:
        """An unbiased estimate of :meth:`project_back` from ``samples`` vocabulary
        entries per row: systematic sampling in proportion to ``|g|``, so an entry
        holding a fraction f of a row's mass is drawn ⌊f·samples⌋ or ⌈f·samples⌉
        times and the large entries are nearly exact. Each draw carries
        ``sign(g) · Σ|g| / samples``; the draws, repeated ones merged, form a sparse
        matrix times the unembedding's rows. Float32; ``chunk`` rows at a time bound the scratch."""
        assert self.W is not None, "project_back_sampled() needs a Readout with a dtype"
        if self.rows is None:
            self.rows = self.W.T.float().contiguous()
        v, d = self.rows.shape
        flat = g.reshape(-1, v)
        dev = flat.device
        out = torch.empty(flat.shape[0], d, device=dev)
        steps = torch.arange(samples, dtype=torch.float32, device=dev)
        scratch = torch.empty(min(chunk, flat.shape[0]), v, device=dev)  # |g|'s running sums, reused
        for s in range(0, flat.shape[0], chunk):
            part = flat[s : s + chunk]
            c = torch.abs(part, out=scratch[: part.shape[0]]).cumsum_(-1)
            width = c[:, -1:] / samples  # the mass between two draws, and each draw's weight
            offset = torch.rand(part.shape[0], 1, generator=gen).to(dev)  # the generator is the CPU's
            idx = torch.searchsorted(c, (steps[None] + offset) * width).clamp_(max=v - 1)
            coef = torch.gather(part, 1, idx).sign_().mul_(width)
            # A large entry is drawn several times; CSR wants each column once per row
            # (sorted, as searchsorted gives them), so repeated draws merge into one
            # entry carrying their sum.
            first = torch.ones_like(idx, dtype=torch.bool)
            first[:, 1:] = idx[:, 1:] != idx[:, :-1]
            first = first.flatten()
            merged = torch.zeros(int(first.sum()), device=dev).index_add_(0, first.cumsum(0) - 1, coef.flatten())
            crow = torch.zeros(part.shape[0] + 1, dtype=torch.long, device=dev)
            crow[1:] = first.view(part.shape[0], samples).sum(1).cumsum(0)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
                sparse = torch.sparse_csr_tensor(
                    crow, idx.flatten()[first], merged, size=part.shape,
                    # Valid by construction; checked only where the caller asks for it.
                    check_invariants=torch.sparse.check_sparse_tensor_invariants.is_enabled(),
                )
            out[s : s + chunk] = sparse @ self.rows
        return out.view(*g.shape[:-1], d)

    def cap_(self, z: Float[Tensor, "... d_vocab"]) -> Float[Tensor, "... d_vocab"]:
        """The final logit soft-cap, in place (a no-op without one)."""
        if self.softcap > 0:
            z.div_(self.softcap).tanh_().mul_(self.softcap)
        return z


class Lens(torch.nn.Module):
    """Base class: ``lens(h, translator)`` gives logits from residual vectors.

    Subclasses override :meth:`translate`; the readout is shared and is the model's
    own (:class:`Readout`), so that the plain readout of the final residual equals
    the model's logits.
    """

    name = "lens"

    def __init__(self, model) -> None:
        super().__init__()
        # Plain attributes (not submodules): the lens must not own, save or train the
        # model's parameters.
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_readout", Readout(model))
        self.softcap = self._readout.softcap
        self.n_blocks = model.info.n_blocks
        self.d_model = model.info.d_model
        self.d_vocab = model.info.d_vocab

    @property
    def model(self):
        return self._model

    def translate(self, h: Float[Tensor, "... d_model"], translator: int | None) -> Float[Tensor, "... d_model"]:
        return h

    def readout(self, h: Float[Tensor, "... d_model"], out: Float[Tensor, " n"] | None = None) -> Float[Tensor, "... d_vocab"]:
        """Logits of ``h`` (float32); into the buffer ``out`` where given (see :class:`Readout`)."""
        return self._readout(h, out)

    def forward(self, h: Float[Tensor, "... d_model"], translator: int | None) -> Float[Tensor, "... d_vocab"]:
        return self.readout(self.translate(h, translator))


class LogitLens(Lens):
    """nostalgebraist's logit lens: the final norm and unembedding applied to any layer."""

    name = "logit"


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
        ("logit" | "tuned", and "tuned (ridge start)" for a lens that took Adam
        steps: the same lens before them), kl (nats), top1_agreement."""
        rows = self.meta.get("heldout")
        if not rows:
            raise ValueError("This lens has no held-out metrics (it was not trained or loaded from a sidecar).")
        start = [{**r, "lens": RIDGE_START} for r in self.meta.get("heldout_after_init") or () if r.get("lens") == "tuned"]
        frame = pd.DataFrame([*rows, *start])
        # A sidecar read back from JSON has its keys sorted; the columns keep one order.
        first = [c for c in ("layer", "lens", "kl", "top1_agreement") if c in frame.columns]
        return frame[first + [c for c in frame.columns if c not in first]]
