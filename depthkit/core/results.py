"""Saving and loading a chapter's results, atomically.

A run of a chapter writes its tables into a hidden staging folder next to the final
one, ``results/<model-slug>/.<chapter>.partial-<pid>-<random>/``. Only
:meth:`RunRecorder.finish` makes them visible: it writes ``manifest.json`` last and
swaps the staging folder into ``results/<model-slug>/<chapter>/``. A run that
crashes before that leaves the previous complete run untouched.

Tables are Parquet files written deterministically (fixed compression, no
timestamps): the same data gives byte-identical files and the same checksums.

Naming and writing the files is :mod:`~depthkit.core.run_files`; recording a run,
:mod:`~depthkit.core.run_recorder`; this module loads complete runs back and keeps
every name where chapters and notebooks import it from.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from depthkit.core.run_files import MANIFEST, ResultsError, _model_name, _sha256, model_slug, results_root
from depthkit.core.run_files import write_parquet as write_parquet
from depthkit.core.run_recorder import RunRecorder

if TYPE_CHECKING:
    from depthkit.core.model_info import HasInfo, ModelInfo

__all__ = ["ResultsError", "Run", "RunRecorder", "list_runs", "load_run", "model_slug", "results_root"]


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
    ModelInfo or model), with every table checked against the manifest's checksum.

    >>> import tempfile
    >>> import pandas as pd
    >>> import depthkit as dk
    >>> tmp = tempfile.TemporaryDirectory()
    >>> with dk.RunRecorder("01_guess_then_refine", "tiny-llama", {"n_prompts": 12}, seed=0, root=tmp.name) as rec:
    ...     _ = rec.table("buckets", pd.DataFrame({"bucket": [1, 2]}))
    >>> run = dk.load_run("tiny-llama", "01", root=tmp.name)
    >>> run.params, run["buckets"]["bucket"].tolist()
    ({'n_prompts': 12}, [1, 2])
    >>> tmp.cleanup()
    """
    name = _model_name(model)
    model_dir = results_root(root) / model_slug(model)
    folder_name = _chapter_folder(model_dir, str(chapter))
    folder = model_dir / folder_name
    command = f"`depthkit run {chapter} --model {name}`"
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        folder, manifest_path = _interrupted_run(model_dir, folder_name, folder, manifest_path)
    if not manifest_path.is_file():
        raise ResultsError(f"no complete run of chapter {chapter} for model {name} (looked in {folder}); run {command}")
    manifest = _complete_manifest(manifest_path, command)
    return Run(manifest=manifest, tables=_checked_tables(folder, manifest, command), path=folder)


def _interrupted_run(model_dir: Path, folder_name: str, folder: Path, manifest_path: Path) -> tuple[Path, Path]:
    """The folder and manifest to load when the run's own folder has no manifest."""
    # A run that died between the two renames of finish() left the previous
    # complete run in a trash folder; it is still the latest complete result.
    previous = sorted(model_dir.glob(f".{folder_name}.trash-*/{MANIFEST}"), key=lambda p: p.stat().st_mtime)
    if previous and not folder.exists():
        warnings.warn(
            f"{folder} is missing (a run was interrupted while saving); loading the previous run from {previous[-1].parent}.",
            stacklevel=3,
        )
        return previous[-1].parent, previous[-1]
    return folder, manifest_path


def _complete_manifest(manifest_path: Path, command: str) -> dict[str, Any]:
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
    return manifest


def _checked_tables(folder: Path, manifest: dict[str, Any], command: str) -> dict[str, pd.DataFrame]:
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
    return tables


def list_runs(root: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """Complete runs under ``root``: DataFrame[model, chapter, finished, n_tables,
    path], sorted by model and chapter. Folders with a missing or unreadable manifest
    are skipped (with a warning for damaged ones); checksums are checked by load_run.

    >>> import tempfile
    >>> import pandas as pd
    >>> import depthkit as dk
    >>> tmp = tempfile.TemporaryDirectory()
    >>> with dk.RunRecorder("01_guess_then_refine", "tiny-llama", {}, seed=0, root=tmp.name) as rec:
    ...     _ = rec.table("buckets", pd.DataFrame({"bucket": [1, 2]}))
    >>> dk.list_runs(tmp.name)[["model", "chapter", "n_tables"]].values.tolist()
    [['tiny-llama', '01_guess_then_refine', 1]]
    >>> tmp.cleanup()
    """
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
