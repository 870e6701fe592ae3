"""Stopping `depthkit run` or `depthkit book` stops everything it started.

Each stop a user or a scheduler can send (Ctrl-C's SIGINT, SIGTERM, a closed
terminal's SIGHUP, SIGKILL) goes to the runner's pid alone, while a chapter's
kernel is working or while Jupyter Book builds the HTML. Every process the runner
had started (the tether, the kernel, jupyter-book) must be gone within seconds,
checked by process id, and the saved results and the executed notebook of the
earlier complete run must be untouched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import book_root_copy

from depthkit.chapters import chapter
from depthkit.core.results import load_run
from depthkit.engine.models import DEFAULT_MODEL

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
STOPS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL]
GONE_WITHIN_S = 10.0
EARLIER = "a complete notebook from an earlier run"


def _as_from_a_terminal() -> None:
    # A command started with `&` by a shell without job control (a CI script, say)
    # inherits SIGINT ignored, and Python then never turns Ctrl-C into
    # KeyboardInterrupt; a runner started from a terminal has the default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: list[str]) -> subprocess.Popen:
    # A session of its own: the test signals this pid alone, as `kill PID` does.
    return subprocess.Popen(
        [sys.executable, "-m", "depthkit.cli", *args], cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=_as_from_a_terminal,
    )  # fmt: skip


def _descendants(pid: int) -> dict[int, str]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    found = {}
    for child in children:
        try:
            found[child.pid] = " ".join(child.cmdline())
        except psutil.Error:
            continue
    return found


def _wait_for_descendant(proc: subprocess.Popen, marker: str, timeout: float = 180) -> dict[int, str]:
    """Every descendant seen until one whose command line has ``marker`` has run for
    two seconds (busy, past its start-up)."""
    seen: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        seen.update(_descendants(proc.pid))
        if any(marker in cmd for cmd in seen.values()):
            time.sleep(2)
            seen.update(_descendants(proc.pid))
            assert proc.poll() is None, "the run ended before it could be stopped: " + proc.stdout.read()[-2000:]
            return seen
        time.sleep(0.2)
    out = proc.stdout.read()[-2000:] if proc.poll() is not None else "(still running)"
    pytest.fail(f"no process with {marker!r} appeared under the runner; seen {seen}; output: {out}")


def _alive(pids: list[int]) -> list[str]:
    left = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid}: {' '.join(p.cmdline())[:160]}")
        except psutil.NoSuchProcess:
            continue
    return left


def _stop_and_check(proc: subprocess.Popen, signum: int, seen: dict[int, str]) -> None:
    os.kill(proc.pid, signum)
    out, _ = proc.communicate(timeout=60)
    if signum == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 128 + signum, out[-2000:]
        assert f"stopped by {signal.Signals(signum).name}" in out
    deadline = time.monotonic() + GONE_WITHIN_S
    while _alive(list(seen)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _alive(list(seen))
    assert not left, f"still running {GONE_WITHIN_S:.0f} s after {signal.Signals(signum).name}: {left}"


def _snapshot(results: Path) -> Callable[[], None]:
    """A check that the chapter-01 results and no staging folder changed."""
    ch = chapter("01")
    before = load_run(DEFAULT_MODEL, ch.slug, root=results)
    files = {p.name: p.read_bytes() for p in before.path.iterdir()}

    def unchanged() -> None:
        after = load_run(DEFAULT_MODEL, ch.slug, root=results)
        assert after.manifest["status"] == "complete"
        assert {p.name: p.read_bytes() for p in after.path.iterdir()} == files
        for staging in before.path.parent.glob(f".{ch.slug}.partial-*"):
            assert not (staging / "manifest.json").exists(), staging

    return unchanged


@pytest.mark.parametrize("signum", STOPS, ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("command", ["run", "book"])
def test_a_stopped_chapter_run_leaves_no_process_and_loses_nothing(command, signum, smoke_book, tmp_path):
    _, results = smoke_book
    ch = chapter("01")
    unchanged = _snapshot(results)
    root = book_root_copy(tmp_path) if command == "book" else tmp_path
    executed = root / "book" / "chapters" / f"{ch.slug}.ipynb"
    executed.parent.mkdir(parents=True, exist_ok=True)
    executed.write_text(EARLIER)
    where = ["--smoke", "--results", str(results), "--root", str(root)]
    proc = _start(["run", ch.id, *where] if command == "run" else ["book", "--chapters", ch.id, "--force", *where])

    seen = _wait_for_descendant(proc, "ipykernel_launcher")
    assert any("tether.py" in cmd for cmd in seen.values()), seen
    _stop_and_check(proc, signum, seen)

    unchanged()
    assert executed.read_text() == EARLIER  # the stopped run replaced no complete page
    assert (executed.parent / f"{ch.slug}.partial.ipynb").is_file()  # what it had done is kept
    assert not (root / "_build" / "html" / "index.html").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: signal.Signals(s).name)
def test_a_book_stopped_while_building_the_html_leaves_no_process(signum, tmp_path):
    root = book_root_copy(tmp_path)
    proc = _start(["book", "--no-execute", "--root", str(root)])
    seen = _wait_for_descendant(proc, "jupyter_book", timeout=120)
    _stop_and_check(proc, signum, seen)
    assert not (root / "_build" / "html" / "index.html").exists()
