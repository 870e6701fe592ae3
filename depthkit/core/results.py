"""Saving and loading a chapter's results, atomically.

A run of a chapter writes its tables into a hidden staging folder next to the final
one, ``results/<model-slug>/.<chapter>.partial-<pid>-<random>/``. Only
:meth:`RunRecorder.finish` makes them visible: it writes ``manifest.json`` last and
swaps the staging folder into ``results/<model-slug>/<chapter>/``. A run that
crashes before that leaves the previous complete run untouched.

Tables are Parquet files written deterministically (fixed compression, no
timestamps): the same data gives byte-identical files and the same checksums.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import uuid
import warnings
import weakref
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from depthkit.core.files import atomic_path, atomic_write

if TYPE_CHECKING:
    from depthkit.core.model_info import HasInfo, ModelInfo

__all__ = ["ResultsError", "Run", "RunRecorder", "list_runs", "load_run", "model_slug", "results_root"]

MANIFEST = "manifest.json"
_FORMAT = 1
# Recorders still open in this process: their staging folders are never stale. Weak
# references, so that a recorder dropped without finish() (a re-run notebook cell)
# stops protecting its folder.
_OPEN: weakref.WeakSet[RunRecorder] = weakref.WeakSet()
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class ResultsError(ValueError):
    """A run's results are missing, incomplete, or damaged, or cannot be written."""


def results_root(root: str | os.PathLike[str] | None = None) -> Path:
    """``root``, else ``$DEPTHKIT_RESULTS``, else ``./results``."""
    return Path(root if root is not None else os.environ.get("DEPTHKIT_RESULTS") or "results").expanduser()


def model_slug(model: HasInfo | ModelInfo | str) -> str:
    """Folder name of a model: its name with "/" as "__" and other unsafe characters
    dropped (``meta-llama/Llama-2-7b-hf`` -> ``meta-llama__Llama-2-7b-hf``). Takes a
    name, a ModelInfo, its dict, or a model loaded with depthkit."""
    name = _model_name(model)
    slug = re.sub(r"[^A-Za-z0-9_.-]", "", name.replace("/", "__")).lstrip(".")
    if not re.search(r"[A-Za-z0-9]", slug):
        raise ResultsError(f"Model name {name!r} leaves no usable folder name; name the model with letters or digits.")
    return slug


def _model_name(model: HasInfo | ModelInfo | str | dict[str, Any]) -> str:
    info = getattr(model, "info", model)  # a loaded Model carries its ModelInfo
    if isinstance(info, str):
        return info
    if isinstance(info, dict) and isinstance(info.get("name"), str):
        return info["name"]
    if isinstance(getattr(info, "name", None), str):
        return info.name
    raise TypeError(
        f"Expected a model name, a ModelInfo or a model loaded with depthkit.load_model; got {type(model).__name__}."
    )


def _model_dict(model_info: Any) -> dict[str, Any]:
    info = getattr(model_info, "info", model_info)
    if hasattr(info, "as_dict"):
        return dict(info.as_dict())
    if isinstance(info, dict):
        _model_name(info)
        return dict(info)
    if isinstance(info, str):
        return {"name": info}
    raise TypeError(
        f"model_info must be a ModelInfo, a dict with a 'name', or a model name; got {type(model_info).__name__}."
    )


def _check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not _SAFE_NAME.fullmatch(value):
        raise ResultsError(
            f"{what} {value!r} is not a safe file name: use letters, digits, '_', '.', '-', starting with a letter or digit."
        )
    return value


def _jsonable(value: Any) -> Any:
    """Plain JSON types for the manifest (numpy scalars, paths, tuples, ...)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [_jsonable(v) for v in items]
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{value!r} ({type(value).__name__}) cannot be written to a JSON manifest.")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_parquet(df: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write ``df`` deterministically and atomically (temporary file + rename).

    Parquet stores no timestamps; the compression is fixed (zstd, level 3), so equal
    frames give equal bytes under the same library versions.
    """
    path = Path(path)
    table = pa.Table.from_pandas(df, preserve_index=None)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", compression_level=3)
    return path


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

    >>> rec = RunRecorder("01_guess_then_refine", dk.model_info(model), params, seed=0)
    >>> rec.table("buckets", buckets_df)
    >>> rec.finish()   # results/smollm2-135m/01_guess_then_refine/ now holds the run

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


@dataclass
class Run:
    """A complete, verified run: ``manifest`` (dict) and ``tables`` (name -> DataFrame)."""

    manifest: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(repr=False)
    path: Path

    def __getitem__(self, name: str) -> pd.DataFrame:
        try:
            return self.tables[name]
        except KeyError:
            raise KeyError(f"No table {name!r} in this run; it has {', '.join(self.tables) or 'no tables'}.") from None

    @property
    def params(self) -> dict[str, Any]:
        return self.manifest["params"]

    @property
    def model(self) -> dict[str, Any]:
        return self.manifest["model"]


def _chapter_folder(model_dir: Path, chapter: str) -> str:
    """A chapter given as its id ("01") names its slug's folder ("01_guess_then_refine"):
    the one saved folder (or trash folder left by an interrupted run) whose name is
    the id, an underscore and a name. Found on disk rather than in
    :mod:`depthkit.chapters`, which builds on this module (no import circle)."""
    if (model_dir / chapter).exists() or not chapter.isdigit():
        return chapter
    names = {p.name for p in model_dir.glob(f"{chapter}_*") if p.is_dir()}
    names |= {p.name[1:].split(".trash-")[0] for p in model_dir.glob(f".{chapter}_*.trash-*") if p.is_dir()}
    return names.pop() if len(names) == 1 else chapter


def load_run(model: HasInfo | ModelInfo | str, chapter: str, root: str | os.PathLike[str] | None = None) -> Run:
    """The complete run of ``chapter`` (id like "01" or slug) for ``model`` (name,
    ModelInfo or model), with every table checked against the manifest's checksum."""
    name = _model_name(model)
    model_dir = results_root(root) / model_slug(model)
    folder_name = _chapter_folder(model_dir, str(chapter))
    folder = model_dir / folder_name
    command = f"`depthkit run {chapter} --model {name}`"
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        # A run that died between the two renames of finish() left the previous
        # complete run in a trash folder; it is still the latest complete result.
        previous = sorted(model_dir.glob(f".{folder_name}.trash-*/{MANIFEST}"), key=lambda p: p.stat().st_mtime)
        if previous and not folder.exists():
            warnings.warn(
                f"{folder} is missing (a run was interrupted while saving); loading the previous run from {previous[-1].parent}.",
                stacklevel=2,
            )
            folder, manifest_path = previous[-1].parent, previous[-1]
    if not manifest_path.is_file():
        raise ResultsError(f"no complete run of chapter {chapter} for model {name} (looked in {folder}); run {command}")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResultsError(
            f"The manifest {manifest_path} is damaged (not valid JSON: {e}). Re-run the chapter with {command}; "
            "the new run replaces this folder."
        ) from None
    if (
        not isinstance(manifest, dict)
        or manifest.get("status") != "complete"
        or not isinstance(manifest.get("tables"), dict)
    ):
        raise ResultsError(
            f"The manifest {manifest_path} does not describe a complete run. Re-run the chapter with {command}."
        )
    tables: dict[str, pd.DataFrame] = {}
    for table, meta in manifest["tables"].items():
        file = folder / str(meta.get("file", ""))
        if not file.is_file():
            raise ResultsError(
                f"Table {table!r} of {folder} is missing ({file.name}). Re-run the chapter with {command}."
            )
        if _sha256(file) != meta.get("sha256"):
            raise ResultsError(
                f"Table {table!r} ({file}) does not match the checksum in its manifest: it changed after the run. "
                f"Re-run the chapter with {command}."
            )
        tables[table] = pd.read_parquet(file)
    return Run(manifest=manifest, tables=tables, path=folder)


def list_runs(root: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """Complete runs under ``root``: DataFrame[model, chapter, finished, n_tables,
    path], sorted by model and chapter. Folders with a missing or unreadable manifest
    are skipped (with a warning for damaged ones); checksums are checked by load_run."""
    base = results_root(root)
    rows = []
    for manifest_path in sorted(base.glob(f"*/*/{MANIFEST}")):
        folder = manifest_path.parent
        if folder.name.startswith(".") or folder.parent.name.startswith("."):
            continue
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            if manifest.get("status") != "complete":
                continue
            rows.append(
                (
                    _model_name(manifest["model"]),
                    manifest["chapter"],
                    manifest.get("finished_utc"),
                    len(manifest["tables"]),
                    str(folder),
                )
            )
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            warnings.warn(f"Skipping {folder}: its manifest is damaged ({type(e).__name__}: {e}).", stacklevel=2)
    frame = pd.DataFrame(rows, columns=["model", "chapter", "finished", "n_tables", "path"])
    return frame.sort_values(["model", "chapter"], ignore_index=True)
