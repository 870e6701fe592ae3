"""Where depthkit keeps what it computes once and reuses (converted embedded models,
tuned lenses, token frequency tables, part-of-speech datasets, the chart JavaScript,
CPU probes), and the one way it writes files and folders: atomically, so that a
crash never leaves a half-written one that looks complete."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$DEPTHKIT_CACHE`` (default ``~/.cache/depthkit``), joined with ``parts``."""
    root = Path(os.environ.get("DEPTHKIT_CACHE") or Path.home() / ".cache" / "depthkit").expanduser()
    return root.joinpath(*parts)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block finishes, the file
    written there replaces ``path`` in one step. On any error the temporary file
    is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Unique per process and call: two writers never share a temporary file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        if tmp.is_file():
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Like :func:`atomic_path` for a folder: yield an empty temporary folder next to
    ``path``; when the block finishes it replaces ``path`` (and whatever was there) in
    one rename. On any error the temporary folder is removed and ``path`` is left as
    it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
