"""Recording one run of a chapter (:class:`RunRecorder`): tables written into a
hidden staging folder, then the manifest last and one swap into the final folder,
so a run that crashes leaves the previous complete run untouched; staging folders
of runs that died are removed by the next run that finishes.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import shutil
import uuid
import weakref
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from depthkit.core.files import atomic_write
from depthkit.core.run_files import (
    MANIFEST,
    ResultsError,
    _check_name,
    _jsonable,
    _model_dict,
    _sha256,
    model_slug,
    results_root,
    write_parquet,
)

__all__ = ["RunRecorder"]

_FORMAT = 1
# Recorders still open in this process: their staging folders are never stale. Weak
# references, so that a recorder dropped without finish() (a re-run notebook cell)
# stops protecting its folder.
_OPEN: weakref.WeakSet[RunRecorder] = weakref.WeakSet()


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("torch", "transformers", "transformer-lens", "depthkit", "numpy", "pandas", "pyarrow"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_pid(folder: Path, chapter: str) -> int | None:
    """The process id in a staging or trash folder name of ``chapter``, else None."""
    m = re.fullmatch(rf"\.{re.escape(chapter)}\.(?:partial|trash)-(\d+)-[0-9a-f]+", folder.name)
    return int(m.group(1)) if m else None


class RunRecorder:
    """Records one run of a chapter for one model.

    >>> import tempfile
    >>> import pandas as pd
    >>> tmp = tempfile.TemporaryDirectory()
    >>> rec = RunRecorder("01_guess_then_refine", "tiny-llama", {"n_prompts": 12}, seed=0, root=tmp.name)
    >>> rec.table("buckets", pd.DataFrame({"bucket": [1, 2]})).name
    'buckets.parquet'
    >>> rec.finish().relative_to(tmp.name).as_posix()  # the run is now visible there
    'tiny-llama/01_guess_then_refine'
    >>> tmp.cleanup()

    Also a context manager: leaving the ``with`` block normally finishes the run; an
    exception discards the staging folder and keeps the previous run.
    """

    def __init__(
        self,
        chapter: str,
        model_info: Any,
        params: dict[str, Any],
        seed: int | None,
        root: str | os.PathLike[str] | None = None,
    ) -> None:
        self.chapter = _check_name(chapter, "Chapter")
        self.model = _model_dict(model_info)
        self.slug = model_slug(self.model)
        try:
            self.params = _jsonable(dict(params))
            self.seed = _jsonable(seed)
        except TypeError as e:
            raise ResultsError(f"Parameters of chapter {chapter} cannot be recorded: {e} Pass plain values.") from None
        self.root = results_root(root)
        self.model_dir = self.root / self.slug
        self.final_dir = self.model_dir / self.chapter
        self.staging = self.model_dir / f".{self.chapter}.partial-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.staging.mkdir(parents=True)
        _OPEN.add(self)
        self.started = _utc_now()
        self.notes: dict[str, Any] = {}
        self._tables: dict[str, dict[str, Any]] = {}
        self._state = "open"

    def __repr__(self) -> str:
        return f"RunRecorder({self.chapter!r}, model={self.slug!r}, tables={list(self._tables)}, {self._state})"

    @property
    def tables(self) -> list[str]:
        return list(self._tables)

    def _require_open(self) -> None:
        if self._state != "open":
            raise ResultsError(f"This run of {self.chapter} is already {self._state}; start a new RunRecorder.")

    def table(self, name: str, df: pd.DataFrame) -> Path:
        """Write ``df`` as ``<name>.parquet`` into the staging folder (atomically) and
        return its path there; :meth:`finish` moves it into the final folder."""
        self._require_open()
        _check_name(name, "Table name")
        if not isinstance(df, pd.DataFrame):
            raise ResultsError(f"Table {name!r} must be a pandas DataFrame, got {type(df).__name__}.")
        if name in self._tables:
            raise ResultsError(f"Table {name!r} was already recorded in this run; give each table its own name.")
        path = self.staging / f"{name}.parquet"
        try:
            write_parquet(df, path)
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise ResultsError(
                f"Table {name!r} cannot be written as Parquet ({type(e).__name__}: {e}). "
                "Give every column one type (e.g. no mixed numbers and strings)."
            ) from e
        self._tables[name] = {"file": path.name, "rows": int(len(df)), "columns": [str(c) for c in df.columns]}
        return path

    def note(self, **fields: Any) -> None:
        """Extra facts for the manifest (e.g. which lens was used), under "notes"."""
        self._require_open()
        try:
            self.notes.update(_jsonable(fields))
        except TypeError as e:
            raise ResultsError(f"Note cannot be recorded: {e}") from None

    def finish(self) -> Path:
        """Write the manifest last, swap the staging folder into place, remove stale
        staging folders of this chapter, and return the final folder."""
        self._require_open()
        tables = {name: {**meta, "sha256": _sha256(self.staging / meta["file"])} for name, meta in self._tables.items()}
        manifest = {
            "format": _FORMAT,
            "status": "complete",
            "chapter": self.chapter,
            "model": self.model,
            "model_slug": self.slug,
            "params": self.params,
            "seed": self.seed,
            "tables": tables,
            "notes": self.notes,
            "versions": _versions(),
            "started_utc": self.started,
            "finished_utc": _utc_now(),
        }
        atomic_write(
            self.staging / MANIFEST, (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode()
        )
        trash = None
        if self.final_dir.exists():
            trash = self.model_dir / f".{self.chapter}.trash-{os.getpid()}-{uuid.uuid4().hex[:12]}"
            os.rename(self.final_dir, trash)
        os.rename(self.staging, self.final_dir)
        _OPEN.discard(self)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        self._state = "finished"
        self._remove_stale()
        return self.final_dir

    def abort(self) -> None:
        """Discard this run's staging folder; the previous complete run stays."""
        if self._state == "open":
            shutil.rmtree(self.staging, ignore_errors=True)
            _OPEN.discard(self)
            self._state = "aborted"

    def _remove_stale(self) -> None:
        """Staging and trash folders of this chapter left by runs that died."""
        protected = {r.staging for r in _OPEN}
        for folder in self.model_dir.glob(f".{self.chapter}.*-*"):
            pid = _owner_pid(folder, self.chapter)
            if pid is None or not folder.is_dir() or folder in protected:
                continue
            if pid == os.getpid() or not _pid_alive(pid):
                shutil.rmtree(folder, ignore_errors=True)

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
        elif self._state == "open":
            self.finish()

