"""Shared fixtures. Tests never touch the network and never reuse the user's caches."""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Every process this session starts inherits the mark, however deep, so the
# session can find at its end anything it started that is still running.
SESSION_MARK = "DEPTHKIT_TEST_SESSION"
os.environ[SESSION_MARK] = uuid.uuid4().hex

import pytest  # noqa: E402


def processes_of_this_session() -> list[Any]:
    """Live processes (zombies excluded) other than this one that carry this
    session's mark in their environment: whatever the tests started and left."""
    import psutil

    mark, me, found = os.environ[SESSION_MARK], os.getpid(), []
    for proc in psutil.process_iter():
        try:
            if proc.pid != me and proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(SESSION_MARK) == mark:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite leaves no process behind: anything still running a few seconds
    after the last test fails the session, is named, and is then killed."""
    import psutil

    left = processes_of_this_session()
    _, left = psutil.wait_procs(left, timeout=5)
    left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not left:
        if reporter:
            reporter.write_line("leftover processes: none")
        return
    lines = []
    for proc in left:
        try:
            lines.append(f"  pid {proc.pid}: {' '.join(proc.cmdline())[:200]}")
            proc.kill()
        except psutil.Error:
            continue
    if reporter:
        reporter.write_line("leftover processes (killed now; a test leaked them):\n" + "\n".join(lines), red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Lenses, frequency tables and results of a test session live in a fresh folder,
    so a green run never depends on something a developer cached by hand."""
    if "DEPTHKIT_TEST_KEEP_CACHE" not in os.environ:
        os.environ["DEPTHKIT_CACHE"] = str(tmp_path_factory.mktemp("depthkit-cache"))
    os.environ["DEPTHKIT_RESULTS"] = str(tmp_path_factory.mktemp("depthkit-results"))
    yield


@pytest.fixture(scope="session")
def tiny_models():
    import depthkit as dk

    return {arch: dk.load_model(f"tiny-{arch}", seed=0) for arch in ("llama", "gpt2", "neox", "gemma3")}


@pytest.fixture(scope="session")
def tiny_llama(tiny_models):
    return tiny_models["llama"]


@pytest.fixture(scope="session")
def smollm2():
    import depthkit as dk

    return dk.load_model("smollm2-135m")


REPO = Path(__file__).resolve().parent.parent


@dataclass
class ToyChapter:
    """A throwaway chapter for runner and book tests: same fields as
    :class:`depthkit.chapters.Chapter`, but the notebook lives wherever the test puts it."""

    id: str
    slug: str
    title: str
    notebook: Path
    smoke: dict[str, Any] = field(default_factory=dict)


def hooked_patch(model: Any, tokens: list[int], layer: int, vector: Any) -> Any:
    """The final residual at the last position of a plain TransformerLens hooked run
    of the whole of ``tokens`` with ``vector`` written into that position at depth
    ``layer``: the independent computation every patched run is checked against."""
    import torch

    from depthkit.engine.capture import residual_hook_names

    names, seen = residual_hook_names(int(model.cfg.n_layers)), {}

    def write(x, hook):  # noqa: ARG001
        x = x.clone()
        x[0, -1] = vector
        return x

    def read(x, hook):  # noqa: ARG001
        seen["h"] = x[0, -1].float().clone()
        return x

    with torch.no_grad():
        model.run_with_hooks(torch.tensor([list(tokens)]), fwd_hooks=[(names[layer], write), (names[-1], read)])
    return seen["h"]


def toy_notebook(path: Path, params: str, cells: list[tuple[str, str]]) -> Path:
    """Write a notebook: a tagged parameters cell, then ``(kind, source)`` cells
    (kind ``"md"`` or ``"code"``)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    p = nbformat.v4.new_code_cell(params)
    p.metadata["tags"] = ["parameters"]
    make = {"md": nbformat.v4.new_markdown_cell, "code": nbformat.v4.new_code_cell}
    first = [make[k](src) for k, src in cells[:1] if k == "md"]
    rest = [make[k](src) for k, src in cells[len(first):]]
    nb.cells = [*first, p, *rest]
    nbformat.write(nb, path)
    return path


def book_root_copy(root: Path) -> Path:
    """A book folder with the repository's configuration and prose pages, so test
    builds never touch the repository's own book/chapters or _build."""
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(REPO / name, root / name)
    (root / "book").mkdir()
    for path in (REPO / "book").iterdir():
        if path.is_file():
            shutil.copy(path, root / "book" / path.name)
    return root


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory):
    """The CI smoke build, done once per session: every chapter executed with its
    smoke parameters on the real default model, then the HTML book built.
    Returns (index.html, results root)."""
    from depthkit.book import runner as book
    from depthkit.chapters import available_chapters
    from depthkit.engine.models import DEFAULT_MODEL

    chapters = available_chapters()
    if not chapters:
        pytest.skip("no chapter notebook exists yet under notebooks/")
    root = book_root_copy(tmp_path_factory.mktemp("smoke-book"))
    results = root / "results"
    start = time.perf_counter()
    # papermill's own warnings (unknown parameter, unparsable parameters cell) are
    # kept for test_chapters to read.
    warned: list[str] = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = lambda record: warned.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("papermill").addHandler(handler)
    try:
        index = book.build_book(DEFAULT_MODEL, chapters, smoke=True, force=True, root=root, results_root=results)
    finally:
        logging.getLogger("papermill").removeHandler(handler)
    (root / "papermill-warnings.txt").write_text("\n".join(warned))
    print(f"\nsmoke book: {len(chapters)} chapters executed and built in {time.perf_counter() - start:.0f} s")
    return Path(index), results
