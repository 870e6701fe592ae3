"""What a remote run needs besides the trace: the API key check, a store of the
batches already returned, and errors that say what to do.

A chapter run remotely sends one request per forward batch. Each answer is kept
on disk under a key made of everything the request contains (model, tokens, masks,
the work), so a chapter interrupted mid-way and run again sends only the batches
that never came back. Keys and answers never contain the API key, which nnsight
reads from ``NDIF_API_KEY`` or its own user config.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from depthkit.core.files import atomic_path, cache_dir

__all__ = ["RemoteRunError", "RequestStore", "api_key_configured", "require_api_key"]

KEY_HELP = (
    "Get a key at https://login.ndif.us and either export NDIF_API_KEY=... in the shell that runs depthkit or "
    "store it once with `python -c \"from nnsight import CONFIG; CONFIG.set_default_api_key('...')\"`. "
    "Never put it in a notebook or a file of this repository."
)


class RemoteRunError(RuntimeError):
    """A remote request was refused or failed; the message says what to do."""


def api_key_configured() -> bool:
    """Whether nnsight has an NDIF API key (from the environment or its user config)."""
    from nnsight import CONFIG

    return bool(os.environ.get("NDIF_API_KEY") or getattr(CONFIG.API, "APIKEY", None))


def require_api_key() -> None:
    """Raise :class:`RemoteRunError` naming the fix when no key is configured."""
    if not api_key_configured():
        raise RemoteRunError(f"remote=True sends work to NDIF, which needs an API key, and none is configured. {KEY_HELP}")


class RequestStore:
    """Answers of remote requests on disk, by request key (see the module docstring)."""

    def __init__(self, model_key: str, folder: str | os.PathLike[str] | None = None) -> None:
        self.model_key = model_key
        slug = hashlib.sha256(model_key.encode()).hexdigest()[:16]
        self.folder = Path(folder) if folder is not None else cache_dir("remote", slug)
        self.sent = 0  # requests that went out in this process
        self.reused = 0  # requests answered from the store

    def key(self, *parts: Any) -> str:
        """A digest of ``parts`` (tensors by dtype, shape and bytes; the rest by repr)."""
        h = hashlib.sha256(self.model_key.encode())
        for part in parts:
            _digest(h, part)
        return h.hexdigest()

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.safetensors"

    def get(self, key: str) -> dict[str, Tensor] | None:
        """The stored answer, or None. An unreadable file (a crash while writing
        cannot leave one, but a disk can) is treated as missing and sent again."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = self.path(key)
        if not path.exists():
            return None
        try:
            out = load_file(str(path))
        except (SafetensorError, OSError, ValueError):
            return None
        self.reused += 1
        return out

    def note_request(self, passes: int, answer_bytes: int) -> None:
        """Count a request that went out, and log it (``requests.log``: one JSON line
        per request, with its passes and the bytes of its answers) so that what a
        chapter cost can be read afterwards."""
        import json
        import time

        self.sent += 1
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "requests.log", "a") as log:
            log.write(json.dumps({"time": time.time(), "passes": passes, "answer_bytes": answer_bytes}) + "\n")

    def put(self, key: str, answer: dict[str, Tensor]) -> None:
        from safetensors.torch import save_file

        self.folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.path(key)) as tmp:
            save_file({k: v.detach().cpu().contiguous() for k, v in answer.items()}, str(tmp))


def _digest(h: Any, part: Any) -> None:
    if isinstance(part, Tensor):
        t = part.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(part, dict):
        for k in sorted(part):
            h.update(repr(k).encode())
            _digest(h, part[k])
    elif isinstance(part, (list, tuple)):
        h.update(b"[")
        for p in part:
            _digest(h, p)
        h.update(b"]")
    else:
        h.update(repr(part).encode())
