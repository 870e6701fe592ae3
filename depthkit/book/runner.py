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

Executing one chapter is :mod:`~depthkit.book.execute` (in a kernel set up by
:mod:`~depthkit.book.kernel`); this module checks the parameters, runs the chapters
in turn and builds the HTML, and keeps every name where the command line and the
tests import it from.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from depthkit import verdicts
from depthkit.book import pages as book_pages
from depthkit.book import reference
from depthkit.book.execute import WIDGET_NOTE as WIDGET_NOTE
from depthkit.book.execute import ChapterFailed as ChapterFailed
from depthkit.book.execute import ChapterLike, ChapterResult, execute_chapter
from depthkit.book.execute import clean_executed as clean_executed
from depthkit.book.kernel import KERNEL_NAME as KERNEL_NAME
from depthkit.book.kernel import _kernel_of_this_interpreter as _kernel_of_this_interpreter
from depthkit.book.site import ROOT, BookError, build_html, prepare_static, write_build_toc
from depthkit.book.stamps import fingerprint_of as fingerprint_of
from depthkit.book.stamps import is_current as is_current
from depthkit.book.stamps import output_paths, read_stamp
from depthkit.book.stamps import results_digest as results_digest
from depthkit.book.stamps import run_hash as run_hash

__all__ = ["ROOT", "BookError", "build_book", "chapter_params", "execute_chapter", "run_chapter"]

Echo = Callable[[str], None]
Planned = list[tuple[ChapterLike, dict[str, Any]]]


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
        for key in ("model", "dtype", "device", "device_map", "backend", "remote"):
            extra.pop(key, None)
    params.update(extra)
    if spec is not None:
        from depthkit.chapters import validate_run

        params.update(validate_run(chapter, params))  # type: ignore[arg-type]
    return params


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
        planned = _executed_only(planned, out_dir, echo)
    refs = reference.find(references, [c for c, _ in planned]) if references else []
    ref_pages = reference.install(refs, out_dir, results_root, skip_model=model, echo=echo)
    _run_chapters(planned, out_dir, build_dir, execute=execute, force=force, progress=progress, echo=echo)
    return _build_html(root, planned, out_dir, build_dir, results_root, ref_pages, echo)


def _executed_only(planned: Planned, out_dir: Path, echo: Echo) -> Planned:
    """The planned chapters that have an executed notebook to build from."""
    echo(f"depthkit book: HTML from the executed chapters in {out_dir} (none re-run but those reading saved results)")
    kept = []
    for c, p in planned:
        if output_paths(out_dir, c.slug)[0].is_file():
            kept.append((c, p))
        else:
            echo(f"      {c.id} {c.title}: never executed, left out (run `depthkit run {c.id}`)")
    return kept


def _run_chapters(
    planned: Planned, out_dir: Path, build_dir: Path, *, execute: bool, force: bool, progress: bool, echo: Echo
) -> None:
    """Execute the planned chapters in turn; without ``execute``, only those reading
    saved results, each with the parameters it last ran with."""
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


def _build_html(
    root: Path, planned: Planned, out_dir: Path, build_dir: Path, results_root: Path, ref_pages: dict[str, list[str]], echo: Echo
) -> Path:
    """The pages the runner writes (exercises, run table, findings), then the HTML
    book with Jupyter Book; returns the path of index.html."""
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


