"""The readout of a model that runs elsewhere, from its checkpoint files alone.

A remote run (NDIF) decodes residuals here, with the model's own final norm and
unembedding. Those are two of the checkpoint's tensors (``lm_head.weight`` and
``model.norm.weight`` in Llama; the input embedding where the head is tied): this
module finds the shard files that hold them (``model.safetensors.index.json``),
fetches only those (for a hub id; a local folder is read in place) and puts the
weights into the model's own norm and head modules, built from its config. Only
safetensors files are read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from depthkit.engine.backends.base import ReadoutParts
from depthkit.engine.backends.layout import Layout, submodule

__all__ = ["CheckpointError", "readout_from_checkpoint"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class CheckpointError(ValueError):
    """The checkpoint lacks a tensor the readout needs, or is not in safetensors."""


def readout_from_checkpoint(source: str, hf_model: Any, layout: Layout, dtype: torch.dtype) -> ReadoutParts:
    """The final norm and unembedding of ``hf_model`` (built on any device, meta
    included) with the weights of checkpoint ``source`` (a hub id or a folder),
    in ``dtype`` on the CPU."""
    norm = submodule(hf_model, layout.norm)
    head = submodule(hf_model, layout.head)
    wanted = {f"{layout.norm}.{n}": (norm, n) for n, _ in norm.named_parameters(recurse=False)}
    head_names = [f"{layout.head}.{n}" for n, _ in head.named_parameters(recurse=False)]
    tied = bool(getattr(hf_model.config, "tie_word_embeddings", False))
    emb_name = next(n for n, m in hf_model.named_modules() if m is hf_model.get_input_embeddings())
    tensors = _read(source, list(wanted) + head_names + ([f"{emb_name}.weight"] if tied else []))
    norm_out = _materialise(norm, {n: tensors[k] for k, (_, n) in wanted.items()}, dtype)
    head_state = {k.rsplit(".", 1)[1]: tensors[k] for k in head_names if k in tensors}
    if "weight" not in head_state:
        if not tied:
            raise CheckpointError(f"{source}: no tensor {layout.head}.weight for the unembedding.")
        head_state["weight"] = tensors[f"{emb_name}.weight"]
    head_out = _materialise(head, head_state, dtype)
    b = getattr(head_out, "bias", None)
    return ReadoutParts(
        norm=norm_out,
        unembed=head_out,
        W_U=head_out.weight.detach().T,
        b_U=None if b is None else b.detach(),
        head=head_out if type(head_out) is torch.nn.Linear else None,
        softcap=float(getattr(hf_model.config, "final_logit_softcapping", None) or 0.0),
    )


def _materialise(module: torch.nn.Module, state: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.nn.Module:
    import copy

    out = copy.deepcopy(module).to_empty(device="cpu")
    missing = [n for n, _ in out.named_parameters(recurse=False) if n not in state]
    if missing:
        raise CheckpointError(f"The checkpoint has no {missing} for {type(module).__name__}.")
    out.load_state_dict(state, strict=False)
    return out.to(dtype).eval()


def _read(source: str, names: list[str]) -> dict[str, torch.Tensor]:
    """The tensors ``names`` that exist in checkpoint ``source`` (missing ones are left out)."""
    from safetensors import safe_open

    shards = _shards_for(source, names)
    out: dict[str, torch.Tensor] = {}
    for shard, in_shard in shards.items():
        with safe_open(str(_fetch(source, shard)), framework="pt") as f:
            for n in in_shard:
                out[n] = f.get_tensor(n)
    return out


def _shards_for(source: str, names: list[str]) -> dict[str, list[str]]:
    try:
        index = json.loads(Path(_fetch(source, INDEX)).read_text())
    except FileNotFoundError:
        return {SINGLE: _present(source, SINGLE, names)}
    weight_map: dict[str, str] = index.get("weight_map", {})
    by_shard: dict[str, list[str]] = {}
    for n in names:
        if n in weight_map:
            by_shard.setdefault(weight_map[n], []).append(n)
    return by_shard


def _present(source: str, shard: str, names: list[str]) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(_fetch(source, shard)), framework="pt") as f:
        keys = set(f.keys())
    return [n for n in names if n in keys]


def _fetch(source: str, filename: str) -> Path:
    """A checkpoint file: in the folder ``source``, or fetched from the hub (only this file)."""
    folder = Path(source).expanduser()
    if folder.is_dir():
        path = folder / filename
        if not path.exists():
            if filename == SINGLE:
                raise CheckpointError(f"{source} has neither {INDEX} nor {SINGLE}; depthkit reads only safetensors checkpoints.")
            raise FileNotFoundError(path)
        return path
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return Path(hf_hub_download(source, filename))
    except EntryNotFoundError:
        if filename == SINGLE:
            raise CheckpointError(
                f"{source} has neither {INDEX} nor {SINGLE} on the hub; depthkit reads only safetensors."
            ) from None
        raise FileNotFoundError(filename) from None
