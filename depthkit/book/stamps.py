"""Stamps: what an executed chapter depended on, so that an unchanged chapter is not
executed again and a kept run (:mod:`depthkit.book.reference`) can say whether its code
changed since.

A stamp is a JSON file next to the executed notebook; its ``hash`` covers the source
notebook, the parameters, depthkit's own code (but the runner's) and the versions
of the packages that shape results, and for a chapter that reads other chapters'
saved results, those results.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent.parent
# Packages whose version changes what a chapter computes or shows.
_VERSIONED_PACKAGES = ("torch", "transformer-lens", "transformers", "altair", "papermill", "numpy", "pandas")
# The runner (the book package and the command line) runs outside the chapters'
# kernels, and the old import paths only point at other modules: editing them does
# not change what a chapter computes.
_RUNNER_FILES = {"cli.py", "_moved.py"}
_RUNNER_PACKAGES = ("book/", "exercises/")  # no chapter imports the exercises


def results_digest(results_root: Path) -> str:
    """Hash of every complete run's manifest under ``results_root``: it changes
    whenever any model's saved results do (a manifest is written last, once per
    finished run)."""
    from depthkit.core.results import MANIFEST

    digest = hashlib.sha256()
    root = Path(results_root)
    for path in sorted(root.glob(f"*/*/{MANIFEST}")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _other_chapters(rel: str, chapter_id: str | None) -> bool:
    """True for code that only other chapters run: their own modules, and the
    verdicts that only chapter 07 (which reads every chapter) computes."""
    if chapter_id is None:
        return False
    own = rel.startswith(f"chapters/ch{chapter_id}_") or not rel.startswith("chapters/ch")
    return not own or rel.startswith("verdicts/")


def source_fingerprint(chapter_id: str | None = None) -> str:
    """Hash of depthkit's code and data files (but the runner's) and of the
    versions of the packages that shape results: a change to any of them makes a
    chapter stale. With ``chapter_id``, the modules of other chapters are left out,
    so editing chapter 03's module does not make chapter 02's run stale; without
    it (a chapter reading every chapter's results, e.g. 07) all code counts."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*")):
        rel = path.relative_to(PACKAGE_DIR).as_posix()
        if rel in _RUNNER_FILES or rel.startswith(_RUNNER_PACKAGES):
            continue
        if _other_chapters(rel, chapter_id):
            continue
        if path.is_file() and path.suffix in {".py", ".json", ".jsonl"} and "__pycache__" not in path.parts:
            digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode())
            digest.update(path.read_bytes())
    for name in _VERSIONED_PACKAGES:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "-"
        digest.update(f"{name}=={version}".encode())
    return digest.hexdigest()


def fingerprint_of(chapter: Any) -> str:
    """:func:`source_fingerprint` as it applies to ``chapter``."""
    return source_fingerprint(None if getattr(chapter, "reads_results", False) else chapter.id)


def run_hash(notebook: Path, params: dict[str, Any], fingerprint: str | None = None, inputs: str = "") -> str:
    """What an executed chapter depends on: its notebook, parameters, depthkit's code,
    and ``inputs`` (for chapters that read other chapters' saved results)."""
    digest = hashlib.sha256()
    digest.update(Path(notebook).read_bytes())
    digest.update(json.dumps(params, sort_keys=True, default=str).encode())
    digest.update((fingerprint if fingerprint is not None else source_fingerprint()).encode())
    digest.update(inputs.encode())
    return digest.hexdigest()


def output_paths(out_dir: Path, slug: str) -> tuple[Path, Path, Path]:
    """(executed notebook, stamp, partial notebook) of a chapter."""
    out_dir = Path(out_dir)
    return out_dir / f"{slug}.ipynb", out_dir / f"{slug}.stamp.json", out_dir / f"{slug}.partial.ipynb"


def read_stamp(path: Path) -> dict[str, Any] | None:
    try:
        stamp = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def is_current(out_dir: Path, slug: str, digest: str) -> bool:
    """True when the executed notebook exists and its stamp matches ``digest``."""
    executed, stamp_path, _ = output_paths(out_dir, slug)
    stamp = read_stamp(stamp_path)
    return executed.is_file() and stamp is not None and stamp.get("hash") == digest
