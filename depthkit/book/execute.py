"""Executing one chapter notebook with papermill (:func:`execute_chapter`): skipped
when its stamp says the same notebook already ran with the same parameters, code
and inputs; otherwise run in a kernel of this interpreter
(:mod:`~depthkit.book.kernel`) into ``<slug>.partial.ipynb``, cleaned for the
static book (:func:`clean_executed`), and only then moved into place with its stamp.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from depthkit import plots
from depthkit.book import pages as book_pages
from depthkit.book.kernel import _kernel_of_this_interpreter, _kernel_usage, _time_shares
from depthkit.book.site import BookError
from depthkit.book.stamps import fingerprint_of, is_current, output_paths, results_digest, run_hash
from depthkit.core.files import atomic_write

__all__ = ["ChapterFailed", "ChapterLike", "ChapterResult", "clean_executed", "execute_chapter"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# tqdm's notebook bars are widgets whose saved text is the bar as first drawn
# ("  0%|   | 0/3"): without the widget's live updates it would mislead.
_PROGRESS_BAR = re.compile(r"^[^|]*\d+%\|")
WIDGET_NOTE = "Interactive widget: open this chapter's notebook in JupyterLab to use it."


class ChapterLike(Protocol):
    id: str
    slug: str
    title: str
    smoke: dict[str, Any]

    @property
    def notebook(self) -> Path: ...


class ChapterFailed(BookError):
    """A chapter notebook raised. Carries the failing cell's error, not its traceback."""

    def __init__(self, chapter: ChapterLike, ename: str, evalue: str, partial: Path, cell: int | None = None):
        self.chapter, self.ename, self.evalue, self.partial, self.cell = chapter, ename, evalue, partial, cell
        where = f" in cell [{cell}]" if cell is not None else ""
        super().__init__(
            f"Chapter {chapter.id} ({chapter.title}) failed{where}: {ename}: {evalue}\n"
            f"Partially executed notebook: {partial}"
        )


@dataclass(frozen=True)
class ChapterResult:
    chapter: ChapterLike
    status: str  # "ran" or "unchanged"
    notebook: Path
    elapsed_s: float


def clean_executed(nb: Any, kernelspec: dict[str, Any] | None) -> Any:
    """Make an executed notebook fit for the static book: drop the chart bundle
    output (the book ships the bundle once), drop saved widget state (it would
    pull require.js and the widget manager from a CDN), drop progress-bar
    widgets, replace other widgets by a note saying where they work, restore
    the source notebook's kernelspec, and keep papermill's injected-parameters cell
    out of the rendered page (it holds this machine's paths; the run's parameters
    are in the results manifest, and the notebook file keeps the cell)."""
    nb.metadata.pop("widgets", None)
    if kernelspec:
        nb.metadata["kernelspec"] = kernelspec
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        tags = cell.setdefault("metadata", {}).setdefault("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")
        kept = []
        for out in cell.get("outputs", []):
            if out.get("metadata", {}).get(plots.BUNDLE_MARK):
                continue
            data = out.get("data", {})
            if "application/vnd.jupyter.widget-view+json" in data:
                text = data.get("text/plain", "")
                if _PROGRESS_BAR.match("".join(text) if isinstance(text, list) else text):
                    continue
                out["data"] = {"text/plain": WIDGET_NOTE, "text/html": f"<p><em>{WIDGET_NOTE}</em></p>"}
            kept.append(out)
        cell["outputs"] = kept
    return nb


def execute_chapter(
    chapter: ChapterLike,
    params: dict[str, Any],
    out_dir: Path,
    force: bool = False,
    progress: bool = False,
    work_dir: Path | None = None,
    fingerprint: str | None = None,
) -> ChapterResult:
    """Execute one chapter notebook with papermill into ``out_dir/<slug>.ipynb``
    unless its stamp says the same notebook already ran with the same parameters,
    code and (for a chapter that reads saved results) results. Raises
    :class:`ChapterFailed` with the failing cell's error."""
    import nbformat
    import papermill

    source = Path(chapter.notebook)
    if not source.is_file():
        raise BookError(f"Chapter {chapter.id} ({chapter.title}): notebook {source} does not exist.")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    executed, stamp_path, partial = output_paths(out_dir, chapter.slug)
    digest = _run_digest(chapter, source, params, fingerprint)
    if not force and is_current(out_dir, chapter.slug, digest):
        return ChapterResult(chapter, "unchanged", executed, 0.0)

    kernelspec = nbformat.read(source, as_version=4).metadata.get("kernelspec")
    start = time.perf_counter()
    work = Path(work_dir) if work_dir else out_dir / ".work"
    peak_file, shares_file = work / f"{chapter.slug}.peak.json", work / f"{chapter.slug}.shares.json"
    peak_file.unlink(missing_ok=True)
    shares_file.unlink(missing_ok=True)
    with _kernel_of_this_interpreter(work, peak_file, shares_file) as kernel:
        try:
            papermill.execute_notebook(
                str(source),
                str(partial),
                parameters=params,
                kernel_name=kernel,
                progress_bar=progress,
                cwd=str(source.parent),
            )
        except papermill.PapermillExecutionError as err:
            raise ChapterFailed(chapter, err.ename, _plain(err.evalue), partial, err.exec_count) from None
        except Exception as err:  # kernel death, timeouts, unreadable notebooks
            raise ChapterFailed(chapter, type(err).__name__, _plain(str(err)), partial) from None
    elapsed = time.perf_counter() - start
    stamp = _stamp(chapter, digest, params, elapsed, peak_file, shares_file)
    _write_executed(chapter, stamp, partial, executed, stamp_path, kernelspec)
    return ChapterResult(chapter, "ran", executed, elapsed)


def _run_digest(chapter: ChapterLike, source: Path, params: dict[str, Any], fingerprint: str | None) -> str:
    """The hash a run is stamped with: notebook, parameters, code and, for a chapter
    that reads saved results, those results."""
    reads_results = getattr(chapter, "reads_results", False) and params.get("results_root")
    inputs = results_digest(Path(params["results_root"])) if reads_results else ""
    return run_hash(source, params, fingerprint if fingerprint is not None else fingerprint_of(chapter), inputs)


def _stamp(
    chapter: ChapterLike, digest: str, params: dict[str, Any], elapsed: float, peak_file: Path, shares_file: Path
) -> dict[str, Any]:
    return {
        "chapter": chapter.id,
        "hash": digest,
        "params": params,
        "elapsed_s": round(elapsed, 1),
        **_kernel_usage(peak_file),
        "time_s": _time_shares(shares_file),
        **book_pages.machine(),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _write_executed(
    chapter: ChapterLike, stamp: dict[str, Any], partial: Path, executed: Path, stamp_path: Path, kernelspec: Any
) -> None:
    """Clean the finished notebook into place, then its stamp, then drop the partial one."""
    import nbformat

    nb = clean_executed(nbformat.read(partial, as_version=4), kernelspec)
    # The box is written into the executed notebook: the page keeps this run's numbers
    # for as long as it shows this run's outputs.
    nb = book_pages.insert_run_box(nb, book_pages.run_box(chapter, stamp))
    atomic_write(executed, nbformat.writes(nb))
    atomic_write(stamp_path, json.dumps(stamp, indent=1, default=str))
    partial.unlink(missing_ok=True)


def _plain(text: str) -> str:
    """First lines of an error message, without terminal colour codes."""
    lines = _ANSI.sub("", text or "").strip().splitlines()
    short = "\n".join(lines[:5])
    return short + (" ..." if len(lines) > 5 else "")
