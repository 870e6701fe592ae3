"""Models and inputs the checkers run the student's functions on.

Tiny random models (:func:`depthkit.load_model` ``tiny-*``) build in seconds on a
CPU, so a check never waits for real weights. Their final norm is initialised to
all-ones weights, which would hide one of the commonest mistakes: with an RMSNorm
of unit weight, forgetting the norm only rescales each position's logits and
leaves the top-1 unchanged. The practice models therefore get random norm
weights (and, for LayerNorm, a random bias).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from depthkit.engine.models import load_model
from depthkit.lens.trajectories import encode

PROMPTS = ("The capital of France is", "In the morning she walked to the old market")


@functools.cache
def practice_model(arch: str = "llama", seed: int = 0):
    """A tiny random model of family ``arch`` ("llama", "gpt2", "neox", "gemma3"),
    4 blocks, d_model 64, a 320-token tokenizer, with a final norm whose weights are
    not all ones. Cached: every check and notebook cell gets the same object."""
    model = load_model(f"tiny-{arch}", seed=seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for name, p in model.ln_final.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.25 + 1.5 * torch.rand(p.shape, generator=gen))
    return model


def tokens_of(model, text: str) -> Tensor:
    """A batch of one prompt, ``[1, seq]``, tokenised as depthkit does."""
    return torch.tensor([encode(model, text)])


def clear_hooks(model) -> None:
    """Remove hooks a student's earlier experiment may have left on the shared model
    (``model.add_hook`` without ``reset_hooks``), so that they do not distort a check."""
    reset = getattr(model, "reset_hooks", None)
    if callable(reset):
        reset()
