"""The built book works in a browser with no network.

Builds a small book (the real prose pages plus one throwaway chapter with two
interactive charts, math, a widget and a progress bar) with the runner, then
opens every page in Debian's Chromium through Playwright while every request
that is not file:// is aborted, and checks that no such request was made, that
every chart drew an SVG or canvas, that math was typeset, that tooltips work and
that nothing was logged as an error.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pytest

from depthkit import book

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


@dataclass
class _Chapter:
    id: str
    slug: str
    title: str
    notebook: Path
    smoke: dict[str, Any] = field(default_factory=dict)


def _chapter_notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("model = 'none'\nresults_root = None\nn = 6")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [
        nbformat.v4.new_markdown_cell(
            "# Browser test chapter\n\nInline math $\\mathrm{KL}(p_L \\,\\|\\, q_\\ell)$ and a display:\n\n"
            "$$q_\\ell = \\mathrm{softmax}\\big(W_U\\, \\mathrm{Norm}(h_\\ell)\\big)$$"
        ),
        params,
        nbformat.v4.new_code_cell("import altair as alt\nimport pandas as pd\nfrom depthkit import plots\nplots.enable()"),
        nbformat.v4.new_code_cell(
            "df = pd.DataFrame({'layer': range(n), 'share': [(i + 1) / n for i in range(n)]})\n"
            "pick = alt.selection_point(fields=['layer'])\n"
            "(alt.Chart(df).mark_bar(size=40)\n"
            " .encode(x='layer:O', y='share:Q', tooltip=['layer', 'share'],\n"
            "         opacity=alt.condition(pick, alt.value(1.0), alt.value(0.3)))\n"
            " .add_params(pick).properties(width=400, height=300))"
        ),
        nbformat.v4.new_code_cell(
            "brush = alt.selection_interval(encodings=['x'])\n"
            "line = alt.Chart(df).mark_line(point=True).encode(x='layer:Q', y='share:Q').add_params(brush)\n"
            "line | alt.Chart(df).mark_bar().encode(x='layer:O', y='share:Q').transform_filter(brush)"
        ),
        nbformat.v4.new_code_cell("import ipywidgets as w\nw.VBox([w.Text('prompt'), w.IntSlider()])"),
        nbformat.v4.new_code_cell("from tqdm.auto import tqdm\nfor _ in tqdm(range(3)):\n    pass"),
    ]
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def built_book(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("book")
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(REPO / name, root / name)
    (root / "book").mkdir()
    for path in (REPO / "book").iterdir():
        if path.is_file():
            shutil.copy(path, root / "book" / path.name)
    (root / "notebooks").mkdir()
    chapter = _Chapter("90", "90_browser_test", "Browser test", root / "notebooks" / "90_browser_test.ipynb")
    _chapter_notebook(chapter.notebook)
    index = book.build_book("none", [chapter], root=root, results_root=root / "results", echo=lambda _: None)
    return index.parent


def _pages(html: Path) -> list[Path]:
    return sorted(p for p in html.rglob("*.html") if not {"_static", "_sources"} & set(p.relative_to(html).parts))


def test_every_page_works_offline(built_book: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; scripts/install.sh --test does it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

    pages = _pages(built_book)
    names = {p.relative_to(built_book).as_posix() for p in pages}
    assert {"index.html", "book/methods.html", "book/chapters/90_browser_test.html", "book/glossary.html"} <= names

    blocked: list[str] = []
    problems: list[str] = []
    charts_seen: dict[str, int] = {}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context()

        def route(r: Any) -> None:
            if r.request.url.startswith("file://"):
                r.continue_()
            else:
                blocked.append(r.request.url)
                r.abort()

        context.route("**/*", route)
        page = context.new_page()
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        # Aborted requests are either ours (recorded in `blocked`) or cancelled by
        # leaving a page; a missing local file fails with another reason.
        page.on(
            "requestfailed",
            lambda r: problems.append(f"request failed: {r.url} ({r.failure})") if r.failure != "net::ERR_ABORTED" else None,
        )
        for path in pages:
            name = path.relative_to(built_book).as_posix()
            page.goto(path.as_uri(), wait_until="networkidle")
            n_charts = page.locator(".depthkit-chart").count()
            charts_seen[name] = n_charts
            if n_charts:
                page.wait_for_function(
                    "() => [...document.querySelectorAll('.depthkit-chart')]"
                    ".every(el => el.querySelector('svg, canvas'))",
                    timeout=20_000,
                )
            if page.locator(".math").count():
                page.wait_for_function("() => document.querySelectorAll('mjx-container').length > 0", timeout=20_000)
                assert page.locator("mjx-container").count() >= page.locator(".math").count(), name
            if name == "book/chapters/90_browser_test.html":
                _check_tooltip(page)
                text = page.inner_text("main")
                assert book.WIDGET_NOTE in text
                assert "chart JavaScript loaded" not in text  # the bundle output was removed
                assert "0%|" not in text  # progress-bar widgets were removed
        browser.close()

    assert blocked == [], f"pages tried to reach the network: {blocked}"
    assert problems == []
    assert charts_seen["book/chapters/90_browser_test.html"] == 2


def _check_tooltip(page: Any) -> None:
    """Hovering a bar of the first chart shows vega-tooltip's element."""
    chart = page.locator(".depthkit-chart").first
    chart.scroll_into_view_if_needed()
    box = chart.locator("canvas, svg").first.bounding_box()
    assert box is not None
    for fx in (0.2, 0.35, 0.5, 0.65, 0.8):
        for fy in (0.6, 0.75, 0.9):
            page.mouse.move(box["x"] + fx * box["width"], box["y"] + fy * box["height"])
            page.wait_for_timeout(150)
            if page.locator("#vg-tooltip-element.visible").count():
                assert "share" in page.inner_text("#vg-tooltip-element")
                return
    pytest.fail("no tooltip appeared when hovering the bars of the first chart")
