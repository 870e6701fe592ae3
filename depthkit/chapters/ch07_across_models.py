"""Chapter 07 (across models): every saved chapter run of every model, read through
the chapters' own :func:`depthkit.chapters.headlines`, on normalised depth ℓ/L,
beside the paper's reference rows, with the verdicts of :mod:`depthkit.verdicts`
and the caveats of the quantities those verdicts read."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from depthkit import verdicts
from depthkit.chapters import CHAPTERS, headlines, paper_reference
from depthkit.core.results import ResultsError, list_runs

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


def _cell(value: float, lo: float, hi: float, scale: str) -> str:
    """A value with its interval as the verdicts write it: a layer at the output row
    (ℓ/L = 1) is "the output, not before", and ends that print alike are no interval.
    A row with only an interval is one of the paper's ranges."""
    if math.isnan(value):
        return f"[{lo:.2f}, {hi:.2f}]" if not math.isnan(lo) else "—"
    return verdicts.value_text(value, lo, hi, layer=scale == "layer")


def with_caveats(table: pd.DataFrame, caveats: pd.DataFrame) -> pd.DataFrame:
    """``table`` with ``caveat`` (the verdicts' reasons for each of our rows that a
    short-falling check reads, else "") and ``testable`` (False where a check could
    not test its claim on that model)."""
    keyed = caveats.groupby(["model", "quantity"]).agg(caveat=("caveat", "; ".join), testable=("testable", "all"))
    out = table.drop(columns=["caveat", "testable"], errors="ignore").join(keyed, on=["model", "quantity"])
    ours = out["source"] == OURS
    return out.assign(caveat=out["caveat"].where(ours).fillna(""), testable=out["testable"].where(ours).fillna(True).astype(bool))


def wide_table(table: pd.DataFrame) -> pd.DataFrame:
    """Quantity × model (paper rows as "paper (reference): <model>"), each cell the
    value with its 95 % interval, and "†" where a caveat applies (:func:`caveat_text`)."""
    shown = [_cell(*r) for r in table[["value", "lo", "hi", "scale"]].itertuples(index=False)]
    if "caveat" in table:
        shown = [s + (" †" if c else "") for s, c in zip(shown, table["caveat"])]
    who = np.where(table["source"] == PAPER_SOURCE, PAPER_SOURCE + ": " + table["model"], table["model"])
    wide = table.assign(shown=shown, who=who).pivot_table(index="quantity", columns="who", values="shown", aggfunc="first")
    return wide.fillna("")


def depth_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows that are layers (ℓ/L), for the chart, each with its chart ``row``
    ("<chapter> · <quantity>", in chapter order): ours, once per model and quantity
    (chapters 02 and 05 both report the patching transitions), and the paper's value
    of the same quantity on each of our rows it describes (a per-task or
    per-direction quantity "X (task)" is described by the paper's X). Rows a
    verdict found untestable on their model (``testable`` False) are left out, and so
    are layers reached only at the output (ℓ/L = 1: a bound, with no depth to place;
    the table writes them "the output, not before")."""
    testable = table["testable"] if "testable" in table else True
    placed = table["value"] < 1
    ours = table[(table["source"] == OURS) & (table["scale"] == "layer") & testable & placed].drop_duplicates(["quantity", "model"])
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


def caveat_text(caveats: pd.DataFrame) -> str:
    """The caveats behind every "†" of the table, model by model; untestable rows
    are also the ones left out of the chart."""
    if caveats.empty:
        return "### Caveats\n\nNone: every verdict's checks show their claim as the paper states it, or were not measured."
    lines = []
    for model, g in caveats.groupby("model", sort=False):
        for (caveat, testable), q in g.groupby(["caveat", "testable"], sort=False)["quantity"]:
            left_out = "" if testable else " (left out of the chart)"
            lines.append(f"* **{model}**, {', '.join(q)}{left_out}: {caveat}.")
    return "### Caveats\n\n" + "\n".join(lines)


def _verdict(found: Sequence[verdicts.Finding], model: str, rule: str) -> verdicts.Verdict | None:
    return next((f.verdict for f in found if f.verdict.model == model and f.rule.name == rule), None)


def summary(table: pd.DataFrame, models: list[str], found: Sequence[verdicts.Finding] = ()) -> str:
    """One line per model: the verdicts' tally, ℓ*/L, the early-exit saving,
    function vs content onsets (with their verdicts where ``found`` has them)."""
    ours = table[table["source"] == OURS]

    def first(model: str, test) -> pd.Series | None:
        rows = ours[(ours["model"] == model) & ours["quantity"].map(test)]
        return rows.iloc[0] if len(rows) else None

    paper = table[table["source"] == PAPER_SOURCE].set_index("quantity")["value"]
    lines = []
    for m in models:
        mine = [f.verdict.outcome for f in found if f.verdict.model == m]
        part = [", ".join(f"{mine.count(o)} {o}" for o in verdicts.OUTCOMES) + " of the claims"] if mine else []
        star = first(m, lambda q: q.startswith("ℓ*"))
        phase = _verdict(found, m, "residual phase change")
        if star is not None:
            part.append(f"ℓ*/L = {star['value']:.2f} ({star['quantity']})")
        elif phase is not None and phase.checks:
            part.append(f"no ℓ* ({phase.reason})")
        else:
            part.append("no ℓ* (chapter 05 missing)")
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
            gap = _verdict(found, m, "function words before content words")
            judged = f" — {gap.outcome}: {gap.reason}" if gap is not None else ""
            part.append(f"function vs content words reach rank 1 at {fw['value']:.2f} vs {cw['value']:.2f} of the depth{ref}{judged}")
        lines.append(f"* **{m}**: " + "; ".join(part) + ".")
    return "\n".join(lines) + (
        "\n\nThe embedded models are 4-bit quantised small models (see each run's manifest), not the paper's "
        "GPT2-XL (1.5B parameters, 48 blocks), Pythia-6.9B, Llama-2-7B and Llama-3-8B (32 blocks each); each chapter's lens "
        "and layer convention are recorded in its manifest. Compare positions on ℓ/L, not exact values."
    )
