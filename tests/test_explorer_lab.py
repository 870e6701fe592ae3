"""dk.explore works end to end in a real JupyterLab, in Chromium, with no network.

Starts ``jupyter lab`` from this interpreter on a free local port (no token, a
temporary root, isolated config, data and runtime folders, a kernel spec of this
interpreter), writes a notebook that loads the tiny Llama and calls
``dk.explore(model)``, opens it in Debian's Chromium through Playwright while every
request not to 127.0.0.1/localhost is aborted, runs the cell, types a prompt into
the widget and checks that the grid the browser shows is the one the explorer
computes here, then that switching the layer convention redraws it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import nbformat
import pytest
from test_book_browser import CHROMIUM, CHROMIUM_ARGS, _require_browser

import depthkit as dk
from depthkit.plots.explorer import Explorer, _shown

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
KERNEL = "depthkit-explorer-test"
LOCAL = {"127.0.0.1", "localhost"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_setup(tmp: Path) -> dict[str, str]:
    """Folders and settings of an isolated JupyterLab; returns its environment."""
    dirs = {name: tmp / name for name in ("root", "config", "data", "runtime")}
    for d in dirs.values():
        d.mkdir()
    spec = dirs["data"] / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "depthkit test", "language": "python"}))
    # No news or update pop-ups over the notebook (they would also try the network).
    notes = dirs["config"] / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    notes.mkdir(parents=True)
    (notes / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "depthkit test", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("import depthkit as dk\nmodel = dk.load_model('tiny-llama', seed=0)\ndk.explore(model)")]
    nbformat.write(nb, dirs["root"] / "explore.ipynb")
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(dirs["config"]),
        JUPYTER_DATA_DIR=str(dirs["data"]),
        JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
        JUPYTER_PLATFORM_DIRS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")]),
    )
    return env


def _start_lab(tmp: Path, port: int) -> tuple[subprocess.Popen, Path]:
    env = _write_setup(tmp)
    log = tmp / "jupyterlab.log"
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        "--ServerApp.port_retries=0", f"--ServerApp.root_dir={tmp / 'root'}",
        "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
        "--ServerApp.allow_root=True", "--ServerApp.terminals_enabled=False", "--LabApp.extension_manager=readonly",
        "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
    ]  # fmt: skip
    # Its own session, so that the server and the kernels it started are ended together.
    server = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"jupyter lab exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2):
                return server, log
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer on port {port} within 60 s:\n{log.read_text()[-3000:]}")


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is not None:
        return
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=5)


def _expected_last_layer(prompt: str) -> tuple[int, list[str]]:
    """The final layer and its top-1 tokens as the grid writes them, computed here."""
    model = dk.load_model("tiny-llama", seed=0)
    ex = Explorer(model)
    ex.set_prompt(prompt)
    g = ex.grid_table()
    L = int(model.cfg.n_layers)
    return L, [_shown(t) for t in g[g["layer"] == L].sort_values("position")["token"]]


def _run_first_cell(page, editor, within_s: float = 90) -> None:
    """Run the notebook's cell once its kernel is connected. A run sent while the
    kernel is still connecting can be dropped, so an unstarted cell ("[ ]") is run
    again; a queued or running one ("[*]") is left alone."""
    page.wait_for_function("() => /\\|\\s*Idle/.test(document.querySelector('.jp-StatusBar-Widget, #jp-main-statusbar')?.textContent || '')")
    prompt = page.locator(".jp-Notebook .jp-Cell .jp-InputPrompt").first
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if prompt.inner_text().strip() not in ("[ ]:", ""):
            return
        editor.click()
        page.keyboard.press("Control+Enter")
        page.wait_for_timeout(5_000)
    pytest.fail(f"the notebook's cell never started within {within_s:.0f} s (prompt {prompt.inner_text()!r})")


def test_explorer_in_jupyterlab(tmp_path):
    sync_api = _require_browser()
    pytest.importorskip("jupyterlab")
    pytest.importorskip("jupyterlab_widgets", reason="jupyterlab_widgets renders ipywidgets in JupyterLab")
    start = time.perf_counter()
    port = _free_port()
    server, log = _start_lab(tmp_path, port)
    blocked: list[str] = []
    problems: list[str] = []
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1400, "height": 1000})

            def route(r) -> None:
                if urlparse(r.request.url).hostname in LOCAL:
                    r.continue_()
                else:
                    blocked.append(r.request.url)
                    r.abort()

            context.route("**/*", route)
            page = context.new_page()
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.set_default_timeout(90_000)
            page.goto(f"http://127.0.0.1:{port}/lab/tree/explore.ipynb", wait_until="domcontentloaded")
            editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
            editor.wait_for(state="visible")
            _run_first_cell(page, editor)
            box = page.locator(".depthkit-explorer-prompt input").first
            try:
                box.wait_for(state="visible", timeout=int(os.environ.get("EXPLORER_LAB_WAIT", 120)) * 1000)
            except Exception:
                page.screenshot(path=str(tmp_path / "lab.png"))
                outputs = page.locator(".jp-Cell").all_inner_texts()
                pytest.fail(
                    f"the explorer widget did not render (screenshot {tmp_path / 'lab.png'}); cell: {outputs!r}; "
                    f"browser: {problems}; server log:\n{log.read_text()[-3000:]}"
                )
            assert "Type a prompt" in page.locator(".depthkit-explorer-status").inner_text()
            box.fill(PROMPT)
            box.press("Enter")
            grid = page.locator(".depthkit-explorer-grid")
            grid.wait_for(state="visible", timeout=60_000)
            assert grid.get_attribute("data-lens") == "logit" and grid.get_attribute("data-convention") == "canonical"
            last, expected = _expected_last_layer(PROMPT)
            assert int(grid.get_attribute("data-positions")) == len(expected)
            assert int(grid.get_attribute("data-layers")) == last + 1
            shown = page.locator(f'.depthkit-explorer-grid td[data-layer="{last}"]').all_inner_texts()
            assert shown == expected, f"browser shows {shown}, the explorer computes {expected}"
            assert "1 model run" in page.locator(".depthkit-explorer-status").inner_text()
            page.get_by_role("button", name="authors").click()
            page.wait_for_selector('.depthkit-explorer-grid[data-convention="authors"]', timeout=30_000)
            assert page.locator('.depthkit-explorer-grid td[data-layer="0"]').count() == 0  # no embedding row
            browser.close()
    finally:
        _stop(server)
    assert not blocked, f"JupyterLab or the widget asked for the network: {blocked}"
    assert not problems, problems
    print(f"\nexplorer in JupyterLab: {time.perf_counter() - start:.0f} s")
