"""How depthkit's own forward passes run the bridge's attention blocks.

TransformerBridge re-implements every attention block step by step, so that
hooks on attention scores and patterns can fire. depthkit reads and writes only
the residual stream, so inside its forward passes (:mod:`depthkit.engine.backends.bridge`) each attention block can run as the
model's own Hugging Face module with PyTorch's fused kernel
(``scaled_dot_product_attention``): the same arithmetic without the score matrix
in memory, several times faster on few-shot prompts of hundreds of tokens.

* :func:`fused_attention`: for the duration of a run, every attention bridge
  calls its Hugging Face module, and the model builds its masks for that kernel.
  Architectures the kernel does not cover (attention logit soft-capping, models
  without SDPA support) keep the bridge's own attention.
* :func:`cache_passthrough`: the bridge's attention sees a key/value cache.

A plain ``model(...)`` or a hooked run outside these contexts is the bridge's
own computation; the tests compare the two on every family.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge


def _fusable(bridge: TransformerBridge) -> bool:
    hf = bridge.original_model
    cfg = hf.config
    return bool(getattr(hf, "_supports_sdpa", False)) and not getattr(cfg, "attn_logit_softcapping", None)


@contextmanager
def fused_attention(bridge: TransformerBridge) -> Iterator[bool]:
    """Run attention through the model's own modules with the fused SDPA kernel
    (see the module docstring); yields whether it does."""
    # Imported here: TransformerLens takes ~5 s to import, and `import depthkit` (the
    # command line's parameter checks among others) should not wait for it.
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

    bridges = [
        m for m in bridge.modules() if isinstance(m, AttentionBridge) and getattr(m, "original_component", None) is not None
    ]
    if not bridges or not _fusable(bridge):
        yield False
        return
    cfg = bridge.original_model.config
    before = cfg._attn_implementation
    try:
        cfg._attn_implementation = "sdpa"
        for m in bridges:
            # An instance attribute shadows the bridge's forward; hooks registered on
            # the module (cache_passthrough's) still run around it. Set past the
            # bridge's __setattr__, which would forward the name to the HF module.
            object.__setattr__(m, "forward", m.original_component.forward)
        yield True
    finally:
        for m in bridges:
            m.__dict__.pop("forward", None)
        cfg._attn_implementation = before


@contextmanager
def cache_passthrough(bridge: TransformerBridge) -> Iterator[None]:
    """Let the bridge's attention see the cache.

    Transformers 5 hands the cache to attention modules as ``cache=``, while
    TransformerLens 4.3's attention bridges look for ``past_key_values`` (or
    ``layer_past``) and otherwise silently attend to the new tokens only. For the
    duration of a cached run, a pre-hook on every attention bridge copies one name
    to the other; nothing stays registered afterwards.
    """
    handles = []

    def pre(module, args, kwargs):  # noqa: ARG001 - torch pre-hook signature
        if kwargs.get("cache") is not None and kwargs.get("past_key_values") is None:
            kwargs["past_key_values"] = kwargs["cache"]
        return args, kwargs

    try:
        for module in bridge.modules():
            if hasattr(module, "_update_kv_cache"):
                handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def run_attention(bridge: TransformerBridge) -> Iterator[None]:
    """The attention set-up of every depthkit forward pass: fused where the
    architecture allows (the Hugging Face module reads its cache itself), else the
    bridge's attention with the cache passed through."""
    with ExitStack() as stack:
        if not stack.enter_context(fused_attention(bridge)):
            stack.enter_context(cache_passthrough(bridge))
        yield
