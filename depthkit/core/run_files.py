"""Where a chapter's results live and how their files are named and written: the
results folder, a model's folder name, safe table names, the manifest's plain JSON
values, checksums, and deterministic Parquet files.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from depthkit.core.files import atomic_path

if TYPE_CHECKING:
    from depthkit.core.model_info import HasInfo, ModelInfo

__all__ = ["MANIFEST", "ResultsError", "model_slug", "results_root", "write_parquet"]

MANIFEST = "manifest.json"
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

