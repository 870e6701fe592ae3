"""Charts of the lens chapters: lens fidelity (00), guess then refine (01), part of speech (04)."""

from __future__ import annotations

from typing import Any

import altair as alt

from depthkit.plots._common import _legend, _lines_with_band, _order, _plain


def _top1_prob_color() -> alt.Color:
    """The top-1 probability scale shared by the lens grids (0–100 %, legend below)."""
    return alt.Color(
        "prob:Q", title="p(top-1)", scale=alt.Scale(scheme="blues", domain=[0, 1]),
        legend=alt.Legend(orient="bottom", direction="horizontal", gradientLength=200, format="%"),
    )


def lens_fidelity_chart(metrics: Any, title: str = "") -> alt.HConcatChart:
    """Per-layer KL(final ‖ lens) and top-1 agreement with the final prediction, one
    line per lens. ``metrics``: DataFrame[layer, lens, kl, top1_agreement]. Click a
    legend entry to highlight one lens."""
    pick = alt.selection_point(fields=["lens"], bind="legend")
    base = alt.Chart(metrics).encode(
        x=alt.X("layer:Q", title="layer ℓ"),
        color=alt.Color("lens:N", title="lens", legend=_legend()),
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
        .properties(width=250, height=220, title="Distance to the final distribution")
    )
    agree = base.mark_line(point=True).encode(
        y=alt.Y("top1_agreement:Q", title="top-1 = final top-1", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1]))
    ).properties(width=250, height=220, title="Agreement with the final prediction")
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
        color=_top1_prob_color()
    )
    text = base.mark_text(fontSize=10, limit=76).encode(
        text=alt.Text("shown:N"),
        color=alt.condition(alt.datum.prob > 0.5, alt.value("white"), alt.value("black")),
    )
    n_layers = top1["layer"].nunique()
    return (cells + text).properties(width=80 * top1["lens"].nunique(), height=14 * n_layers, title=title)


def lens_examples_chart(topk: Any, prompts: list[str]) -> alt.HConcatChart:
    """:func:`lens_topk_chart` of each example prompt, side by side (``topk``: the
    chapter's examples, an ``item`` column indexing ``prompts``)."""
    return alt.hconcat(*[lens_topk_chart(topk[topk["item"] == i], title=repr(q)) for i, q in enumerate(prompts)])


def lens_explorer_chart(grid: Any, *, title: str = "", width: int = 560) -> alt.LayerChart:
    """Pick a prompt from the dropdown: its layer × position grid of the lens's top-1
    tokens, coloured by probability (hover for the top-3). Works in the static book:
    every prompt's grid is in the chart's data and the dropdown only filters it.
    ``grid``: ``ch00_lenses.explorer_grid`` (prompt, label, column, position, layer,
    top1, prob, top3)."""
    labels = grid.drop_duplicates("prompt").sort_values("prompt")
    choice = alt.param(
        name="prompt_choice",
        value=int(labels["prompt"].iloc[0]),
        bind=alt.binding_select(
            options=[int(i) for i in labels["prompt"]], labels=list(labels["label"]), name="prompt "
        ),
    )
    # The page embeds every grid: one row per (prompt, position) holding its layers as
    # lists, flattened in the browser, writes each field name once per column of a
    # grid instead of once per cell (about half the bytes); the prompt labels travel
    # in the dropdown only.
    cells = ["layer", "top1", "prob", "top3"]
    data = (
        grid.sort_values(["prompt", "position", "layer"])
        .groupby(["prompt", "position", "column"], sort=False)[cells]
        .agg(list)
        .reset_index()
    )
    n_columns = int(grid.groupby("prompt")["position"].nunique().max())
    base = (
        alt.Chart(data, title=title)
        .transform_filter(alt.datum.prompt == choice)
        .transform_flatten(cells)
        .encode(
            x=alt.X(
                "column:N",
                title="input token at the position (and its index); each cell predicts the next token",
                sort=alt.EncodingSortField("position", op="min"),
                axis=alt.Axis(orient="top", labelAngle=-40, labelLimit=90),
            ),
            y=alt.Y("layer:O", title="layer ℓ", sort="descending"),
            tooltip=[
                alt.Tooltip("column:N", title="input token"),
                alt.Tooltip("layer:O"),
                alt.Tooltip("top1:N", title="top-1"),
                alt.Tooltip("prob:Q", title="p(top-1)", format=".1%"),
                alt.Tooltip("top3:N", title="top-3"),
            ],
        )
    )
    rects = base.mark_rect().encode(
        color=_top1_prob_color()
    )
    step = max(30, width // max(1, n_columns))
    text = base.mark_text(fontSize=9, limit=step - 4).encode(
        text=alt.Text("top1:N"),
        color=alt.condition(alt.datum.prob > 0.5, alt.value("white"), alt.value("black")),
    )
    n_layers = int(grid["layer"].nunique())
    return (rects + text).add_params(choice).properties(width=step * n_columns, height=14 * n_layers)


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
            color=alt.Color("lens:N", title="lens", legend=_legend(columns=2)),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
            tooltip=[alt.Tooltip("lens:N"), alt.Tooltip("layer:Q"), alt.Tooltip("share:Q", format=".1%")],
        )
        .add_params(pick)
        .properties(width=460, height=260, title=title)
    )




# ---------------------------------------------------------------- guess, then refine (chapters 01 and 04)






def bucket_share_chart(shares: Any, *, title: str = "Top-1 prediction by frequency bucket, per layer") -> alt.Chart:
    """Stacked bars: per layer, the share of predictions whose top-1 is in each
    frequency bucket (``summaries.bucket_shares``). Click the legend to highlight a
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
            color=alt.Color("bucket:N", sort=order, title="frequency bucket", scale=alt.Scale(scheme="viridis"), legend=_legend()),
            order=alt.Order("order:Q"),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.25)),
            tooltip=tooltip,
        )
        .add_params(pick)
        .properties(width=600, height=260)
    )




def flip_rate_chart(flips: Any, *, title: str = "Decision flips: layer top-1 differs from the final top-1") -> alt.LayerChart:
    """Flip rate per layer, one line per frequency bucket of the layer's top-1
    (``summaries.flip_rates``), with bootstrap bands when present; point size = number
    of prompts in that bucket at that layer."""
    return _lines_with_band(_plain(flips), "flip_rate", "bucket", _order(flips["bucket"]), "flip rate", title)


def agreement_chart(agreement: Any, *, title: str = "Does the layer's top-1 equal a reference guess?") -> alt.LayerChart:
    """Per layer, the share of prompts whose lens top-1 equals each reference guess
    (``summaries.agreement_by_layer``: unigram, bigram, final, ...)."""
    data = _plain(agreement)
    return _lines_with_band(data, "share", "guess", _order(agreement["guess"]), "share of prompts", title)


def onset_curve_chart(
    curves: Any, *, color: str = "tag", n_layers: int | None = None, title: str = "Earliest layer at which the answer reaches rank ≤ k"
) -> alt.LayerChart:
    """Mean earliest layer at rank ≤ k against k (log scale), one line per group
    (``summaries.onset_curve``), with bootstrap error bars when present. ``n_layers``
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
            legend=_legend(),
        )
        if "word_class" in data.columns
        else alt.value([1, 0])
    )
    base = alt.Chart(data, title=title).encode(
        x=alt.X("k:Q", scale=alt.Scale(type="log"), title="k (answer rank ≤ k)"),
        color=alt.Color(f"{color}:N", sort=order, legend=_legend(columns=6)),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
    )
    tooltip = [f"{color}:N", "k:Q", alt.Tooltip("mean_onset:Q", format=".2f"), "n_reached:Q", "n_items:Q"]
    layers = [base.mark_line().encode(y=alt.Y("mean_onset:Q", title="mean earliest layer", scale=y_scale), strokeDash=dash)]
    if "lo" in data.columns:
        tooltip += [alt.Tooltip("lo:Q", format=".2f"), alt.Tooltip("hi:Q", format=".2f")]
        layers.append(base.mark_errorbar().encode(y=alt.Y("lo:Q", title="mean earliest layer", scale=y_scale), y2="hi:Q"))
    layers.append(base.mark_point(filled=True).encode(y="mean_onset:Q", tooltip=tooltip))
    return alt.layer(*layers).add_params(pick).properties(width=600, height=300)


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
    (``stats.bootstrap_ci_by``: ``[group, estimate, lo, hi, n]``), the mean with its
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
    bootstrap intervals (``stats.bootstrap_ci_by(df, value, [bin_col, group])``):
    bins where both groups have examples compare like with like."""
    data = _plain(cells)
    order = _order(cells[bin_col])
    groups = _order(cells[group])
    y_scale = alt.Scale(domain=[0, n_layers]) if n_layers else alt.Scale(zero=True)
    base = alt.Chart(data, title=title).encode(
        x=alt.X(f"{bin_col}:N", sort=order, title="frequency rank of the answer's first token"),
        xOffset=alt.XOffset(f"{group}:N", sort=groups),
        color=alt.Color(f"{group}:N", sort=groups, title=group.replace("_", " "), legend=_legend()),
    )
    tip = [f"{bin_col}:N", f"{group}:N", alt.Tooltip("estimate:Q", format=".2f", title="mean"), alt.Tooltip("lo:Q", format=".2f"), alt.Tooltip("hi:Q", format=".2f"), "n:Q"]
    return alt.layer(
        base.mark_errorbar().encode(y=alt.Y("lo:Q", title="mean earliest layer at rank 1", scale=y_scale), y2="hi:Q"),
        base.mark_point(filled=True).encode(y="estimate:Q", size=alt.Size("n:Q", scale=alt.Scale(range=[20, 200]), title="examples", legend=_legend()), tooltip=tip),
    ).properties(width=560, height=280)
