"""Reference runs: chapters executed on a model too slow for the cold build (the
second embedded model, a user's own model), kept in the repository with their
provenance so the book shows them beside the default model's fresh runs.

A reference run is made by the project's own command, ``depthkit run NN --model
NAME --reference`` (or ``depthkit reference`` for every saved one), and lives in
``reference/<model>/<chapter slug>/``:

* ``page.ipynb``: the executed notebook, as the book shows it;
* ``stamp.json``: the runner's stamp (parameters, wall time, peak memory) plus
  ``provenance``: commit, date, CPU, the command and the SHA-256 of the lens
  sidecars of that model;
* ``run/``: the saved result tables and manifest (:mod:`depthkit.core.results`).

A robustness run (the same model under another lens, layer convention or lens seed,
``--variant NAME``) is kept the same way under ``reference/_robustness/NAME/`` and
installed under ``<results>/_robustness/NAME/``, where :mod:`depthkit.verdicts`
reads it for the findings page's robustness column; it gets no page of its own.

``depthkit book`` installs them: the tables into the results root (where chapter
07 and the findings page read every model), unless a run of the user's own is
already there, and the pages as a part of the book per model, each opening with a
box that says it is a reference run and whether the chapter's code changed since.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from depthkit.book import pages as book_pages
from depthkit.book import stamps
from depthkit.book.site import ROOT, BookError
from depthkit.core.files import atomic_dir, atomic_write, cache_dir
from depthkit.core.results import ResultsError, load_run, model_slug
from depthkit.verdicts import ROBUSTNESS_DIR

REFERENCE_ROOT = ROOT / "reference"
# Put in a results folder installed from a reference run: a later install may
# replace it; a folder without it is the user's own run and is left alone.
MARK = ".from-reference.json"
BOX_TAG = "depthkit-reference-box"


@dataclass(frozen=True)
class ReferenceRun:
    model: str
    chapter: Any
    folder: Path
    stamp: dict[str, Any]
    variant: str | None = None

    @property
    def provenance(self) -> dict[str, Any]:
        return self.stamp.get("provenance", {})

    def is_stale(self, fingerprint: str | None = None) -> bool:
        """True when the notebook or depthkit's code (or a package that shapes the
        results) changed since the run: the runner's hash of the run differs."""
        fingerprint = fingerprint if fingerprint is not None else stamps.fingerprint_of(self.chapter)
        digest = stamps.run_hash(self.chapter.notebook, self.stamp.get("params", {}), fingerprint)
        return digest != self.stamp.get("hash")


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _commit() -> str:
    head = _git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = _git("status", "--porcelain", "--", "depthkit", "notebooks")
    return head + ("+uncommitted changes" if dirty else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def lens_sidecars(model: str) -> dict[str, str]:
    """SHA-256 of every saved lens sidecar of ``model`` in the depthkit cache."""
    folder = cache_dir("lenses", model_slug(model))
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.json"))}


def provenance(chapter: Any, model: str, stamp: dict[str, Any], command: str) -> dict[str, Any]:
    return {
        "commit": _commit(),
        "date": stamp.get("finished"),
        "cpu": cpu_name(),
        "cpus": stamp.get("cpus"),
        "wall_s": stamp.get("elapsed_s"),
        "command": command,
        "lens_sidecars": lens_sidecars(model),
    }


def variant_root(root: Path, variant: str | None) -> Path:
    """Where a variant's runs live under a reference or results folder."""
    return Path(root) / ROBUSTNESS_DIR / variant if variant else Path(root)


def save(
    chapter: Any, model: str, pages: Path, results_root: Path, command: str, dest: Path = REFERENCE_ROOT,
    variant: str | None = None,
) -> Path:  # fmt: skip
    """Keep the run of ``chapter`` on ``model`` that the runner just wrote (its page in
    ``pages``, its tables under ``results_root``, already the variant's) as a
    reference run, or as a robustness run under ``variant``; returns its folder."""
    executed, stamp_path, _ = stamps.output_paths(pages, chapter.slug)
    stamp = stamps.read_stamp(stamp_path)
    if stamp is None or not executed.is_file():
        raise BookError(f"Chapter {chapter.id} has no finished run in {pages} to keep as a reference run.")
    try:
        run = load_run(model, chapter.slug, root=results_root)
    except ResultsError as err:
        raise BookError(f"Chapter {chapter.id} on {model}: its results cannot be kept as a reference run: {err}") from None
    stamp = {**stamp, "provenance": provenance(chapter, model, stamp, command)}
    target = variant_root(dest, variant) / model_slug(model) / chapter.slug
    with atomic_dir(target) as tmp:
        shutil.copyfile(executed, tmp / "page.ipynb")
        shutil.copytree(run.path, tmp / "run")
        (tmp / "stamp.json").write_text(json.dumps(stamp, indent=1, default=str), encoding="utf-8")
    return target


def find(dest: Path = REFERENCE_ROOT, chapters: Sequence[Any] | None = None) -> list[ReferenceRun]:
    """Every reference run under ``dest``, by model then chapter, then every
    robustness run, by variant."""
    from depthkit.chapters import CHAPTERS

    known = {c.slug: c for c in (chapters if chapters is not None else CHAPTERS.values())}
    found = []
    for pattern in ("*/*/stamp.json", f"{ROBUSTNESS_DIR}/*/*/*/stamp.json"):
        for stamp_path in sorted(Path(dest).glob(pattern)):
            folder = stamp_path.parent
            stamp = stamps.read_stamp(stamp_path)
            if folder.name not in known or stamp is None or not (folder / "page.ipynb").is_file():
                continue
            model = str(stamp.get("params", {}).get("model") or folder.parent.name)
            variant = folder.parent.parent.name if pattern.startswith(ROBUSTNESS_DIR) else None
            found.append(ReferenceRun(model, known[folder.name], folder, stamp, variant))
    return found


def box(ref: ReferenceRun, stale: bool) -> str:
    """The admonition that opens a reference run's page."""
    p = ref.provenance
    when = str(p.get("date") or ref.stamp.get("finished", ""))[:10]
    made = (
        f"This page is a **reference run** kept in the repository: chapter {ref.chapter.id} on `{ref.model}`, "
        f"executed by `{p.get('command', 'depthkit run')}` on {when} at commit `{p.get('commit', 'unknown')}` on "
        f"{p.get('cpu', 'an unrecorded CPU')} ({p.get('cpus', '?')} cores) in "
        f"{book_pages.duration(float(ref.stamp.get('elapsed_s') or 0))}."
    )
    if stale:
        now = (
            ":class: warning\n\n" + made + " **The chapter's code has changed since** (its notebook, depthkit's code "
            "or a package that shapes the results): its numbers are those of the older code. Re-run it with "
            f"`{_rerun(ref)}`."
        )
    else:
        now = ":class: note\n\n" + made + " The chapter's code has not changed since that run."
    return ":::{admonition} Reference run\n" + now + "\n:::"


def _kind(ref: ReferenceRun) -> str:
    return f"robustness run '{ref.variant}'" if ref.variant else "reference run"


def _rerun(ref: ReferenceRun) -> str:
    variant = f" --variant {ref.variant}" if ref.variant else ""
    return f"depthkit reference --model {ref.model} --chapters {ref.chapter.id}{variant}"


def _install_results(ref: ReferenceRun, results_root: Path) -> bool:
    """Copy the run's tables into the results root unless the user's own run of the
    same model and chapter is there; True when copied."""
    target = variant_root(results_root, ref.variant) / model_slug(ref.model) / ref.folder.name
    if target.exists() and not (target / MARK).is_file():
        return False
    mark = {"reference": str(ref.folder), "hash": ref.stamp.get("hash")}
    if (target / MARK).is_file() and json.loads((target / MARK).read_text(encoding="utf-8")) == mark:
        return True  # already this run
    with atomic_dir(target) as tmp:
        shutil.copytree(ref.folder / "run", tmp, dirs_exist_ok=True)
        (tmp / MARK).write_text(json.dumps(mark), encoding="utf-8")
    return True


def _install_page(ref: ReferenceRun, pages: Path, stale: bool) -> str:
    import nbformat

    nb = nbformat.read(ref.folder / "page.ipynb", as_version=4)
    cell = nbformat.v4.new_markdown_cell(box(ref, stale), metadata={"tags": [BOX_TAG]})
    nb.cells = [c for c in nb.cells if BOX_TAG not in c.get("metadata", {}).get("tags", [])]
    at = next((i for i, c in enumerate(nb.cells) if book_pages.BOX_TAG in c.get("metadata", {}).get("tags", [])), 0)
    nb.cells.insert(at, cell)
    rel = f"{model_slug(ref.model)}/{ref.chapter.slug}"
    text = nbformat.writes(nb)
    target = Path(pages) / f"{rel}.ipynb"
    if not target.is_file() or target.read_text(encoding="utf-8") != text:
        atomic_write(target, text)
    return rel


def install(
    refs: Sequence[ReferenceRun], pages: Path, results_root: Path, skip_model: str, echo: Callable[[str], None] = print
) -> dict[str, list[str]]:
    """Install the reference runs of every model but ``skip_model`` (the one this
    build executes) and every robustness run; returns {model: [page paths under
    ``pages``]}. Warns about stale ones and about runs the user's own results take
    precedence over."""
    parts: dict[str, list[str]] = {}
    for ref in refs:
        if ref.variant is None and model_slug(ref.model) == model_slug(skip_model):
            continue
        stale = ref.is_stale()
        if stale:
            echo(
                f"      warning: the {_kind(ref)} of chapter {ref.chapter.id} on {ref.model} predates a change to its "
                f"code; re-run it with `{_rerun(ref)}`"
            )
        if not _install_results(ref, results_root):
            echo(f"      {ref.model} {ref.chapter.slug}: your own saved run is used, not the reference run's tables")
        if ref.variant is None:
            parts.setdefault(ref.model, []).append(_install_page(ref, pages, stale))
    return parts
