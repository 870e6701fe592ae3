"""The built book works in a browser with no network.

Builds a small book (the real prose pages plus one throwaway chapter with two
interactive charts, math, a widget and a progress bar) with the runner, then
opens every page in Debian's Chromium through Playwright while every request
that is not file:// is aborted, and checks that no such request was made, that
every chart drew an SVG or canvas, that math was typeset, that tooltips work and
that nothing was logged as an error.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import ToyChapter, book_root_copy, toy_notebook

from depthkit.book import runner as book
from depthkit.chapters import available_chapters

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


_CHART_CELLS = [
    (
        "md",
        "# Browser test chapter\n\nInline math $\\mathrm{KL}(p_L \\,\\|\\, q_\\ell)$ and a display:\n\n"
        "$$q_\\ell = \\mathrm{softmax}\\big(W_U\\, \\mathrm{Norm}(h_\\ell)\\big)$$",
    ),
    ("code", "import altair as alt\nimport pandas as pd\nfrom depthkit import plots\nplots.enable()"),
    (
        "code",
        "df = pd.DataFrame({'layer': range(n), 'share': [(i + 1) / n for i in range(n)]})\n"
        "pick = alt.selection_point(fields=['layer'])\n"
        "(alt.Chart(df).mark_bar(size=40)\n"
        " .encode(x='layer:O', y='share:Q', tooltip=['layer', 'share'],\n"
        "         opacity=alt.condition(pick, alt.value(1.0), alt.value(0.3)))\n"
        " .add_params(pick).properties(width=400, height=300))",
    ),
    (
        "code",
        "brush = alt.selection_interval(encodings=['x'])\n"
        "line = alt.Chart(df).mark_line(point=True).encode(x='layer:Q', y='share:Q').add_params(brush)\n"
        "line | alt.Chart(df).mark_bar().encode(x='layer:O', y='share:Q').transform_filter(brush)",
    ),
    ("code", "alt.Chart(df).mark_line().encode(x='layer:Q', y='share:Q').properties(width=1200, height=200)"),
    (
        "code",
        # Chapter 00's offline explorer, on a tiny grid: prompt p's cells read ' w<p>...'.
        "grid = pd.DataFrame([{'prompt': p, 'label': f'prompt {p}', 'column': f\"' t{q}' ·{q}\", 'position': q, 'layer': l,\n"
        "                      'top1': repr(f' w{p}{q}{l}'), 'prob': 0.2 * l, 'top3': f'w{p} 50%'}\n"
        "                     for p in range(3) for q in range(4) for l in range(5)])\n"
        "plots.lens_explorer_chart(grid, title='explorer')",
    ),
    ("code", "import ipywidgets as w\nw.VBox([w.Text('prompt'), w.IntSlider()])"),
    ("code", "from tqdm.auto import tqdm\nfor _ in tqdm(range(3)):\n    pass"),
]


def _chart_notebook(path: Path) -> Path:
    return toy_notebook(path, "model = 'none'\nresults_root = None\nn = 6", _CHART_CELLS)


@pytest.fixture(scope="module")
def built_book(tmp_path_factory) -> Path:
    root = book_root_copy(tmp_path_factory.mktemp("book"))
    (root / "notebooks").mkdir()
    chapter = ToyChapter("90", "90_browser_test", "Browser test", root / "notebooks" / "90_browser_test.ipynb")
    _chart_notebook(chapter.notebook)
    index = book.build_book("none", [chapter], root=root, results_root=root / "results", echo=lambda _: None)
    return index.parent


def _pages(html: Path) -> list[Path]:
    return sorted(p for p in html.rglob("*.html") if not {"_static", "_sources"} & set(p.relative_to(html).parts))


def _require_browser() -> Any:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; scripts/install.sh --test does it)")
    return pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")


@dataclass
class _Visit:
    blocked: list[str] = field(default_factory=list)  # requests that were not file://
    problems: list[str] = field(default_factory=list)  # console errors, page errors, failed loads
    charts: dict[str, int] = field(default_factory=dict)  # page -> number of charts drawn
    too_wide: list[str] = field(default_factory=list)  # charts wider than the column they sit in
    texts: dict[str, str] = field(default_factory=dict)  # page -> text of its main element


def _visit_every_page(html: Path, on_page: Any = None) -> _Visit:
    """Open every page with the network blocked; wait for charts and math."""
    sync_api = _require_browser()
    visit = _Visit()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context()

        def route(r: Any) -> None:
            if r.request.url.startswith("file://"):
                r.continue_()
            else:
                visit.blocked.append(r.request.url)
                r.abort()

        context.route("**/*", route)
        page = context.new_page()
        page.on("console", lambda m: visit.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: visit.problems.append(f"page error: {e}"))
        # Aborted requests are either ours (recorded in `blocked`) or cancelled by
        # leaving a page; a missing local file fails with another reason.
        page.on(
            "requestfailed",
            lambda r: visit.problems.append(f"request failed: {r.url} ({r.failure})")
            if r.failure != "net::ERR_ABORTED"
            else None,
        )
        for path in _pages(html):
            name = path.relative_to(html).as_posix()
            page.goto(path.as_uri(), wait_until="networkidle")
            n_charts = page.locator(".depthkit-chart").count()
            if n_charts:
                page.wait_for_function(
                    "() => [...document.querySelectorAll('.depthkit-chart')]"
                    ".every(el => el.querySelector('svg, canvas'))",
                    timeout=30_000,
                )
            visit.charts[name] = n_charts
            widths = page.evaluate(
                "() => [...document.querySelectorAll('.depthkit-chart')].map(el => ["
                "el.querySelector('svg, canvas').getBoundingClientRect().width, el.parentElement.clientWidth])"
            )
            visit.too_wide += [f"{name} chart {i}: {w:.0f} px in {c:.0f} px" for i, (w, c) in enumerate(widths) if w > c + 1]
            if page.locator(".math").count():
                page.wait_for_function("() => document.querySelectorAll('mjx-container').length > 0", timeout=20_000)
                assert page.locator("mjx-container").count() >= page.locator(".math").count(), name
            visit.texts[name] = page.inner_text("main") if page.locator("main").count() else ""
            if on_page is not None:
                on_page(name, page)
        browser.close()
    return visit


def test_every_page_works_offline(built_book: Path) -> None:
    tooltips: list[str] = []

    def on_page(name: str, page: Any) -> None:
        if name == "book/chapters/90_browser_test.html":
            tooltips.append(_tooltip_text(page))
            tooltips.append(_explorer_follows_its_dropdown(page.locator(".depthkit-chart").nth(3)))

    visit = _visit_every_page(built_book, on_page)
    assert tooltips and tooltips[1] == "changed", tooltips[1:]
    assert {"index.html", "book/methods.html", "book/chapters/90_browser_test.html", "book/glossary.html"} <= set(
        visit.charts
    )
    assert visit.blocked == [], f"pages tried to reach the network: {visit.blocked}"
    assert visit.problems == []
    assert visit.too_wide == [], visit.too_wide
    assert visit.charts["book/chapters/90_browser_test.html"] == 4
    assert "share" in tooltips[0]
    text = visit.texts["book/chapters/90_browser_test.html"]
    assert book.WIDGET_NOTE in text
    assert "chart JavaScript loaded" not in text  # the bundle output was removed
    assert "0%|" not in text  # progress-bar widgets were removed


def test_smoke_book_of_every_chapter_works_offline(smoke_book) -> None:
    """The real chapters, executed with their smoke parameters on the default
    model, built into a book and opened page by page."""
    _require_browser()
    index, _ = smoke_book
    chapters = available_chapters()
    visit = _visit_every_page(index.parent)
    assert {f"book/chapters/{c.slug}.html" for c in chapters} <= set(visit.charts)
    assert visit.blocked == [], f"pages tried to reach the network: {visit.blocked}"
    assert visit.problems == []
    assert visit.too_wide == [], visit.too_wide


def _explorer_follows_its_dropdown(chart: Any) -> str:
    """The explorer's dropdown lists its prompts, and picking another redraws the
    grid with that prompt's tokens."""
    select = chart.locator("select")
    assert select.count() == 1 and select.locator("option").count() == 3
    marks = chart.locator("svg.marks")  # not the export menu's icon
    before = marks.inner_html()
    assert "w0" in before and "w2" not in before
    select.select_option(index=2)
    chart.page.wait_for_function("(el) => el.innerHTML.includes('w2')", arg=marks.element_handle(), timeout=5000)
    after = marks.inner_html()
    return "changed" if after != before and "w0" not in after else "unchanged"


def _tooltip_text(page: Any) -> str:
    """Hover the bars of the first chart until vega-tooltip shows its element."""
    chart = page.locator(".depthkit-chart").first
    chart.scroll_into_view_if_needed()
    box = chart.locator("canvas, svg").first.bounding_box()
    assert box is not None
    for fx in (0.2, 0.35, 0.5, 0.65, 0.8):
        for fy in (0.6, 0.75, 0.9):
            page.mouse.move(box["x"] + fx * box["width"], box["y"] + fy * box["height"])
            page.wait_for_timeout(150)
            if page.locator("#vg-tooltip-element.visible").count():
                return page.inner_text("#vg-tooltip-element")
    pytest.fail("no tooltip appeared when hovering the bars of the first chart")


def test_charts_render_in_jupyterlab_offline(tmp_path: Path) -> None:
    """Run the throwaway chapter in a real JupyterLab with the network blocked:
    the charts draw from the bundle that plots.enable() displays."""
    sync_api = _require_browser()
    _chart_notebook(tmp_path / "charts.ipynb")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "depthkit-test"
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
        f"--ServerApp.token={token}", f"--ServerApp.root_dir={tmp_path}", "--expose-app-in-browser",
    ]  # fmt: skip
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = (tmp_path / "lab.log").open("w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    blocked: list[str] = []
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start; see {tmp_path / 'lab.log'}")
                time.sleep(0.5)
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1400, "height": 1000})

            def route(r: Any) -> None:
                if r.request.url.startswith((base, base.replace("http", "ws"), "data:")):
                    r.continue_()
                else:
                    blocked.append(r.request.url)
                    r.abort()

            context.route("**/*", route)
            page = context.new_page()
            page.goto(f"{base}/lab/tree/charts.ipynb?token={token}")
            page.wait_for_function("() => window.jupyterapp && document.querySelector('.jp-Notebook')", timeout=90_000)
            page.wait_for_function(
                "() => document.querySelector('.jp-Notebook-ExecutionIndicator, .jp-Toolbar-kernelStatus') !== null",
                timeout=30_000,
            )
            page.wait_for_timeout(3000)  # let the kernel session settle before running
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_function(
                "() => { const c = [...document.querySelectorAll('.depthkit-chart')];"
                " return c.length === 4 && c.every(el => el.querySelector('svg, canvas')); }",
                timeout=120_000,
            )
            browser.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
    assert blocked == [], f"JupyterLab page tried to reach the network: {blocked}"
