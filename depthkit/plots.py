"""Charts for the book, and the switch that makes Altair render with no network.

Call :func:`enable` once at the top of every chapter notebook. Altair's stock HTML
output fetches vega, vega-lite and vega-embed from a CDN, and JupyterLab's built-in
Vega renderer stops at Vega-Lite 5 while Altair 6 writes Vega-Lite 6 specs. So
depthkit renders each chart as a small HTML snippet that waits for a global
``vegaEmbed``, and provides that global from a local JavaScript bundle:

* in a live kernel (JupyterLab), :func:`enable` displays the bundle once, as an
  output of the cell that calls it;
* in the built book the runner (:mod:`depthkit.book`) removes that output again
  and ships the same bundle once, as a static file of the book.

The bundle is built by the PyPI package ``vl-convert-python`` (pinned in
requirements.txt), which carries vega, vega-lite and vega-embed, and is cached on
disk because building it takes a few seconds.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import altair as alt

from depthkit.cache import cache_dir

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
}


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
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(code, encoding="utf-8")
        os.replace(tmp, path)
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
    the bundle); the default shows it whenever a kernel is running.
    """
    alt.renderers.register(RENDERER, _render)
    alt.renderers.enable(RENDERER)
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
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


# ---------------------------------------------------------------------------
# Chapter 00: logit lens and tuned lens


def lens_fidelity_chart(metrics: Any, title: str = "") -> alt.HConcatChart:
    """Per-layer KL(final ‖ lens) and top-1 agreement with the final prediction, one
    line per lens. ``metrics``: DataFrame[layer, lens, kl, top1_agreement]. Click a
    legend entry to highlight one lens."""
    pick = alt.selection_point(fields=["lens"], bind="legend")
    base = alt.Chart(metrics).encode(
        x=alt.X("layer:Q", title="layer ℓ"),
        color=alt.Color("lens:N", title="lens"),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.2)),
        tooltip=[
            alt.Tooltip("lens:N"),
            alt.Tooltip("layer:Q"),
            alt.Tooltip("kl:Q", title="KL (nats)", format=".3f"),
            alt.Tooltip("top1_agreement:Q", title="top-1 agreement", format=".1%"),
        ],
    )
    # The legend selection lives on one panel; the other reads it (adding it to both
    # makes Altair warn about a duplicated parameter).
    kl = (
        base.mark_line(point=True)
        .encode(y=alt.Y("kl:Q", title="KL(final ‖ lens), nats"))
        .add_params(pick)
        .properties(width=320, height=240, title="Distance to the final distribution")
    )
    agree = base.mark_line(point=True).encode(
        y=alt.Y("top1_agreement:Q", title="top-1 = final top-1", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1]))
    ).properties(width=320, height=240, title="Agreement with the final prediction")
    return alt.hconcat(kl, agree).properties(title=title)


def lens_topk_chart(topk: Any, title: str = "") -> alt.Chart:
    """Layer-by-layer top-1 tokens of one prompt side by side for several lenses.
    ``topk``: DataFrame[lens, layer, k, token, prob] (k = 1 is the top-1). Colour is
    the top-1 probability; the tooltip lists the whole top-k."""
    import pandas as pd

    df = topk.copy()
    df["shown"] = df["token"].map(repr)
    listing = (
        df.sort_values("k")
        .groupby(["lens", "layer"])
        .apply(lambda g: "  ".join(f"{t} {p:.0%}" for t, p in zip(g["shown"], g["prob"])), include_groups=False)
        .rename("top_k")
        .reset_index()
    )
    top1 = pd.merge(df[df["k"] == 1], listing, on=["lens", "layer"])
    base = alt.Chart(top1).encode(
        x=alt.X("lens:N", title=None, axis=alt.Axis(orient="top", labelAngle=0)),
        y=alt.Y("layer:O", title="layer ℓ", sort="descending"),
        tooltip=[
            alt.Tooltip("lens:N"),
            alt.Tooltip("layer:O"),
            alt.Tooltip("shown:N", title="top-1"),
            alt.Tooltip("prob:Q", title="p(top-1)", format=".1%"),
            alt.Tooltip("top_k:N", title="top-k"),
        ],
    )
    cells = base.mark_rect().encode(
        color=alt.Color("prob:Q", title="p(top-1)", scale=alt.Scale(scheme="blues", domain=[0, 1]))
    )
    text = base.mark_text(fontSize=10).encode(
        text=alt.Text("shown:N"),
        color=alt.condition(alt.datum.prob > 0.5, alt.value("white"), alt.value("black")),
    )
    n_layers = top1["layer"].nunique()
    return (cells + text).properties(width=110 * top1["lens"].nunique(), height=14 * n_layers, title=title)


def top10_share_chart(shares: Any, title: str = "") -> alt.Chart:
    """Share of prompts whose top-1 at layer ℓ is one of the corpus's Top-10 tokens,
    one line per lens (variant). ``shares``: DataFrame[layer, lens, share] (plus
    optional n). Click a legend entry to highlight one lens."""
    pick = alt.selection_point(fields=["lens"], bind="legend")
    return (
        alt.Chart(shares)
        .mark_line(point=True)
        .encode(
            x=alt.X("layer:Q", title="layer ℓ"),
            y=alt.Y("share:Q", title="top-1 in Top-10 tokens", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("lens:N", title="lens"),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
            tooltip=[alt.Tooltip("lens:N"), alt.Tooltip("layer:Q"), alt.Tooltip("share:Q", format=".1%")],
        )
        .add_params(pick)
        .properties(width=460, height=260, title=title)
    )


# ---------------------------------------------------------------- guess, then refine (chapters 01 and 04)


def _order(values: Any) -> list[Any]:
    """Category order of a column: its categorical order if it has one, else first
    appearance."""
    cats = getattr(getattr(values, "cat", None), "categories", None)
    return [str(c) for c in cats] if cats is not None else [str(v) for v in dict.fromkeys(values)]


def _plain(df: Any) -> Any:
    """A copy with categorical columns as strings (Vega-Lite data are plain JSON)."""
    out = df.copy()
    for c in out.columns:
        if str(out[c].dtype) == "category":
            out[c] = out[c].astype(str)
    return out


def bucket_share_chart(shares: Any, *, title: str = "Top-1 prediction by frequency bucket, per layer") -> alt.Chart:
    """Stacked bars: per layer, the share of predictions whose top-1 is in each
    frequency bucket (``metrics.bucket_shares``). Click the legend to highlight a
    bucket; hover for counts and intervals."""
    order = _order(shares["bucket"])
    data = _plain(shares)
    data["order"] = data["bucket"].map({b: i for i, b in enumerate(order)})
    pick = alt.selection_point(fields=["bucket"], bind="legend")
    tooltip = [alt.Tooltip("layer:O"), alt.Tooltip("bucket:N"), alt.Tooltip("share:Q", format=".1%"), "n:Q", "n_total:Q"]
    if "lo" in data.columns:
        tooltip += [alt.Tooltip("lo:Q", format=".1%", title="95% CI low"), alt.Tooltip("hi:Q", format=".1%", title="95% CI high")]
    return (
        alt.Chart(data, title=title)
        .mark_bar()
        .encode(
            x=alt.X("layer:O", title="layer (0 = embeddings; last = model output)"),
            y=alt.Y("share:Q", title="share of prompts", axis=alt.Axis(format="%"), stack="zero"),
            color=alt.Color("bucket:N", sort=order, title="frequency bucket", scale=alt.Scale(scheme="viridis")),
            order=alt.Order("order:Q"),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.25)),
            tooltip=tooltip,
        )
        .add_params(pick)
        .properties(width=620, height=260)
    )


def _lines_with_band(
    data: Any, y: str, color: str, order: list[str], y_title: str, title: str, x_title: str = "layer"
) -> alt.LayerChart:
    pick = alt.selection_point(fields=[color], bind="legend")
    base = alt.Chart(data, title=title).encode(
        x=alt.X("layer:Q", title=x_title),
        color=alt.Color(f"{color}:N", sort=order, title=color.replace("_", " ")),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
    )
    tooltip = [alt.Tooltip("layer:Q"), alt.Tooltip(f"{color}:N"), alt.Tooltip(f"{y}:Q", format=".1%")]
    tooltip += [c for c in ("n", "n_flipped", "n_agree") if c in data.columns]
    layers = []
    if "lo" in data.columns:
        tooltip += [alt.Tooltip("lo:Q", format=".1%", title="95% CI low"), alt.Tooltip("hi:Q", format=".1%", title="95% CI high")]
        band_opacity = alt.condition(pick, alt.value(0.15), alt.value(0.03))
        layers.append(base.mark_area().encode(y="lo:Q", y2="hi:Q", opacity=band_opacity))
    layers.append(base.mark_line().encode(y=alt.Y(f"{y}:Q", title=y_title, axis=alt.Axis(format="%"))))
    size = alt.Size("n:Q", title="prompts", scale=alt.Scale(range=[10, 120])) if "n" in data.columns else alt.value(30)
    layers.append(base.mark_point(filled=True).encode(y=f"{y}:Q", size=size, tooltip=tooltip))
    return alt.layer(*layers).add_params(pick).properties(width=620, height=260)


def flip_rate_chart(flips: Any, *, title: str = "Decision flips: layer top-1 differs from the final top-1") -> alt.LayerChart:
    """Flip rate per layer, one line per frequency bucket of the layer's top-1
    (``metrics.flip_rates``), with bootstrap bands when present; point size = number
    of prompts in that bucket at that layer."""
    return _lines_with_band(_plain(flips), "flip_rate", "bucket", _order(flips["bucket"]), "flip rate", title)


def agreement_chart(agreement: Any, *, title: str = "Does the layer's top-1 equal a reference guess?") -> alt.LayerChart:
    """Per layer, the share of prompts whose lens top-1 equals each reference guess
    (``metrics.agreement_by_layer``: unigram, bigram, final, ...)."""
    data = _plain(agreement)
    return _lines_with_band(data, "share", "guess", _order(agreement["guess"]), "share of prompts", title)


def onset_curve_chart(
    curves: Any, *, color: str = "tag", n_layers: int | None = None, title: str = "Earliest layer at which the answer reaches rank ≤ k"
) -> alt.LayerChart:
    """Mean earliest layer at rank ≤ k against k (log scale), one line per group
    (``metrics.onset_curve``), with bootstrap error bars when present. ``n_layers``
    fixes the y axis to the model's depth."""
    data = _plain(curves)
    order = _order(curves[color])
    pick = alt.selection_point(fields=[color], bind="legend")
    y_scale = alt.Scale(domain=[0, n_layers]) if n_layers else alt.Scale(zero=True)
    dash = (
        alt.StrokeDash(
            "word_class:N",
            title="word class",
            scale=alt.Scale(domain=["function", "content", "other"], range=[[1, 0], [6, 4], [2, 2]]),
        )
        if "word_class" in data.columns
        else alt.value([1, 0])
    )
    base = alt.Chart(data, title=title).encode(
        x=alt.X("k:Q", scale=alt.Scale(type="log"), title="k (answer rank ≤ k)"),
        color=alt.Color(f"{color}:N", sort=order),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
    )
    tooltip = [f"{color}:N", "k:Q", alt.Tooltip("mean_onset:Q", format=".2f"), "n_reached:Q", "n_items:Q"]
    layers = [base.mark_line().encode(y=alt.Y("mean_onset:Q", title="mean earliest layer", scale=y_scale), strokeDash=dash)]
    if "lo" in data.columns:
        tooltip += [alt.Tooltip("lo:Q", format=".2f"), alt.Tooltip("hi:Q", format=".2f")]
        layers.append(base.mark_errorbar().encode(y=alt.Y("lo:Q", title="mean earliest layer", scale=y_scale), y2="hi:Q"))
    layers.append(base.mark_point(filled=True).encode(y="mean_onset:Q", tooltip=tooltip))
    return alt.layer(*layers).add_params(pick).properties(width=620, height=300)


def onset_distribution_chart(
    values: Any,
    summary: Any | None = None,
    *,
    group: str = "tag",
    value: str = "onset",
    n_layers: int | None = None,
    title: str = "Per-example earliest layer at rank 1",
) -> alt.LayerChart:
    """Distribution of a per-example value per group: box plots with every example as
    a jittered dot (hover for the prompt's answer), and, from ``summary``
    (``metrics.bootstrap_ci_by``: ``[group, estimate, lo, hi, n]``), the mean with its
    bootstrap interval in black."""
    data = _plain(values)
    order = _order(values[group])
    y_scale = alt.Scale(domain=[0, n_layers]) if n_layers else alt.Scale(zero=True)
    x = alt.X(f"{group}:N", sort=order, title=group.replace("_", " "))
    box = alt.Chart(data).mark_boxplot(extent="min-max", opacity=0.5, size=28).encode(
        x=x, y=alt.Y(f"{value}:Q", title="layer", scale=y_scale), color=alt.Color(f"{group}:N", sort=order, legend=None)
    )
    tip = [c for c in (group, value, "answer", "prompt_end") if c in data.columns]
    dots = (
        alt.Chart(data)
        .transform_calculate(jitter="(random() - 0.5) * 0.6")
        .mark_circle(size=14, opacity=0.45)
        .encode(
            x=x,
            xOffset=alt.XOffset("jitter:Q", scale=alt.Scale(domain=[-1, 1])),
            y=alt.Y(f"{value}:Q", scale=y_scale),
            color=alt.Color(f"{group}:N", sort=order, legend=None),
            tooltip=tip,
        )
    )
    layers = [box, dots]
    if summary is not None:
        s = _plain(summary)
        stip = [f"{group}:N", alt.Tooltip("estimate:Q", format=".2f", title="mean"), alt.Tooltip("lo:Q", format=".2f"), alt.Tooltip("hi:Q", format=".2f"), "n:Q"]
        layers.append(
            alt.Chart(s)
            .mark_errorbar(color="black", thickness=2)
            .encode(x=x, y=alt.Y("lo:Q", title="layer", scale=y_scale), y2="hi:Q", tooltip=stip)
        )
        layers.append(alt.Chart(s).mark_point(color="black", shape="diamond", filled=True, size=70).encode(x=x, y="estimate:Q", tooltip=stip))
    return alt.layer(*layers, title=title).properties(width=520, height=300)


def matched_onset_chart(
    cells: Any, *, bin_col: str = "freq_bin", group: str = "word_class", n_layers: int | None = None,
    title: str = "Rank-1 onset within matched frequency bins",
) -> alt.LayerChart:
    """Mean per-example value (e.g. rank-1 onset) per frequency bin and group, with
    bootstrap intervals (``metrics.bootstrap_ci_by(df, value, [bin_col, group])``):
    bins where both groups have examples compare like with like."""
    data = _plain(cells)
    order = _order(cells[bin_col])
    groups = _order(cells[group])
    y_scale = alt.Scale(domain=[0, n_layers]) if n_layers else alt.Scale(zero=True)
    base = alt.Chart(data, title=title).encode(
        x=alt.X(f"{bin_col}:N", sort=order, title="frequency rank of the answer's first token"),
        xOffset=alt.XOffset(f"{group}:N", sort=groups),
        color=alt.Color(f"{group}:N", sort=groups, title=group.replace("_", " ")),
    )
    tip = [f"{bin_col}:N", f"{group}:N", alt.Tooltip("estimate:Q", format=".2f", title="mean"), alt.Tooltip("lo:Q", format=".2f"), alt.Tooltip("hi:Q", format=".2f"), "n:Q"]
    return alt.layer(
        base.mark_errorbar().encode(y=alt.Y("lo:Q", title="mean earliest layer at rank 1", scale=y_scale), y2="hi:Q"),
        base.mark_point(filled=True).encode(y="estimate:Q", size=alt.Size("n:Q", scale=alt.Scale(range=[20, 200]), title="examples"), tooltip=tip),
    ).properties(width=560, height=280)


# ---------------------------------------------------------------- multiple choice and fact recall (chapters 02 and 03)


def option_layers_chart(shares: Any, estimates: Any | None = None, *, title: str = "Option collection and option reasoning") -> alt.VConcatChart:
    """Per task and layer: the share of prompts whose options are all in the top-|O|
    (collection), the mean probability mass on the options, and the shares whose
    most probable option equals the model's answer / the gold one (reasoning).
    ``shares``: ``mcq.collection_reasoning`` (a ``variant`` column, if present,
    splits lines by dash). ``estimates``: ``mcq.layer_estimates``, drawn as rules.
    Click a legend entry to highlight one task."""
    import pandas as pd

    df = _plain(shares)
    if "variant" not in df.columns:
        df["variant"] = "prompts"
    long = df.melt(
        id_vars=["task", "variant", "layer"],
        value_vars=["collected_share", "mass", "final_share", "gold_share"],
        var_name="measure",
        value_name="value",
    )
    names = {
        "collected_share": "options all in top-|O|",
        "mass": "probability mass on options",
        "final_share": "top option = model's answer",
        "gold_share": "top option = gold answer",
    }
    long["measure"] = long["measure"].map(names)
    pick = alt.selection_point(fields=["task"], bind="legend")
    panels = []
    for measure in names.values():
        sub = long[long["measure"] == measure]
        line = (
            alt.Chart(sub)
            .mark_line(point=True)
            .encode(
                x=alt.X("layer:Q", title="layer ℓ"),
                y=alt.Y("value:Q", title=measure, axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
                color=alt.Color("task:N", title="task"),
                strokeDash=alt.StrokeDash("variant:N", title="prompts"),
                opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
                tooltip=["task:N", "variant:N", "layer:Q", alt.Tooltip("value:Q", format=".1%")],
            )
            .properties(width=300, height=200, title=measure)
        )
        if not panels:
            # Defined in the first panel only; the others refer to it (one legend filter for all).
            line = line.add_params(pick)
        if estimates is not None and measure in (names["collected_share"], names["final_share"]):
            col = "collection_layer" if measure == names["collected_share"] else "decision_layer"
            est = _plain(estimates)
            if "variant" in est.columns:
                est = est[est["variant"] == df["variant"].iloc[0]]
            rules = (
                alt.Chart(pd.DataFrame({"task": est["task"], "layer": est[col]}).dropna())
                .mark_rule(strokeDash=[2, 2])
                .encode(x="layer:Q", color="task:N", tooltip=["task:N", alt.Tooltip("layer:Q", title=col.replace("_", " "))])
            )
            line = line + rules
        panels.append(line)
    return alt.vconcat(alt.hconcat(*panels[:2]), alt.hconcat(*panels[2:])).properties(title=title)


def patching_chart(shares: Any, *, marks: Any | None = None, title: str = "Activation patching, layer by layer") -> alt.Chart:
    """Stacked areas per direction: the share of patched runs whose output is a
    target-task option, a source-task option or something else, against the layer
    patched. ``shares``: ``patching.class_shares`` with a ``direction`` column.
    ``marks``: optional DataFrame[direction, layer, what] of vertical rules (e.g. the
    transition layer and the lens's collection layer)."""
    df = _plain(shares)
    order = ["target-option", "source-option", "other"]
    area = (
        alt.Chart(df)
        .mark_area()
        .encode(
            x=alt.X("layer:Q", title="layer ℓ patched"),
            y=alt.Y("share:Q", stack="normalize", title="share of runs", axis=alt.Axis(format="%")),
            color=alt.Color("class:N", sort=order, scale=alt.Scale(domain=order, range=["#4c78a8", "#f58518", "#bab0ac"]), title="output"),
            order=alt.Order("class_order:Q"),
            tooltip=["direction:N", "layer:Q", "class:N", alt.Tooltip("share:Q", format=".1%"), "n:Q"],
        )
        .transform_calculate(class_order="indexof(['target-option','source-option','other'], datum['class'])")
        .properties(width=260, height=200)
    )
    if marks is not None:
        rules = (
            alt.Chart(_plain(marks).dropna(subset=["layer"]))
            .mark_rule(strokeWidth=2)
            .encode(x="layer:Q", strokeDash=alt.StrokeDash("what:N", title="marker"), tooltip=["direction:N", "what:N", "layer:Q"])
        )
        return alt.layer(area, rules, data=df).facet(column=alt.Column("direction:N", title=None)).properties(title=title)
    return area.facet(column=alt.Column("direction:N", title=None)).properties(title=title)


def early_exit_chart(table: Any, *, title: str = "Early exit: what a truncated model gets right") -> alt.Chart:
    """Agreement with the full model and task accuracy of an exit at each layer,
    against the fraction of blocks run. ``table``: ``early_exit.early_exit_table``
    with a ``task`` column. Click a legend entry to highlight one task."""
    df = _plain(table)
    value_vars = [c for c in ("agreement", "choice_agreement", "choice_accuracy", "accuracy") if c in df.columns]
    long = df.melt(id_vars=["task", "layer", "compute_fraction"], value_vars=value_vars, var_name="measure", value_name="value")
    pick = alt.selection_point(fields=["task"], bind="legend")
    return (
        alt.Chart(long)
        .mark_line(point=True)
        .encode(
            x=alt.X("compute_fraction:Q", title="fraction of blocks run", axis=alt.Axis(format="%")),
            y=alt.Y("value:Q", title=None, axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("task:N"),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
            tooltip=["task:N", "measure:N", "layer:Q", alt.Tooltip("compute_fraction:Q", format=".0%"), alt.Tooltip("value:Q", format=".1%")],
        )
        .properties(width=200, height=180)
        .facet(column=alt.Column("measure:N", title=None))
        .add_params(pick)
        .properties(title=title)
    )


def fact_onset_chart(curves: Any, *, title: str = "Earliest layer at which answer token j reaches rank ≤ k") -> alt.Chart:
    """Mean onset layer against k (log scale), one line per answer token, one panel
    per group (``correct`` or ``length_group``). ``curves``: ``metrics.onset_curve``
    output with columns [token, <group>, k, mean_onset, n_reached, ...] and a
    ``group`` column naming the panel."""
    df = _plain(curves)
    df["token"] = "token " + df["token"].astype(str)
    pick = alt.selection_point(fields=["token"], bind="legend")
    tips = ["token:N", "group:N", "k:Q", alt.Tooltip("mean_onset:Q", format=".1f"), "n_reached:Q", "n_items:Q"]
    return (
        alt.Chart(df)
        .mark_line(point=True)
        .encode(
            x=alt.X("k:Q", scale=alt.Scale(type="log"), title="rank threshold k"),
            y=alt.Y("mean_onset:Q", title="mean onset layer"),
            color=alt.Color("token:N", title="answer token"),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
            tooltip=tips,
        )
        .properties(width=240, height=200)
        .facet(column=alt.Column("group:N", title=None))
        .add_params(pick)
        .properties(title=title)
    )


# ---------------------------------------------------------------- residual phase change, depth scores (05, 06, 07)


def _panel_scale(d: Any) -> alt.Scale:
    """Log scale for a positive panel spanning more than a factor of 30 (block 0's
    relative update dwarfs the others), linear otherwise."""
    lo, hi = float(d["mean"].min()), float(d["mean"].max())
    return alt.Scale(type="log") if lo > 0 and hi / lo > 30 else alt.Scale(zero=False)


def residual_curves_chart(curves: Any, *, marks: Any | None = None, title: str = "The residual stream, block by block") -> alt.VConcatChart:
    """One panel per group of statistics (``curves``: DataFrame[x, stat, panel,
    mean, lo, hi], x = layer or block), lines with bootstrap bands, and optional
    vertical rules ``marks``: DataFrame[name, layer] (transition estimates). Click a
    legend entry to highlight one statistic."""
    data = _plain(curves)
    pick = alt.selection_point(fields=["stat"], bind="legend")
    panels = []
    for i, panel in enumerate(_order(curves["panel"])):
        d = data[data["panel"] == panel]
        base = alt.Chart(d).encode(
            x=alt.X("x:Q", title="layer ℓ (block ℓ reads h_ℓ)"),
            color=alt.Color("stat:N", title="statistic"),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
        )
        tips = ["stat:N", "x:Q", alt.Tooltip("mean:Q", format=".4f"), alt.Tooltip("lo:Q", format=".4f"), alt.Tooltip("hi:Q", format=".4f")]
        layers = [
            base.mark_area(opacity=0.15).encode(y="lo:Q", y2="hi:Q"),
            base.mark_line(point=True).encode(y=alt.Y("mean:Q", title=panel, scale=_panel_scale(d)), tooltip=tips),
        ]
        if marks is not None and len(marks):
            layers.append(
                alt.Chart(_plain(marks)).mark_rule(strokeDash=[4, 3], color="gray").encode(
                    x="layer:Q", tooltip=["name:N", alt.Tooltip("layer:Q", format=".1f")]
                )
            )
        chart = alt.layer(*layers).properties(width=620, height=170)
        panels.append(chart.add_params(pick) if i == 0 else chart)
    return alt.vconcat(*panels).resolve_scale(color="shared").properties(title=title)


def transition_chart(estimates: Any, *, n_blocks: int, title: str = "Transition layers: estimates and bootstrap intervals") -> alt.LayerChart:
    """Point and interval per transition estimate (``estimates``: DataFrame[name,
    estimate, lo, hi]) on the axis 0..L."""
    data = _plain(estimates)
    base = alt.Chart(data).encode(y=alt.Y("name:N", title=None, sort=None))
    tips = ["name:N", alt.Tooltip("estimate:Q", format=".1f"), alt.Tooltip("lo:Q", format=".1f"), alt.Tooltip("hi:Q", format=".1f")]
    return alt.layer(
        base.mark_rule(size=3, opacity=0.5).encode(x=alt.X("lo:Q", title="layer", scale=alt.Scale(domain=[0, n_blocks])), x2="hi:Q"),
        base.mark_point(filled=True, size=90).encode(x="estimate:Q", tooltip=tips),
    ).properties(width=560, height=max(60, 28 * len(data)), title=title)


def skip_effect_chart(later: Any, output: Any, *, title: str = "Removing one block's update") -> alt.HConcatChart:
    """Left: relative change of the residual at every later layer when one block's
    update is removed (``later``: DataFrame[skipped, layer, rel_change]). Right: KL of
    the output distribution and top-1 agreement per removed block (``output``)."""
    heat = (
        alt.Chart(_plain(later))
        .mark_rect()
        .encode(
            x=alt.X("layer:O", title="layer ℓ of the residual"),
            y=alt.Y("skipped:O", title="block removed"),
            color=alt.Color("rel_change:Q", title="‖h'−h‖/‖h‖", scale=alt.Scale(scheme="viridis")),
            tooltip=["skipped:O", "layer:O", alt.Tooltip("rel_change:Q", format=".3f")],
        )
        .properties(width=360, height=300, title="Change of later residuals")
    )
    out = _plain(output)
    hover = alt.selection_point(fields=["skipped"], on="pointerover", empty=False)
    kl = (
        alt.Chart(out)
        .mark_bar()
        .encode(
            y=alt.Y("skipped:O", title="block removed"),
            x=alt.X("kl:Q", title="KL(full ‖ skipped), nats"),
            color=alt.condition(hover, alt.value("firebrick"), alt.value("steelblue")),
            tooltip=["skipped:O", alt.Tooltip("kl:Q", format=".3f"), alt.Tooltip("top1_agreement:Q", format=".1%", title="top-1 unchanged")],
        )
        .add_params(hover)
        .properties(width=220, height=300, title="Change of the output")
    )
    return alt.hconcat(heat, kl).properties(title=title)


def depth_by_group_chart(summary: Any, *, group: str, title: str = "Depth needed, by group") -> alt.LayerChart:
    """Mean normalised depth with bootstrap interval per group and measure
    (``summary``: DataFrame[group, measure, estimate, lo, hi, n])."""
    data = _plain(summary)
    pick = alt.selection_point(fields=["measure"], bind="legend")
    base = alt.Chart(data).encode(
        y=alt.Y(f"{group}:N", title=group.replace("_", " "), sort=None),
        yOffset=alt.YOffset("measure:N"),
        color=alt.Color("measure:N", title="measure"),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
    )
    tips = [f"{group}:N", "measure:N", alt.Tooltip("estimate:Q", format=".3f"), alt.Tooltip("lo:Q", format=".3f"), alt.Tooltip("hi:Q", format=".3f"), "n:Q"]
    return (
        alt.layer(
            base.mark_rule(size=2).encode(x=alt.X("lo:Q", title="depth / L", scale=alt.Scale(domain=[0, 1])), x2="hi:Q"),
            base.mark_point(filled=True, size=60).encode(x="estimate:Q", tooltip=tips),
        )
        .add_params(pick)
        .properties(width=520, height=max(120, 40 * data[group].nunique()), title=title)
    )


def depth_histogram_chart(scores: Any, *, title: str = "Where predictions settle") -> alt.Chart:
    """Histograms of normalised onset and saturation depth over predicted tokens
    (``scores``: DataFrame[measure, value] in [0, 1])."""
    pick = alt.selection_point(fields=["measure"], bind="legend")
    return (
        alt.Chart(_plain(scores))
        .mark_bar(opacity=0.6, binSpacing=0)
        .encode(
            x=alt.X("value:Q", bin=alt.Bin(extent=[0, 1], step=0.05), title="depth / L"),
            y=alt.Y("count():Q", stack=None, title="predicted tokens"),
            color=alt.Color("measure:N"),
            opacity=alt.condition(pick, alt.value(0.7), alt.value(0.1)),
            tooltip=["measure:N", "count():Q"],
        )
        .add_params(pick)
        .properties(width=560, height=220, title=title)
    )


def exit_frontier_chart(sweep: Any, *, target: float = 0.99, title: str = "Early exit: agreement with the full model against depth used") -> alt.LayerChart:
    """Agreement against mean fraction of blocks run, one line per policy
    (``depth_score.exit_sweep``), a rule at the ``target`` agreement. Hover for τ or
    the exit layer; click the legend to highlight a policy."""
    data = _plain(sweep)
    pick = alt.selection_point(fields=["policy"], bind="legend")
    tips = ["policy:N", alt.Tooltip("param:Q", title="τ or layer", format=".4g"), alt.Tooltip("agreement:Q", format=".2%"), alt.Tooltip("frac_layers:Q", format=".1%", title="blocks run")]
    base = alt.Chart(data).encode(
        x=alt.X("frac_layers:Q", title="mean fraction of blocks run", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("agreement:Q", title="agreement with the full model", axis=alt.Axis(format="%")),
        color=alt.Color("policy:N"),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
        tooltip=tips,
    )
    lines = base.transform_filter("datum.policy == 'confidence' || datum.policy == 'fixed'").mark_line(point=True)
    oracles = base.transform_filter("datum.policy != 'confidence' && datum.policy != 'fixed'").mark_point(filled=True, size=140, shape="diamond")
    rule = alt.Chart(data.head(1)).mark_rule(strokeDash=[4, 3], color="gray").encode(y=alt.datum(target))
    return alt.layer(lines, oracles, rule).add_params(pick).properties(width=560, height=320, title=title)


def across_models_chart(table: Any, *, title: str = "Headline quantities on normalised depth ℓ/L") -> alt.LayerChart:
    """One row per quantity, models as colours side by side within the row, the
    interval as a bar, and the paper's reference values as hollow grey squares
    (``table``: DataFrame[quantity, model, value, lo, hi, source]). Click a legend
    entry to highlight one model."""
    data = _plain(table)
    ours = data[data["source"] != "paper (reference)"]
    paper = data[data["source"] == "paper (reference)"]
    order = list(dict.fromkeys([*ours["quantity"], *paper["quantity"]]))
    y = alt.Y("quantity:N", title=None, sort=order, axis=alt.Axis(labelLimit=240))
    pick = alt.selection_point(fields=["model"], bind="legend")
    tips = ["quantity:N", "model:N", "source:N", alt.Tooltip("value:Q", format=".3f"), alt.Tooltip("lo:Q", format=".3f"), alt.Tooltip("hi:Q", format=".3f")]
    scale = alt.Scale(domain=[0, 1])
    models = alt.Chart(ours).encode(
        y=y,
        yOffset=alt.YOffset("model:N"),
        color=alt.Color("model:N", legend=alt.Legend(orient="bottom", columns=2, title=None)),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
        tooltip=tips,
    )
    reference = alt.Chart(paper).encode(y=y, tooltip=tips)
    return (
        alt.layer(
            models.mark_rule(size=3).encode(x=alt.X("lo:Q", title="ℓ/L", scale=scale), x2="hi:Q"),
            models.mark_point(size=60, filled=True).encode(x=alt.X("value:Q", scale=scale)).add_params(pick),
            reference.mark_rule(size=2, color="#999999", strokeDash=[3, 2]).encode(x=alt.X("lo:Q", scale=scale), x2="hi:Q"),
            reference.mark_point(shape="square", size=90, color="#666666", filled=False).encode(x=alt.X("value:Q", scale=scale)),
        )
        .properties(width=300, height=alt.Step(**{"step": 9, "for": "offset"}), title=title)
    )
