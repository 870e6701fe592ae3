"""Helpers shared by the chart modules of :mod:`depthkit.plots`."""

from __future__ import annotations

from typing import Any

import altair as alt

# Width in px of the book's content column (sphinx-book-theme's main column at its
# widest). Every chart's natural width stays within it, so that fitting a chart to the
# column never has to shrink its text (tests/test_plot_widths.py checks each chart).
COLUMN_WIDTH = 688


def _legend(title: Any = alt.Undefined, columns: int = 4, **kw: Any) -> alt.Legend:
    """A legend under the chart, entries in rows: a legend beside a chart adds its own
    width to the chart's."""
    return alt.Legend(orient="bottom", direction="horizontal", columns=columns, title=title, labelLimit=220, **kw)


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


def _lines_with_band(
    data: Any, y: str, color: str, order: list[str], y_title: str, title: str, x_title: str = "layer"
) -> alt.LayerChart:
    pick = alt.selection_point(fields=[color], bind="legend")
    base = alt.Chart(data, title=title).encode(
        x=alt.X("layer:Q", title=x_title),
        color=alt.Color(f"{color}:N", sort=order, title=color.replace("_", " "), legend=_legend()),
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
    size = alt.Size("n:Q", title="prompts", scale=alt.Scale(range=[10, 120]), legend=_legend()) if "n" in data.columns else alt.value(30)
    layers.append(base.mark_point(filled=True).encode(y=f"{y}:Q", size=size, tooltip=tooltip))
    return alt.layer(*layers).add_params(pick).properties(width=600, height=260)


def _panel_scale(d: Any) -> alt.Scale:
    """Log scale for a positive panel spanning more than a factor of 30 (block 0's
    relative update dwarfs the others), linear otherwise."""
    lo, hi = float(d["mean"].min()), float(d["mean"].max())
    return alt.Scale(type="log") if lo > 0 and hi / lo > 30 else alt.Scale(zero=False)
