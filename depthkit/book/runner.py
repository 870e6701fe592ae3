"""The book runner: execute the chapter notebooks with papermill, then build the
HTML with Jupyter Book 1, offline.

``depthkit book`` (see :mod:`depthkit.cli`) calls :func:`build_book`. Each chapter
runs in a kernel of the current interpreter (so a ``.venv`` works without a
registered kernel) and is written to ``book/chapters/<slug>.ipynb``, where the
book's ``_toc.yml`` finds it. A JSON stamp next to the executed notebook records
a hash of the source notebook, the parameters and depthkit's own code, so an
unchanged chapter is not executed again. papermill writes into
``<slug>.partial.ipynb`` while it runs; only a run that finished is moved into
place, so an interrupted run never leaves a notebook that looks complete.
The stamp does not cover caches outside the repository (a retrained tuned lens,
frequency tables): after changing those, rebuild with ``--force``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from depthkit import plots, verdicts
from depthkit.book import pages as book_pages
from depthkit.book import reference, tether, time_shares
from depthkit.book.site import ROOT, BookError, build_html, prepare_static, write_build_toc
from depthkit.book.stamps import (
    fingerprint_of,
    is_current,
    output_paths,
    read_stamp,
    results_digest,
    run_hash,
)
from depthkit.core.files import atomic_write

__all__ = ["ROOT", "BookError", "build_book", "chapter_params", "execute_chapter", "run_chapter"]

KERNEL_NAME = "depthkit-python"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# tqdm's notebook bars are widgets whose saved text is the bar as first drawn
# ("  0%|   | 0/3"): without the widget's live updates it would mislead.
_PROGRESS_BAR = re.compile(r"^[^|]*\d+%\|")
WIDGET_NOTE = "Interactive widget: open this chapter's notebook in JupyterLab to use it."

Echo = Callable[[str], None]


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


# --------------------------------------------------------------------------- parameters


def parse_param(text: str) -> tuple[str, Any]:
    """Parse ``key=value`` with the value read as YAML (like papermill's ``-y``):
    ``n=200`` -> 200, ``lens=logit`` -> "logit", ``ks=[1, 10]`` -> [1, 10],
    ``x=null`` -> None."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"Parameter {text!r} is not of the form key=value (e.g. -p n_prompts=200).")
    if not key.isidentifier():
        raise ValueError(f"Parameter name {key!r} is not a Python identifier (e.g. -p n_prompts=200).")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ValueError(f"Value of parameter {key!r} is not valid YAML: {raw!r} ({err.__class__.__name__}).") from err
    if isinstance(value, dict):
        raise ValueError(f"Parameter {key!r}: give a number, a string or a list, not a mapping ({raw!r}).")
    return key, value


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    return dict(parse_param(item) for item in items)


def chapter_params(
    chapter: ChapterLike,
    model: str,
    results_root: Path,
    smoke: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The parameters a chapter is executed with: the shared ones it takes, then the
    chapter's smoke set (if asked), then explicit overrides; checked against the
    chapter's spec (unknown names, types, ranges) before anything runs. Raises
    :class:`depthkit.core.params.ParameterError`."""
    spec = getattr(chapter, "params", None)
    takes_model = spec is None or "model" in spec
    params: dict[str, Any] = {"model": model} if takes_model else {}
    params["results_root"] = str(Path(results_root).resolve())
    if smoke:
        params.update(chapter.smoke)
    extra = dict(extra or {})
    if not takes_model:
        # Options of the model (book-wide --dtype, --device, ...) mean nothing here.
        for key in ("model", "dtype", "device", "device_map"):
            extra.pop(key, None)
    params.update(extra)
    if spec is not None:
        from depthkit.chapters import validate_run

        params.update(validate_run(chapter, params))  # type: ignore[arg-type]
    return params


# --------------------------------------------------------------------------- execution


@contextlib.contextmanager
def _kernel_of_this_interpreter(work_dir: Path, peak_file: Path | None = None, shares_file: Path | None = None) -> Iterator[str]:
    """Register, for the duration of the block, a kernelspec that starts
    ``sys.executable``: papermill then runs chapters in this very environment
    whatever kernels the user has installed. The kernel runs under
    depthkit/tether.py, so it stops when the runner does, however the runner is
    stopped; with ``peak_file`` the tether writes the kernel's peak resident memory
    and CPU time there when it exits; with ``shares_file`` depthkit/time_shares.py
    writes there where the kernel's time went."""
    spec_dir = Path(work_dir) / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    launch = [str(time_shares.SCRIPT), "--out", str(shares_file), "ipykernel_launcher"] if shares_file else ["-m", "ipykernel_launcher"]
    spec = {
        # The kernel's own log (e.g. a notice about TCP transport) is noise in a build.
        "argv": [
            sys.executable, str(tether.SCRIPT), *(["--usage", str(peak_file)] if peak_file else []), "--",
            sys.executable, *launch, "-f", "{connection_file}", "--IPKernelApp.log_level=ERROR",
        ],  # fmt: skip
        "display_name": "Python (depthkit)",
        "language": "python",
        "env": {"PYDEVD_DISABLE_FILE_VALIDATION": "1"},
    }
    atomic_write(spec_dir / "kernel.json", json.dumps(spec, indent=1))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(Path(work_dir) / "jupyter"), *([old] if old else [])])
    try:
        yield KERNEL_NAME
    finally:
        if old is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = old


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
    reads_results = getattr(chapter, "reads_results", False) and params.get("results_root")
    inputs = results_digest(Path(params["results_root"])) if reads_results else ""
    digest = run_hash(source, params, fingerprint if fingerprint is not None else fingerprint_of(chapter), inputs)
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

    stamp = {
        "chapter": chapter.id,
        "hash": digest,
        "params": params,
        "elapsed_s": round(elapsed, 1),
        **_kernel_usage(peak_file),
        "time_s": _time_shares(shares_file),
        **book_pages.machine(),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    nb = clean_executed(nbformat.read(partial, as_version=4), kernelspec)
    # The box is written into the executed notebook: the page keeps this run's numbers
    # for as long as it shows this run's outputs.
    nb = book_pages.insert_run_box(nb, book_pages.run_box(chapter, stamp))
    atomic_write(executed, nbformat.writes(nb))
    atomic_write(stamp_path, json.dumps(stamp, indent=1, default=str))
    partial.unlink(missing_ok=True)
    return ChapterResult(chapter, "ran", executed, elapsed)


def _kernel_usage(path: Path) -> dict[str, float | None]:
    """The kernel's peak resident memory (MB) and CPU time (s), as
    depthkit/tether.py wrote them when the kernel exited (None where it could
    not: a kernel killed at shutdown)."""
    try:
        usage = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        usage = {}
    finally:
        Path(path).unlink(missing_ok=True)
    return {k: float(usage[k]) if isinstance(usage.get(k), (int, float)) else None for k in ("peak_rss_mb", "cpu_s")}


def _time_shares(path: Path) -> dict[str, float] | None:
    """Seconds of the kernel's busy time per category (depthkit/time_shares.py), or
    None where the sampler wrote nothing."""
    try:
        seconds = json.loads(Path(path).read_text(encoding="utf-8"))["seconds"]
        return {k: float(seconds[k]) for k in time_shares.CATEGORIES}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        Path(path).unlink(missing_ok=True)


def _plain(text: str) -> str:
    """First lines of an error message, without terminal colour codes."""
    lines = _ANSI.sub("", text or "").strip().splitlines()
    short = "\n".join(lines[:5])
    return short + (" ..." if len(lines) > 5 else "")


# --------------------------------------------------------------------------- the book


def build_book(
    model: str,
    chapters: Sequence[ChapterLike],
    smoke: bool = False,
    force: bool = False,
    root: Path = ROOT,
    results_root: Path | None = None,
    progress: bool = False,
    echo: Echo = print,
    extra: dict[str, Any] | None = None,
    execute: bool = True,
    references: Path | None = reference.REFERENCE_ROOT,
) -> Path:
    """Execute ``chapters`` (skipping unchanged ones), then build the HTML book
    under ``root/_build/html``. Returns the path of index.html.

    ``extra``: parameters for every chapter that takes them (e.g. dtype, device).
    ``execute=False`` builds the HTML from the executed notebooks as they are (for
    example after ``depthkit run 04 --model other``), refreshing only the chapters
    that read saved results (07) when those results changed.
    ``references``: the folder of reference runs (:mod:`depthkit.book.reference`) whose
    other models join the book, installed before chapter 07 reads the results;
    None leaves them out."""
    root = Path(root).resolve()
    results_root = Path(results_root or os.environ.get("DEPTHKIT_RESULTS") or root / "results").resolve()
    out_dir = root / "book" / "chapters"
    build_dir = root / "_build"
    # Every chapter's parameters are checked before the first one runs.
    planned = [(c, chapter_params(c, model, results_root, smoke, extra)) for c in chapters]
    if execute:
        mode = "smoke parameters" if smoke else "full parameters"
        echo(f"depthkit book: model {model}, {len(chapters)} chapter(s), {mode}; results in {results_root}")
    else:
        echo(f"depthkit book: HTML from the executed chapters in {out_dir} (none re-run but those reading saved results)")
        kept = []
        for c, p in planned:
            if output_paths(out_dir, c.slug)[0].is_file():
                kept.append((c, p))
            else:
                echo(f"      {c.id} {c.title}: never executed, left out (run `depthkit run {c.id}`)")
        planned = kept
    refs = reference.find(references, [c for c, _ in planned]) if references else []
    ref_pages = reference.install(refs, out_dir, results_root, skip_model=model, echo=echo)
    for i, (chapter, params) in enumerate(planned, 1):
        if not execute and not getattr(chapter, "reads_results", False):
            continue
        echo(f"[{i}/{len(planned)}] {chapter.id} {chapter.title} ...")
        if not execute:
            # Keep the model and parameters the chapter last ran with.
            stamp = read_stamp(output_paths(out_dir, chapter.slug)[1]) or {}
            params = {**params, **{k: v for k, v in stamp.get("params", {}).items() if k != "results_root"}}
        result = execute_chapter(
            chapter, params, out_dir, force=force, progress=progress, work_dir=build_dir
        )
        if result.status == "unchanged":
            echo(f"      unchanged since its last run, not executed ({result.notebook.name})")
        else:
            echo(f"      done in {book_pages.duration(result.elapsed_s)}")

    echo("Building the HTML with Jupyter Book ...")
    start = time.perf_counter()
    prepare_static(build_dir / "depthkit_static")
    from depthkit.exercises.pages import write_exercise_pages  # the Exercises part of _toc.yml

    write_exercise_pages(root / "book" / "exercises")
    # The teaching page includes this table: the runs behind the pages of this build.
    book_pages.write_run_table(root / "book", [(c, read_stamp(output_paths(out_dir, c.slug)[1])) for c, _ in planned])
    # The findings page judges the paper's claims from every model's saved results.
    verdicts.write_findings_page(root / "book", results_root)
    toc = write_build_toc(root, [c.slug for c, _ in planned], build_dir / "_toc.yml", ref_pages)
    index, warnings = build_html(root, toc, build_dir / "book-build.log")
    note = f", {warnings} Sphinx warning(s) in {build_dir / 'book-build.log'}" if warnings else ""
    echo(f"      done in {book_pages.duration(time.perf_counter() - start)}{note}")
    echo(f"The book: {index}")
    return index


def run_chapter(
    key: str,
    model: str = "",
    *,
    smoke: bool = False,
    root: Path = ROOT,
    results_root: Path | None = None,
    progress: bool = False,
    **params: Any,
) -> ChapterResult:
    """Execute one chapter into ``root/book/chapters/`` (replacing its page in the
    book) with ``params`` on top of its defaults, e.g.
    ``run_chapter("04", "gemma3-270m", n_per_tag=50)``. Parameters are checked
    first: a typo or a bad value raises ParameterError and touches nothing."""
    from depthkit.chapters import chapter as lookup
    from depthkit.engine.models import DEFAULT_MODEL

    try:
        ch = lookup(key)
    except KeyError as err:
        raise BookError(err.args[0]) from None
    if not ch.notebook.is_file():
        raise BookError(f"Chapter {ch.id} ({ch.title}) has no notebook yet ({ch.notebook}).")
    results_root = Path(results_root or os.environ.get("DEPTHKIT_RESULTS") or Path(root) / "results").resolve()
    final = chapter_params(ch, model or DEFAULT_MODEL, results_root, smoke=smoke, extra=params)
    return execute_chapter(
        ch, final, Path(root) / "book" / "chapters", force=True, progress=progress, work_dir=Path(root) / "_build"
    )


