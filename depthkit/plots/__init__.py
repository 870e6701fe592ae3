"""Charts for the book, and the switch that makes Altair render with no network.

Call :func:`enable` once at the top of every chapter notebook. Altair's stock HTML
output fetches vega, vega-lite and vega-embed from a CDN, and JupyterLab's built-in
Vega renderer stops at Vega-Lite 5 while Altair 6 writes Vega-Lite 6 specs. So
depthkit renders each chart as a small HTML snippet that waits for a global
``vegaEmbed``, and provides that global from a local JavaScript bundle:

* in a live kernel (JupyterLab), :func:`enable` displays the bundle once, as an
  output of the cell that calls it;
* in the built book the runner (:mod:`depthkit.book.runner`) removes that output again
  and ships the same bundle once, as a static file of the book.

The bundle is built by the PyPI package ``vl-convert-python`` (pinned in
requirements.txt), which carries vega, vega-lite and vega-embed, and is cached on
disk because building it takes a few seconds.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import altair as alt

from depthkit.core.files import atomic_write, cache_dir
from depthkit.plots import tables
from depthkit.plots.shell import running_shell

RENDERER = "depthkit"
# Output metadata key that marks the bundle output, so the book runner can drop it.
BUNDLE_MARK = "depthkit_vega_bundle"
# Charts that render before the bundle has loaded wait in this global queue; the
# bundle's closing snippet drains it and turns it into an immediate-call object.
_QUEUE = "__depthkitCharts"
_BUNDLE_SNIPPET = f"""
window.vega = vega; window.vegaLite = vegaLite; window.vegaEmbed = vegaEmbed;
const pending = Array.isArray(window.{_QUEUE}) ? window.{_QUEUE} : [];
window.{_QUEUE} = {{ push: (draw) => draw() }};
pending.forEach((draw) => draw());
"""
_BUNDLE_FORMAT = 2  # bump when the wrapping of the cached bundle changes
_EMBED_OPTIONS: dict[str, Any] = {
    # The editor and source links open vega.github.io: keep the menu to exports.
    "actions": {"export": True, "source": False, "compiled": False, "editor": False},
    # SVG, so that a chart wider than the page column scales down to fit it (below)
    # and hovering still finds its marks (SVG events target the mark itself).
    "renderer": "svg",
}
# A chart never overflows the column it is shown in: wide SVGs shrink to fit, keeping
# their aspect ratio (Vega's SVG carries a viewBox).
_FIT_CSS = ".depthkit-chart{max-width:100%}.depthkit-chart svg.marks{max-width:100%;height:auto}"


def _vega_lite_version() -> str:
    """Altair's Vega-Lite schema as vl-convert names it, e.g. 'v6.4.1' -> '6.4'."""
    major, minor = alt.SCHEMA_VERSION.lstrip("v").split(".")[:2]
    return f"{major}.{minor}"


def bundle_path() -> Path:
    """Path of the cached JavaScript bundle (vega + vega-lite + vega-embed), built on
    first use from the installed ``vl-convert-python``."""
    try:
        import vl_convert
    except ImportError as err:
        raise ImportError(
            "depthkit.plots needs the package vl-convert-python, which carries the chart "
            "JavaScript (vega, vega-lite, vega-embed) for offline use. Install it with "
            "`pip install vl-convert-python==1.9.0.post1` (scripts/install.sh does this)."
        ) from err
    vl = _vega_lite_version()
    versions = f"vega{vl_convert.get_vega_version()}-vl{vl}-embed{vl_convert.get_vega_embed_version()}"
    path = cache_dir("js") / f"depthkit-vega-{_BUNDLE_FORMAT}-{versions}.js"
    if not path.is_file():
        # The bundle declares top-level constants (one is `_`, which Sphinx's
        # doctools.js also declares): a function scope keeps them off the page's
        # global scope; only the three libraries are exported, by the snippet.
        code = "(function () {\n" + vl_convert.javascript_bundle(_BUNDLE_SNIPPET, vl_version=vl) + "\n})();\n"
        atomic_write(path, code)
    return path


def _script_json(obj: Any) -> str:
    """JSON that is safe inside an HTML <script> element."""
    return json.dumps(obj).replace("</", "<\\/")


def chart_html(spec: dict[str, Any], embed_options: dict[str, Any] | None = None) -> str:
    """HTML snippet that draws a Vega-Lite ``spec`` with the global ``vegaEmbed``
    (waiting for the bundle if it has not loaded yet)."""
    div_id = f"depthkit-chart-{uuid.uuid4().hex}"
    options = {**_EMBED_OPTIONS, **(embed_options or {})}
    return (
        f"<style>{_FIT_CSS}</style>\n"
        f'<div id="{div_id}" class="depthkit-chart"></div>\n'
        "<script>\n(function () {\n"
        "  function draw() {\n"
        f'    var el = document.getElementById("{div_id}");\n'
        f"    vegaEmbed(el, {_script_json(spec)}, {_script_json(options)}).catch(function (err) {{\n"
        '      el.textContent = "Chart failed to render: " + err;\n'
        "      console.error(err);\n"
        "    });\n"
        "  }\n"
        f"  if (window.vegaEmbed) {{ draw(); }} else {{ (window.{_QUEUE} = window.{_QUEUE} || []).push(draw); }}\n"
        "})();\n</script>"
    )


def _render(spec: dict[str, Any], **metadata: Any) -> dict[str, str]:
    return {
        "text/html": chart_html(spec, metadata.get("embed_options")),
        "text/plain": "<Altair chart: run the cell in Jupyter, or see the book, to view it>",
    }


def enable(show_bundle: bool | None = None) -> None:
    """Make Altair charts render with no network, in JupyterLab and in the book.

    Registers and activates depthkit's Altair renderer and, inside an IPython
    kernel, displays the chart JavaScript once (an invisible output of the calling
    cell). ``show_bundle=False`` skips that output (for a page that already loads
    the bundle); the default shows it whenever a kernel is running. Tables shown
    afterwards write missing values as a dash (:mod:`depthkit.plots.tables`).
    """
    alt.renderers.register(RENDERER, _render)
    alt.renderers.enable(RENDERER)
    tables.enable()
    if show_bundle is None:
        show_bundle = _in_kernel()
    if not show_bundle:
        return
    from IPython.display import display

    code = bundle_path().read_text(encoding="utf-8").replace("</script", "<\\/script")
    display(
        {"text/html": f"<script>{code}</script>", "text/plain": "(chart JavaScript loaded for offline use)"},
        raw=True,
        metadata={BUNDLE_MARK: True},
    )


def _in_kernel() -> bool:
    return getattr(running_shell(), "kernel", None) is not None


# The charts, one module per group of chapters; imported here so that a notebook
# writes plots.<name>_chart.
from depthkit.plots.depth_charts import (  # noqa: E402
    across_models_chart,
    depth_by_group_chart,
    depth_histogram_chart,
    exit_frontier_chart,
    residual_curves_chart,
    skip_effect_chart,
    transition_chart,
)
from depthkit.plots.lens_charts import (  # noqa: E402
    agreement_chart,
    bucket_share_chart,
    flip_rate_chart,
    lens_examples_chart,
    lens_explorer_chart,
    lens_fidelity_chart,
    lens_topk_chart,
    matched_onset_chart,
    onset_curve_chart,
    onset_distribution_chart,
    top10_share_chart,
)
from depthkit.plots.task_charts import (  # noqa: E402
    early_exit_chart,
    fact_onset_chart,
    option_layers_chart,
    patching_chart,
)

__all__ = [
    "BUNDLE_MARK",
    "RENDERER",
    "across_models_chart",
    "agreement_chart",
    "bucket_share_chart",
    "bundle_path",
    "chart_html",
    "depth_by_group_chart",
    "depth_histogram_chart",
    "early_exit_chart",
    "enable",
    "exit_frontier_chart",
    "fact_onset_chart",
    "flip_rate_chart",
    "lens_fidelity_chart",
    "lens_examples_chart",
    "lens_explorer_chart",
    "lens_topk_chart",
    "matched_onset_chart",
    "onset_curve_chart",
    "onset_distribution_chart",
    "option_layers_chart",
    "patching_chart",
    "residual_curves_chart",
    "skip_effect_chart",
    "top10_share_chart",
    "transition_chart",
]
