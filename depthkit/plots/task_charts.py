"""Charts of the task chapters: multiple choice and patching (02), fact recall (03)."""

from __future__ import annotations

from typing import Any

import altair as alt

from depthkit.plots._common import _legend, _plain


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
                # The panel's title names the measure: no y title, wider panels.
                y=alt.Y("value:Q", title=None, axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
                color=alt.Color("task:N", title="task", legend=_legend()),
                strokeDash=alt.StrokeDash("variant:N", title="prompts", legend=_legend() if df["variant"].nunique() > 1 else None),
                opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
                tooltip=["task:N", "variant:N", "layer:Q", alt.Tooltip("value:Q", format=".1%")],
            )
            .properties(width=275, height=180, title=measure)
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
            color=alt.Color(
                "class:N", sort=order, scale=alt.Scale(domain=order, range=["#4c78a8", "#f58518", "#bab0ac"]), title="output",
                legend=_legend(),
            ),
            order=alt.Order("class_order:Q"),
            tooltip=["direction:N", "layer:Q", "class:N", alt.Tooltip("share:Q", format=".1%"), "n:Q"],
        )
        .transform_calculate(class_order="indexof(['target-option','source-option','other'], datum['class'])")
        .properties(width=250, height=200)
    )
    if marks is not None:
        rules = (
            alt.Chart(_plain(marks).dropna(subset=["layer"]))
            .mark_rule(strokeWidth=2)
            .encode(
                x="layer:Q", strokeDash=alt.StrokeDash("what:N", title="marker", legend=_legend()),
                tooltip=["direction:N", "what:N", "layer:Q"],
            )
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
            color=alt.Color("task:N", legend=_legend()),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
            tooltip=["task:N", "measure:N", "layer:Q", alt.Tooltip("compute_fraction:Q", format=".0%"), alt.Tooltip("value:Q", format=".1%")],
        )
        .properties(width=250, height=160)
        # Two panels a row: four in one row would not fit the page column.
        .facet(facet=alt.Facet("measure:N", title=None), columns=2)
        .add_params(pick)
        .properties(title=title)
    )


def fact_onset_chart(curves: Any, *, title: str = "Earliest layer at which answer token j reaches rank ≤ k") -> alt.Chart:
    """Mean onset layer against k (log scale), one line per answer token, one panel
    per group (``correct`` or ``length_group``). ``curves``: ``summaries.onset_curve``
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
            color=alt.Color("token:N", title="answer token", legend=_legend()),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
            tooltip=tips,
        )
        .properties(width=250, height=160)
        .facet(facet=alt.Facet("group:N", title=None), columns=2)
        .add_params(pick)
        .properties(title=title)
    )
