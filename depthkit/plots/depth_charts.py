"""Charts of the depth chapters: residual phase change (05), depth scores and early exit (06), across models (07)."""

from __future__ import annotations

from typing import Any

import altair as alt

from depthkit.plots._common import _order, _panel_scale, _plain


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
