"""The explorer's tables as plain HTML strings: the layer × position grid and the
detail of one position. Plain strings, so they also work without a browser, and
nothing is fetched from the network.
"""

from __future__ import annotations

import html
import math

import pandas as pd

from depthkit.plots.explorer_state import Explorer

__all__ = ["detail_html", "grid_html"]


def _shown(token: str, width: int = 10) -> str:
    """A token as it can be read in a cell: spaces and line breaks made visible,
    long tokens shortened (the tooltip keeps the whole)."""
    s = token.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")
    return s if len(s) <= width else s[: width - 1] + "…"


def _strength(prob: float, rank: int | None, colour_by: str, d_vocab: int) -> float:
    if colour_by == "rank":
        # log scale: rank 1 is full colour, the vocabulary's last rank none
        return 1.0 - math.log(max(rank or d_vocab, 1)) / math.log(max(d_vocab, 2))
    return float(prob)


def _cell_style(strength: float, colour_by: str) -> str:
    rgb = "27,120,55" if colour_by == "rank" else "33,102,172"
    alpha = 0.06 + 0.88 * min(max(strength, 0.0), 1.0)
    ink = "#fff" if alpha > 0.55 else "#111"
    return f"background:rgba({rgb},{alpha:.2f});color:{ink}"


_CSS = (
    "<style>.dk-x table{border-collapse:collapse;font:12px/1.3 monospace}"
    ".dk-x td,.dk-x th{border:1px solid #ddd;padding:2px 4px;white-space:pre;text-align:center}"
    ".dk-x th{background:#f6f6f6;font-weight:normal}.dk-x .dk-pick{outline:2px solid #d62728;outline-offset:-2px}"
    ".dk-x .dk-wrap{overflow-x:auto;max-width:100%}</style>"
)


def grid_html(ex: Explorer) -> str:
    """The layer × position grid, final layer on top (where the model's answer is)."""
    g = ex.grid_table()
    toks = ex.input_tokens()
    d_vocab = int(ex.model.cfg.d_vocab)
    target = "" if ex.target_id is None else html.escape(_shown(ex.token(ex.target_id)))
    head = "".join(
        f'<th class="{"dk-pick" if p == ex.position else ""}" title="position {p}: {html.escape(t, quote=True)}">'
        f"{p}<br>{html.escape(_shown(t))}</th>"
        for p, t in enumerate(toks)
    )
    rows = []
    for layer, block in sorted(g.groupby("layer"), key=lambda kv: -kv[0]):
        cells = []
        for r in block.itertuples(index=False):
            rank = None if pd.isna(r.target_rank) else int(r.target_rank)
            tip = f"layer {layer}, position {r.position}: {r.token!r} p={r.prob:.3f}"
            if rank is not None:
                tip += f"; target {ex.token(ex.target_id)!r} rank {rank}, p={r.target_prob:.3g}"
            style = _cell_style(_strength(r.prob, rank, ex.colour_by, d_vocab), ex.colour_by)
            pick = ' class="dk-pick"' if r.position == ex.position else ""
            cells.append(
                f'<td{pick} style="{style}" data-layer="{layer}" data-position="{r.position}" '
                f'title="{html.escape(tip, quote=True)}">{html.escape(_shown(r.token))}</td>'
            )
        rows.append(f"<tr><th>{layer}</th>{''.join(cells)}</tr>")
    legend = ("colour: probability of the top-1 token (white 0 → blue 1)" if ex.colour_by == "prob" else
              f"colour: rank of the target {target} (green: rank 1, white: last); the cell shows the top-1 token")
    return (
        f'{_CSS}<div class="dk-x depthkit-explorer-grid" data-lens="{ex.lens_name}" data-convention="{ex.convention}" '
        f'data-colour="{ex.colour_by}" data-positions="{len(toks)}" data-layers="{g["layer"].nunique()}">'
        f"<div>{ex.lens_name} lens, {ex.convention} layers; rows: layer, columns: input token (the cell is the "
        f"guess for the next token); {legend}.</div>"
        f'<div class="dk-wrap"><table><tr><th>layer</th>{head}</tr>{"".join(rows)}</table></div></div>'
    )


def detail_html(ex: Explorer) -> str:
    """Top-k at every layer of the chosen position, and the target's rank there."""
    t = ex.topk_table()
    tgt = ex.target_table()
    by_layer = dict(zip(tgt["layer"], zip(tgt["rank"], tgt["prob"]))) if len(tgt) else {}
    tok = ex.input_tokens()[ex.position]
    head = "".join(f"<th>top {k}</th>" for k in range(1, ex.top_k + 1))
    if by_layer:
        head += f"<th>rank of {html.escape(_shown(ex.token(ex.target_id)))}</th>"  # type: ignore[arg-type]
    rows = []
    for layer, block in sorted(t.groupby("layer"), key=lambda kv: -kv[0]):
        cells = "".join(
            f'<td style="{_cell_style(r.prob, "prob")}" title="{html.escape(repr(r.token), quote=True)} '
            f'(id {r.token_id}) p={r.prob:.4f}">{html.escape(_shown(r.token))}<br>{r.prob:.2f}</td>'
            for r in block.itertuples(index=False)
        )
        if by_layer:
            rank, prob = by_layer[layer]
            cells += f'<td title="p={prob:.3g}">{int(rank)}</td>'
        rows.append(f"<tr><th>{layer}</th>{cells}</tr>")
    return (
        f'{_CSS}<div class="dk-x depthkit-explorer-detail" data-position="{ex.position}">'
        f"<div>Position {ex.position} ({html.escape(repr(tok))}): top {ex.top_k} per layer.</div>"
        f'<div class="dk-wrap"><table><tr><th>layer</th>{head}</tr>{"".join(rows)}</table></div></div>'
    )
