"""Where a Hugging Face causal LM keeps the modules depthkit reads around.

TransformerLens names residual sites for every architecture it adapts; on the
model itself they sit at family-specific paths (``model.layers`` in Llama and Gemma,
``transformer.h`` in GPT-2, ``gpt_neox.layers`` in Pythia). :func:`find_layout`
finds them from the module tree, without running or loading weights (it works on
a model built on the meta device, as for a remote run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Layout", "LayoutError", "find_layout", "submodule"]

# The norm that reads the stream between attention and MLP, by preference: Gemma's
# post_attention_layernorm normalises the attention *output*, its pre_feedforward
# one reads the stream.
_MID_NORMS = ("pre_feedforward_layernorm", "post_attention_layernorm", "ln_2")
_FINAL_NORMS = ("norm", "ln_f", "final_layer_norm", "final_layernorm")


class LayoutError(ValueError):
    """The model's module tree is not one depthkit can read residuals from."""


@dataclass(frozen=True)
class Layout:
    """Module paths (dotted, from the causal-LM module) of the decoder blocks, the
    final norm and the unembedding; ``mid``: the attribute of a block whose input is
    the stream between attention and MLP (``None`` where attention and MLP read the
    same input, as in parallel-residual blocks)."""

    layers: str
    norm: str
    head: str
    mid: str | None


def submodule(root: Any, path: str) -> Any:
    """``root.a.b.c`` for ``path`` "a.b.c" (works on modules and nnsight envoys)."""
    out = root
    for part in path.split("."):
        out = getattr(out, part)
    return out


def _n_blocks(config: Any) -> int:
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v > 0:
            return v
    raise LayoutError(f"The config of {type(config).__name__} names no number of layers (num_hidden_layers, n_layer).")


def find_layout(hf_model: torch.nn.Module) -> Layout:
    """The :class:`Layout` of a Hugging Face causal LM.

    >>> import depthkit as dk
    >>> from depthkit.engine.tiny import _build_tiny
    >>> find_layout(_build_tiny("gpt2", seed=0, n_layers=2)[0])
    Layout(layers='transformer.h', norm='transformer.ln_f', head='lm_head', mid='ln_2')
    """
    config = hf_model.config
    n = _n_blocks(config)
    names = {id(m): name for name, m in hf_model.named_modules()}
    lists = [name for name, m in hf_model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n]
    if not lists:
        raise LayoutError(
            f"{type(hf_model).__name__} has no list of {n} decoder blocks; depthkit cannot find its residual stream."
        )
    layers = lists[0]
    parent_path = layers.rsplit(".", 1)[0] if "." in layers else ""
    parent = submodule(hf_model, parent_path) if parent_path else hf_model
    norm = next((a for a in _FINAL_NORMS if isinstance(getattr(parent, a, None), torch.nn.Module)), None)
    head = hf_model.get_output_embeddings()
    if norm is None or head is None or id(head) not in names:
        raise LayoutError(
            f"{type(hf_model).__name__}: no final norm ({', '.join(_FINAL_NORMS)}) next to {layers!r} or no output "
            "embedding; depthkit's lenses need both."
        )
    block = submodule(hf_model, layers)[0]
    parallel = bool(getattr(config, "use_parallel_residual", False) or getattr(config, "parallel_attn", False))
    mid = None if parallel else next((a for a in _MID_NORMS if isinstance(getattr(block, a, None), torch.nn.Module)), None)
    return Layout(layers=layers, norm=f"{parent_path}.{norm}" if parent_path else norm, head=names[id(head)], mid=mid)
