"""Lenses: maps from a residual-stream vector at some depth to next-token logits.

Layer index (the *canonical* convention of PAPER.md): ``layer = 0`` is the
embedding output (input of block 0), ``layer = i`` is the residual stream after
block ``i - 1``, ``layer = L`` is the final residual, whose readout is exactly the
model's own logits.

Every lens reads out through the model's own final norm and unembedding; the
logit lens does nothing else, the tuned lens (:mod:`depthkit.tuned_lens`) first
applies a learned affine *translator* per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor

Convention = Literal["canonical", "authors"]
CONVENTIONS: tuple[str, ...] = ("canonical", "authors")


@dataclass(frozen=True)
class LayerStep:
    """One row of a decoding plan: which residual is decoded with which translator."""

    layer: int  # residual depth: 0 = embeddings, L = final residual
    translator: int | None  # index of the translator applied (None: plain readout)


def layer_plan(n_blocks: int, convention: Convention = "canonical") -> list[LayerStep]:
    """The residuals a trajectory decodes and the translator each uses.

    ``canonical``: layers 0..L; layer ℓ < L uses translator ℓ (trained on that same
    residual); layer L is the plain readout, i.e. the model's logits.

    ``authors``: reproduces the published analysis, which decoded block j's *output*
    (our layer j + 1) with translator j, trained on block j's *input*. Layers 1..L;
    there is no embedding row, and the last row goes through translator L - 1.
    For the logit lens the two conventions differ only by the missing layer 0.
    """
    if convention == "canonical":
        return [LayerStep(l, l if l < n_blocks else None) for l in range(n_blocks + 1)]
    if convention == "authors":
        return [LayerStep(j + 1, j) for j in range(n_blocks)]
    raise ValueError(f"Unknown layer convention {convention!r}; choose one of {', '.join(CONVENTIONS)}.")


class Lens(torch.nn.Module):
    """Base class: ``lens(h, translator)`` gives logits from residual vectors.

    Subclasses override :meth:`translate`; the readout is shared and is the model's
    own (final norm, unembedding and, where the architecture has one, the final
    logit soft-cap), so that the plain readout of the final residual equals the
    model's logits.
    """

    name = "lens"

    def __init__(self, model) -> None:
        super().__init__()
        # Plain attributes (not submodules): the lens must not own, save or train the
        # model's parameters.
        object.__setattr__(self, "_model", model)
        cfg = getattr(model, "original_model", None)
        cfg = getattr(cfg, "config", None)
        self.softcap = float(getattr(cfg, "final_logit_softcapping", None) or 0.0)
        self.n_blocks = int(model.cfg.n_layers)
        self.d_model = int(model.cfg.d_model)
        self.d_vocab = int(model.cfg.d_vocab)

    @property
    def model(self):
        return self._model

    def translate(self, h: Float[Tensor, "... d_model"], translator: int | None) -> Float[Tensor, "... d_model"]:
        return h

    def readout(self, h: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
        # Residuals are captured in float32; a bfloat16/float16 model reads them in its
        # own precision, and lens logits are float32 whatever the model's dtype.
        logits = self._model.unembed(self._model.ln_final(h.to(self._model.unembed.W_U.dtype))).float()
        if self.softcap > 0:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def forward(self, h: Float[Tensor, "... d_model"], translator: int | None) -> Float[Tensor, "... d_vocab"]:
        return self.readout(self.translate(h, translator))


class LogitLens(Lens):
    """nostalgebraist's logit lens: the final norm and unembedding applied to any layer."""

    name = "logit"


def resolve_lens(model, lens: str | Lens = "logit", **kwargs) -> Lens:
    """Accept a lens object or a name (``"logit"``, ``"tuned"``) and return a lens.

    ``"tuned"`` loads a saved tuned lens for this model, training one if none fits
    (see :func:`depthkit.tuned_lens.get_tuned_lens`; ``kwargs`` go there).
    """
    if isinstance(lens, Lens):
        return lens
    if lens == "logit":
        return LogitLens(model)
    if lens == "tuned":
        from depthkit.tuned_lens import get_tuned_lens

        return get_tuned_lens(model, **kwargs)
    raise ValueError(f"Unknown lens {lens!r}; choose 'logit' or 'tuned', or pass a Lens object.")
