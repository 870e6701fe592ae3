"""Loading models on the nnsight backend (:mod:`depthkit.engine.backends.nnsight_trace`).

* :func:`nnsight_model`: a model loaded here (embedded, tiny, local folder or hub
  id, on one device or spread over several with ``device_map``), wrapped by nnsight.
* :func:`load_remote`: a hub model that NDIF hosts. Only its config and tokenizer
  come here, and the two tensors of its readout (final norm and unembedding, read
  from the checkpoint files: :mod:`depthkit.engine.backends.head`); every forward
  pass runs on NDIF's servers.
"""

from __future__ import annotations

from typing import Any

import torch

from depthkit.engine.backends.layout import find_layout, submodule
from depthkit.engine.backends.nnsight_trace import NNsightBackend, wrap
from depthkit.engine.backends.remote import RequestStore
from depthkit.engine.catalog import ModelLoadError
from depthkit.engine.fingerprint import weights_fingerprint
from depthkit.engine.handle import Model, ModelInfo

__all__ = ["load_remote", "nnsight_model"]


def nnsight_model(
    name: str, hf_model: Any, tok: Any, quant: str, source: str, *, dtype: torch.dtype, device: str, device_map: Any,
    remote: bool | str,
) -> Model:  # fmt: skip
    """``hf_model`` (loaded here) on the nnsight backend, in eval mode."""
    if device_map is None:
        hf_model = hf_model.to(dtype=dtype, device=device)
    hf_model.eval()
    fingerprint = weights_fingerprint(hf_model)
    store = RequestStore(f"{name}:{fingerprint}") if remote else None
    backend = NNsightBackend(wrap(hf_model, tok), hf_model, remote=remote, store=store)
    label = "nnsight-remote" if remote else "nnsight"
    return Model(backend, _info(name, hf_model, backend, quant, source, fingerprint, label), tok)


def load_remote(repo_id: str, *, dtype: torch.dtype, trust_remote_code: bool) -> Model:
    """``repo_id`` as NDIF runs it (see the module docstring)."""
    from depthkit.engine.backends.head import readout_from_checkpoint
    from depthkit.engine.backends.remote import require_api_key

    require_api_key()
    try:
        from nnsight import TransformersModel

        lm = TransformersModel(repo_id, task="text-generation", dtype=dtype, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise ModelLoadError(
            f"Could not read the config and tokenizer of {repo_id!r} from the Hugging Face hub: {str(err)[:300]}. "
            "A remote run still needs them here (and the model's readout weights); check the id and the network."
        ) from None
    hf_meta = lm._module
    layout = find_layout(hf_meta)
    readout = readout_from_checkpoint(repo_id, hf_meta, layout, dtype)
    # NDIF's copy of the weights cannot be hashed from here; the revision names them.
    revision = str(getattr(hf_meta.config, "_commit_hash", None) or "main")
    backend = NNsightBackend(lm, hf_meta, remote=True, readout=readout, store=RequestStore(f"{repo_id}:{revision}"))
    info = _info(repo_id, hf_meta, backend, "none", "hub", f"revision:{revision}", "nnsight-remote")
    return Model(backend, info, lm.tokenizer)


def _info(name: str, hf_model: Any, backend: NNsightBackend, quant: str, source: str, fingerprint: str, label: str) -> ModelInfo:
    cfg = hf_model.config
    head = submodule(hf_model, backend.layout.head).weight
    n_ctx = next(
        (v for k in ("max_position_embeddings", "n_positions", "n_ctx") if isinstance(v := getattr(cfg, k, None), int) and v > 0),
        0,
    )
    return ModelInfo(
        name=name,
        family=str(getattr(cfg, "model_type", "unknown")),
        n_blocks=len(submodule(hf_model, backend.layout.layers)),
        d_model=int(head.shape[1]),
        d_vocab=int(head.shape[0]),
        n_ctx=int(n_ctx),
        quantisation=quant,
        source=source,
        fingerprint=fingerprint,
        backend=label,
    )
