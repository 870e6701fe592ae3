"""depthkit's forward passes run attention through the model's own modules with the
fused kernel; residuals must equal the bridge's own step-by-step attention."""

from __future__ import annotations

import pytest
import torch

from depthkit.engine.attention import fused_attention
from depthkit.engine.capture import Item, collect_residuals, residual_hook_names

ARCHS = ("llama", "gpt2", "neox", "gemma3")


def _bridge_residuals(model, tokens: list[int]) -> torch.Tensor:
    """Every depth's residual at every position, from a plain hooked run (the
    bridge's own attention)."""
    names = residual_hook_names(int(model.cfg.n_layers))
    seen = {}

    def keep(name: str):
        def hook(x, hook):  # noqa: ARG001 - TransformerLens hook signature
            seen[name] = x[0].clone()
            return x

        return hook

    model.run_with_hooks(torch.tensor([tokens]), fwd_hooks=[(n, keep(n)) for n in names])
    return torch.stack([seen[n] for n in names])


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_attention_equals_the_bridges_own(tiny_models, arch):
    model = tiny_models[arch]
    g = torch.Generator().manual_seed(3)
    # Longer than the tiny Gemma's 32-token sliding window.
    tokens = torch.randint(5, int(model.cfg.d_vocab), (45,), generator=g).tolist()
    want = _bridge_residuals(model, tokens)
    got = collect_residuals(model, [Item(tokens, list(range(len(tokens))))])
    assert (got - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_attention_is_used_and_undone(tiny_models, arch):
    model = tiny_models[arch]
    cfg = model.original_model.config
    before = cfg._attn_implementation
    with fused_attention(model.bridge) as fused:
        assert fused and cfg._attn_implementation == "sdpa"
    assert cfg._attn_implementation == before
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_soft_capped_attention_keeps_the_bridge(tiny_models):
    model = tiny_models["gemma3"]
    cfg = model.original_model.config
    old = getattr(cfg, "attn_logit_softcapping", None)
    cfg.attn_logit_softcapping = 50.0  # Gemma 2's kind, which the fused kernel cannot apply
    try:
        with fused_attention(model.bridge) as fused:
            assert not fused and cfg._attn_implementation != "sdpa"
    finally:
        cfg.attn_logit_softcapping = old
