"""Charts of the depth chapters: residual phase change (05), depth scores and early exit (06), across models (07)."""

from __future__ import annotations

from typing import Any

import altair as alt

from depthkit.plots._common import _legend, _order, _panel_scale, _plain


def residual_curves_chart(curves: Any, *, marks: Any | None = None, title: str = "The residual stream, block by block") -> alt.VConcatChart:
    """One panel per group of statistics (``curves``: DataFrame[x, stat, panel,
    mean, lo, hi], x = the residual layer ℓ; a block's statistics at the layer it
    writes, ℓ = b + 1), lines with bootstrap bands, and optional
    vertical rules ``marks``: DataFrame[name, layer] (transition estimates). Click a
    legend entry to highlight one statistic."""
    data = _plain(curves)
    pick = alt.selection_point(fields=["stat"], bind="legend")
    panels = []
    for i, panel in enumerate(_order(curves["panel"])):
        d = data[data["panel"] == panel]
        base = alt.Chart(d).encode(
            x=alt.X("x:Q", title="residual layer ℓ (block b drawn at the layer it writes, ℓ = b + 1)"),
            color=alt.Color("stat:N", title="statistic", legend=_legend()),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
        )
        tips = ["stat:N", alt.Tooltip("x:Q", title="layer ℓ"), alt.Tooltip("mean:Q", format=".4f"), alt.Tooltip("lo:Q", format=".4f"), alt.Tooltip("hi:Q", format=".4f")]
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
        chart = alt.layer(*layers).properties(width=600, height=170)
        panels.append(chart.add_params(pick) if i == 0 else chart)
    return alt.vconcat(*panels).resolve_scale(color="shared").properties(title=title)


def transition_chart(estimates: Any, *, n_blocks: int, title: str = "Transition layers: estimates and bootstrap intervals") -> alt.LayerChart:
    """Point and interval per transition estimate (``estimates``: DataFrame[name,
    estimate, lo, hi]) on the axis 0..L."""
    data = _plain(estimates)
    base = alt.Chart(data).encode(y=alt.Y("name:N", title=None, sort=None))
    tips = ["name:N", alt.Tooltip("estimate:Q", format=".1f"), alt.Tooltip("lo:Q", format=".1f"), alt.Tooltip("hi:Q", format=".1f")]
    return alt.layer(
        base.mark_rule(size=3, opacity=0.5).encode(x=alt.X("lo:Q", title="residual layer ℓ", scale=alt.Scale(domain=[0, n_blocks])), x2="hi:Q"),
        base.mark_point(filled=True, size=90).encode(x="estimate:Q", tooltip=tips),
    ).properties(width=380, height=max(60, 28 * len(data)), title=title)


def skip_effect_chart(later: Any, output: Any, *, title: str = "Removing one block's update") -> alt.HConcatChart:
    """Left: relative change of the residual at every later layer when one block's
    update is removed (``later``: DataFrame[skipped, layer, rel_change]). Right: KL of
    the output distribution and top-1 agreement per removed block (``output``)."""
    heat = (
        alt.Chart(_plain(later))
        .mark_rect()
        .encode(
            x=alt.X("layer:O", title="layer ℓ of the residual"),
            y=alt.Y("skipped:O", title="block b removed (writes layer b + 1)"),
            color=alt.Color(
                "rel_change:Q", title="‖h'−h‖/‖h‖", scale=alt.Scale(scheme="viridis"),
                legend=alt.Legend(orient="bottom", direction="horizontal", gradientLength=200),
            ),
            tooltip=["skipped:O", "layer:O", alt.Tooltip("rel_change:Q", format=".3f")],
        )
        .properties(width=320, height=300, title="Change of later residuals")
    )
    out = _plain(output)
    hover = alt.selection_point(fields=["skipped"], on="pointerover", empty=False)
    kl = (
        alt.Chart(out)
        .mark_bar()
        .encode(
            y=alt.Y("skipped:O", title="block b removed"),
            x=alt.X("kl:Q", title="KL(full ‖ skipped), nats"),
            color=alt.condition(hover, alt.value("firebrick"), alt.value("steelblue")),
            tooltip=["skipped:O", alt.Tooltip("kl:Q", format=".3f"), alt.Tooltip("top1_agreement:Q", format=".1%", title="top-1 unchanged")],
        )
        .add_params(hover)
        .properties(width=180, height=300, title="Change of the output")
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
        color=alt.Color("measure:N", title="measure", legend=_legend()),
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
            color=alt.Color("measure:N", legend=_legend()),
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
        color=alt.Color("policy:N", legend=_legend()),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
        tooltip=tips,
    )
    lines = base.transform_filter("datum.policy == 'confidence' || datum.policy == 'fixed'").mark_line(point=True)
    oracles = base.transform_filter("datum.policy != 'confidence' && datum.policy != 'fixed'").mark_point(filled=True, size=140, shape="diamond")
    rule = alt.Chart(data.head(1)).mark_rule(strokeDash=[4, 3], color="gray").encode(y=alt.datum(target))
    return alt.layer(lines, oracles, rule).add_params(pick).properties(width=560, height=320, title=title)


def across_models_chart(table: Any, *, title: str = "Headline quantities on normalised depth ℓ/L") -> alt.LayerChart:
    """One row per quantity (``row``), one line per model inside it in the model's
    colour (point: the value; bar: its interval), and the paper's reference value of
    the same quantity on the same row, grey, as a broad band (a range) or a hollow
    square (a value): one legend names the models and "paper (reference)". Click a
    legend entry to highlight it. ``table``: ``ch07_across_models.depth_rows``
    (row, quantity, model, value, lo, hi, source)."""
    data = _plain(table)
    paper_name = "paper (reference)"
    data["who"] = data["model"].where(data["source"] != paper_name, paper_name)
    ours = data[data["source"] != paper_name]
    paper = data[data["source"] == paper_name]
    models = list(dict.fromkeys(ours["model"]))
    order = list(dict.fromkeys([*ours["row"], *paper["row"]]))
    who = [*models, paper_name]
    palette = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"]
    colors = [palette[i % len(palette)] for i in range(len(models))] + ["#8c8c8c"]
    color = alt.Color("who:N", title=None, scale=alt.Scale(domain=who, range=colors), legend=_legend(columns=3, symbolOpacity=1))
    shape = alt.Shape("who:N", title=None, scale=alt.Scale(domain=who, range=["circle"] * len(models) + ["square"]), legend=_legend(columns=3))
    y = alt.Y("row:N", title=None, sort=order, axis=alt.Axis(labelLimit=300, labelFontSize=11), scale=alt.Scale(paddingOuter=0.2))
    x = alt.X("value:Q", title="ℓ/L (0 = embeddings, 1 = the last block)", scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(orient="top"))
    pick = alt.selection_point(fields=["who"], bind="legend")
    opacity = alt.condition(pick, alt.value(1.0), alt.value(0.15))
    tips = [alt.Tooltip("quantity:N"), alt.Tooltip("who:N", title="source"), alt.Tooltip("model:N"),
            alt.Tooltip("value:Q", format=".3f"), alt.Tooltip("lo:Q", format=".3f", title="95% CI / range low"),
            alt.Tooltip("hi:Q", format=".3f", title="95% CI / range high")]
    # The paper's band sits behind the models' marks of the same row, centred on it;
    # the models share the row between them (yOffset) only where there are several.
    band = max(12, 12 * len(models))
    reference = alt.Chart(paper).encode(y=y, color=color, tooltip=tips)
    mine = alt.Chart(ours).encode(
        y=y, color=color, shape=shape, tooltip=tips, opacity=opacity,
        **({"yOffset": alt.YOffset("who:N", scale=alt.Scale(domain=models))} if len(models) > 1 else {}),
    )
    return (
        alt.layer(
            reference.mark_bar(height=band, opacity=0.3).encode(x=alt.X("lo:Q", scale=alt.Scale(domain=[0, 1])), x2="hi:Q"),
            reference.mark_point(shape="square", size=110, filled=False, strokeWidth=2).encode(x=x, shape=shape, opacity=opacity),
            mine.mark_rule(size=3).encode(x=alt.X("lo:Q", scale=alt.Scale(domain=[0, 1])), x2="hi:Q"),
            mine.mark_point(size=60, filled=True).encode(x=x).add_params(pick),
        )
        # A fixed height per row: the models' offsets share the row's band.
        .properties(width=330, height=len(order) * (band + 10), title=title)
    )
