"""Every chapter, end to end, on the real default model with its smoke parameters.

* the whole book is built from smoke runs of every chapter (the CI smoke build);
* every chapter validates its parameters before doing any work;
* a run killed midway loses nothing and the next run succeeds;
* the same parameters and seed give byte-identical result tables.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from depthkit.chapters import available_chapters, chapter
from depthkit.core.params import ParameterError
from depthkit.core.results import load_run
from depthkit.engine.models import DEFAULT_MODEL

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
CHAPTERS = available_chapters()


def test_every_chapter_executes_and_records_complete_results(smoke_book):
    index, results = smoke_book
    assert index.is_file()
    for ch in CHAPTERS:
        assert (index.parent / "book" / "chapters" / f"{ch.slug}.html").is_file(), ch.slug
        executed = index.parent.parent.parent / "book" / "chapters" / f"{ch.slug}.ipynb"
        assert executed.is_file(), ch.slug
        nb = nbformat.read(executed, as_version=4)
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
        assert not errors, f"{ch.slug}: {errors[:1]}"
        if ch.id != "07":  # 07 only gathers the other chapters' results
            run = load_run(DEFAULT_MODEL, ch.slug, root=results)
            assert run.manifest["status"] == "complete"
            assert run.tables, ch.slug


def _cells(ch) -> tuple[str, str, str]:
    """Source of the cells before the parameters cell (imports), of the parameters
    cell, and of the validation cell that follows it."""
    nb = nbformat.read(ch.notebook, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    i = next(i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", []))
    return "\n".join(c.source for c in code[:i]), code[i].source, code[i + 1].source


def _defaults(source: str) -> dict:
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


def _bad_values(defaults: dict) -> list[tuple[str, object]]:
    """A wrong-type and an out-of-range value for the first integer parameter (a
    wrong-type value for the first list parameter in chapters without one)."""
    ints = [k for k, v in defaults.items() if isinstance(v, int) and not isinstance(v, bool) and k != "seed"]
    if ints:
        return [(ints[0], "many"), (ints[0], -7)]
    lists = [k for k, v in defaults.items() if isinstance(v, list)]
    return [(lists[0], 5)]


@pytest.mark.parametrize("ch", CHAPTERS, ids=[c.slug for c in CHAPTERS])
def test_every_chapter_validates_its_parameters_first(ch):
    setup_src, params_src, check_src = _cells(ch)
    setup: dict = {}
    exec(setup_src, setup)  # noqa: S102 - the notebook's own imports
    assert f'check_chapter_params("{ch.id}"' in check_src, f"{ch.slug}: the cell after the parameters must validate them"
    defaults = _defaults(params_src)
    for name, value in _bad_values(defaults):
        ns = dict(setup)
        exec(params_src, ns)  # noqa: S102 - the notebook's own parameters cell
        ns[name] = value  # what papermill's injected cell does
        with pytest.raises(ParameterError) as err:
            exec(check_src, ns)  # noqa: S102
        assert name in str(err.value) and repr(value).strip("'") in str(err.value)
    ns = dict(setup)
    exec(params_src, ns)  # noqa: S102
    exec(check_src, ns)  # noqa: S102 - the defaults themselves are valid


def test_a_bad_parameter_through_the_command_line_fails_fast_and_clearly(tmp_path):
    ch = CHAPTERS[0]
    name, _ = _bad_values(_defaults(_cells(ch)[1]))[0]
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "depthkit.cli", "run", ch.id, "-p", f"{name}=-7", "--results", str(tmp_path), "--root", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )
    assert out.returncode != 0
    assert "ParameterError" in out.stderr and name in out.stderr
    assert "Traceback" not in out.stderr
    assert time.perf_counter() - start < 120  # stopped before loading the model or training a lens
    assert not any(tmp_path.rglob("manifest.json"))


def _run_chapter(ch, results: Path, root: Path, **popen) -> subprocess.Popen:
    # --root: the executed notebook goes to root/book/chapters, never into the
    # developer's own book.
    return subprocess.Popen(
        [sys.executable, "-m", "depthkit.cli", "run", ch.id, "--smoke", "--results", str(results), "--root", str(root)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, **popen,
    )


def test_a_killed_run_loses_nothing_and_the_next_run_succeeds(smoke_book, tmp_path):
    _, results = smoke_book
    ch = chapter("01")
    before = load_run(DEFAULT_MODEL, ch.slug, root=results)
    before_bytes = {p.name: p.read_bytes() for p in before.path.iterdir()}
    executed = tmp_path / "book" / "chapters" / f"{ch.slug}.ipynb"
    executed.parent.mkdir(parents=True)
    executed.write_text("a complete notebook from an earlier run")
    executed_before = executed.read_bytes()

    proc = _run_chapter(ch, results, tmp_path)
    staging = results / before.path.parent.name
    # Kill it midway: once papermill has written its partial notebook the kernel is
    # loading the model, seconds before any table is written. A fixed delay was
    # outrun once the engine got faster. The moment of dying between two table
    # writes is covered in test_results.py.
    partial_nb = executed.parent / f"{ch.slug}.partial.ipynb"
    deadline = time.monotonic() + 120
    while not partial_nb.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)
    assert proc.poll() is None, "the run ended before it could be interrupted: " + proc.stdout.read()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL

    after = load_run(DEFAULT_MODEL, ch.slug, root=results)
    assert {p.name: p.read_bytes() for p in after.path.iterdir()} == before_bytes
    assert executed.read_bytes() == executed_before
    for partial in staging.glob(f".{ch.slug}.partial-*"):
        assert not (partial / "manifest.json").exists()

    proc = _run_chapter(ch, results, tmp_path)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    assert load_run(DEFAULT_MODEL, ch.slug, root=results).manifest["status"] == "complete"
    assert executed.read_bytes() != executed_before  # the finished run replaced it


def test_same_parameters_and_seed_give_byte_identical_tables(smoke_book, tmp_path):
    _, results = smoke_book
    ch = chapter("01")
    first = load_run(DEFAULT_MODEL, ch.slug, root=results)
    (tmp_path / "root").mkdir()
    proc = _run_chapter(ch, tmp_path, tmp_path / "root")
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    second = load_run(DEFAULT_MODEL, ch.slug, root=tmp_path)
    names = sorted(p.name for p in first.path.glob("*.parquet"))
    assert names and names == sorted(p.name for p in second.path.glob("*.parquet"))
    for name in names:
        assert (first.path / name).read_bytes() == (second.path / name).read_bytes(), name
    for key in ("seed", "model"):
        assert first.manifest[key] == second.manifest[key]
    differ = {k for k in first.params if first.params[k] != second.params.get(k)}
    assert differ == {"results_root"}  # the only thing the two runs were told differently


def test_a_normal_build_logs_no_papermill_warning(smoke_book):
    index, _ = smoke_book
    log = index.parent.parent.parent / "papermill-warnings.txt"
    assert log.read_text() == "", log.read_text()[:2000]


def test_no_chapter_writes_to_stderr(smoke_book):
    """A warning printed under a cell lands on the book's page (with this machine's paths)."""
    import json

    index, _ = smoke_book
    for nb_path in sorted((index.parent.parent.parent / "book" / "chapters").glob("*.ipynb")):
        for cell in json.loads(nb_path.read_text())["cells"]:
            for out in cell.get("outputs", []):
                assert not (out.get("output_type") == "stream" and out.get("name") == "stderr"), (nb_path.name, "".join(out["text"])[:300])


def test_no_page_shows_this_machines_paths(smoke_book):
    index, results = smoke_book
    pages = sorted((index.parent / "book" / "chapters").glob("*.html"))
    assert pages
    for page in pages:
        html = page.read_text()
        assert str(results) not in html and str(results.parent) not in html, page.name


def test_the_book_rebuilds_from_executed_chapters_without_running_them(smoke_book):
    """After `depthkit run NN --model other`, `depthkit book --no-execute` puts that
    page into the HTML as it is; chapter 07 runs again only if results changed."""
    from depthkit.book import runner as book

    index, results = smoke_book
    root = index.parent.parent.parent
    executed = root / "book" / "chapters"
    # Earlier tests re-ran chapter 01 into these results: this first rebuild re-runs
    # 07 (it reads them) if that changed them, and nothing else.
    before = {p.name: p.read_bytes() for p in executed.glob("*.ipynb")}
    book.build_book(DEFAULT_MODEL, CHAPTERS, root=root, results_root=results, execute=False, echo=lambda _: None)
    after = {p.name: p.read_bytes() for p in executed.glob("*.ipynb")}
    assert {k for k in before if before[k] != after[k]} <= {"07_across_models.ipynb"}
    before = after
    page = index.parent / "book" / "chapters" / "01_guess_then_refine.html"
    page.unlink()
    lines: list[str] = []
    start = time.perf_counter()
    out = book.build_book(DEFAULT_MODEL, CHAPTERS, root=root, results_root=results, execute=False, echo=lines.append)
    assert out == index and page.is_file()
    assert {p.name: p.read_bytes() for p in executed.glob("*.ipynb")} == before  # nothing re-executed
    steps = [line for line in lines if line.startswith("[")]
    assert steps and all(" 07 " in line for line in steps), lines  # only 07 is considered for a run
    assert any("unchanged since its last run" in line for line in lines)  # results did not change
    print(f"HTML-only rebuild: {time.perf_counter() - start:.0f} s")
