"""Chapter 07 (across models): every saved chapter run of every model, read through
the chapters' own :func:`depthkit.chapters.headlines`, on normalised depth ℓ/L,
beside the paper's reference rows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from depthkit.chapters import CHAPTERS, headlines, paper_reference
from depthkit.results import ResultsError, list_runs

OURS = "this project"
PAPER_SOURCE = "paper (reference)"
TABLE_COLUMNS = ["quantity", "model", "value", "lo", "hi", "n", "scale", "source", "chapter"]


def compared_chapters() -> list:
    return [c for c in CHAPTERS.values() if not c.reads_results]


def availability(models: list[str], results_root: str | None) -> tuple[list[str], pd.DataFrame, list[tuple[str, str]]]:
    """(models to compare, a model × chapter table of "saved"/"missing", the missing
    pairs). An empty ``models`` means every model with at least one saved run."""
    runs = list_runs(results_root)
    wanted = list(models) or (sorted(runs["model"].unique()) if len(runs) else [])
    have = set(zip(runs["model"], runs["chapter"])) if len(runs) else set()
    chapters = compared_chapters()
    table = pd.DataFrame(
        {c.slug: ["saved" if (m, c.slug) in have else "missing" for m in wanted] for c in chapters},
        index=pd.Index(wanted, name="model"),
    )
    missing = [(m, c.slug) for m in wanted for c in chapters if (m, c.slug) not in have]
    return wanted, table, missing


def collect(models: list[str], missing: list[tuple[str, str]], results_root: str | None) -> tuple[pd.DataFrame, list[tuple[str, str, str]]]:
    """All headline rows of the saved runs (layers as ℓ/L) and the paper's rows, and
    the runs that are saved but could not be read (with why)."""
    frames, unreadable = [], []
    for m in models:
        for c in compared_chapters():
            if (m, c.slug) in missing:
                continue
            try:
                h = headlines(m, c.id, results_root)
            except (ResultsError, KeyError, AttributeError, ValueError) as err:
                unreadable.append((m, c.slug, f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"))
                continue
            frames.append(
                h.assign(value=h["value_norm"], lo=h["lo_norm"], hi=h["hi_norm"], source=OURS)[TABLE_COLUMNS]
            )
    paper = paper_reference().assign(n=np.nan, scale="layer", source=PAPER_SOURCE)
    table = pd.concat([*frames, paper[TABLE_COLUMNS]], ignore_index=True)
    return table, unreadable


def _cell(value: float, lo: float, hi: float) -> str:
    if math.isnan(value):
        return f"[{lo:.2f}, {hi:.2f}]" if not math.isnan(lo) else "—"
    return f"{value:.2f}" + ("" if math.isnan(lo) else f" [{lo:.2f}, {hi:.2f}]")


def wide_table(table: pd.DataFrame) -> pd.DataFrame:
    """Quantity × model (paper rows as "paper (reference): <model>"), each cell the
    value with its 95 % interval."""
    shown = [_cell(*r) for r in table[["value", "lo", "hi"]].itertuples(index=False)]
    who = np.where(table["source"] == PAPER_SOURCE, PAPER_SOURCE + ": " + table["model"], table["model"])
    wide = table.assign(shown=shown, who=who).pivot_table(index="quantity", columns="who", values="shown", aggfunc="first")
    return wide.fillna("")


def depth_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows that are layers (ℓ/L), for the chart, each with its chart ``row``
    ("<chapter> · <quantity>", in chapter order): ours, once per model and quantity
    (chapters 02 and 05 both report the patching transitions), and the paper's value
    of the same quantity on each of our rows it describes (a per-task or
    per-direction quantity "X (task)" is described by the paper's X)."""
    ours = table[(table["source"] == OURS) & (table["scale"] == "layer")].drop_duplicates(["quantity", "model"])
    ours = ours.sort_values("chapter", kind="stable").assign(row=lambda d: d["chapter"] + " · " + d["quantity"])
    rows = ours[["quantity", "row"]].drop_duplicates("row")
    rows = rows.assign(base=rows["quantity"].str.replace(r" \(.*\)$", "", regex=True))
    paper = table[table["source"] == PAPER_SOURCE].rename(columns={"quantity": "base"})
    ref = rows.merge(paper, on="base")
    return pd.concat([ours, ref[ours.columns]], ignore_index=True)


def missing_text(missing: list[tuple[str, str]], unreadable: list[tuple[str, str, str]]) -> str:
    by_model: dict[str, list[str]] = {}
    for m, c in missing:
        by_model.setdefault(m, []).append(c)
    lines = [f"* **{m}**: no saved run of {', '.join(cs)}." for m, cs in by_model.items()]
    lines += [f"* **{m}**, {c}: saved but not readable here ({why})." for m, c, why in unreadable]
    return "### Missing results\n\n" + ("\n".join(lines) if lines else "None: every model has every chapter.")


def summary(table: pd.DataFrame, models: list[str]) -> str:
    """One line per model: ℓ*/L, the early-exit saving, function vs content onsets."""
    ours = table[table["source"] == OURS]

    def first(model: str, test) -> pd.Series | None:
        rows = ours[(ours["model"] == model) & ours["quantity"].map(test)]
        return rows.iloc[0] if len(rows) else None

    paper = table[table["source"] == PAPER_SOURCE].set_index("quantity")["value"]
    lines = []
    for m in models:
        part = []
        star = first(m, lambda q: q.startswith("ℓ*"))
        part.append(f"ℓ*/L = {star['value']:.2f} ({star['quantity']})" if star is not None else "no ℓ* (chapter 05 missing)")
        saving = first(m, lambda q: "confidence policy" in q)
        if saving is None:
            part.append("no early-exit result (chapter 06 missing)")
        else:
            v = saving["value"]
            part.append(f"block saving at the target agreement with the confidence policy: {'not reached' if math.isnan(v) else f'{v:.0%}'}")
        fw, cw = first(m, lambda q: q == "rank-1 onset, function words"), first(m, lambda q: q == "rank-1 onset, content words")
        if fw is not None and cw is not None:
            ref = ""
            if {"rank-1 onset, function words", "rank-1 onset, content words"} <= set(paper.index):
                ref = f" (paper: {paper['rank-1 onset, function words']:.2f} vs {paper['rank-1 onset, content words']:.2f})"
            part.append(f"function vs content words reach rank 1 at {fw['value']:.2f} vs {cw['value']:.2f} of the depth{ref}")
        lines.append(f"* **{m}**: " + "; ".join(part) + ".")
    return "\n".join(lines) + (
        "\n\nThe embedded models are 4-bit quantised small models (see each run's manifest), not the paper's "
        "7–8B models; each chapter's lens and layer convention are recorded in its manifest. Compare positions on ℓ/L, "
        "not exact values."
    )
