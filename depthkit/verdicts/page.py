"""The book's findings page, written from the saved results: a tally per model,
the findings table and the rules, as Markdown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from depthkit.core.files import atomic_write
from depthkit.verdicts.records import OUTCOMES
from depthkit.verdicts.rules import rules_table
from depthkit.verdicts.table import ROBUSTNESS_DIR, findings_table

# Relative to book/: findings.md includes it with {include} _generated/findings.md.
FINDINGS_PAGE = Path("_generated") / "findings.md"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(frame: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def _tally(table: pd.DataFrame) -> Iterator[str]:
    for model, g in table.groupby("model", sort=False):
        counts = g["verdict"].value_counts()
        yield f"* **{model}**: " + ", ".join(f"{counts.get(o, 0)} {o}" for o in OUTCOMES) + "."


def findings_markdown(table: pd.DataFrame) -> str:
    """The findings page's body: a tally per model, the verdicts, the rules."""
    if table.empty:
        return ("**No saved results yet.** Run the chapters (e.g. `depthkit run 01 --model smollm2-135m`) "
                "and rebuild the book; this page fills in from what they save.\n")
    shown = table.drop(columns="chapter").assign(claim=table["claim"] + " (ch. " + table["chapter"] + ")")
    return "\n\n".join([
        "## Verdicts\n\n" + "\n".join(_tally(table)),
        markdown_table(shown),
        "Values are this book's runs: layers as ℓ/L, shares as fractions, differences as fractions of the depth, each "
        "with its 95 % bootstrap interval. The paper's values are reference values for its own models "
        "(GPT2-XL, 48 blocks; Pythia-6.9B, Llama-2-7B and Llama-3-8B, 32 blocks each). *Robustness* lists the verdicts "
        f"of runs of the same model with another lens, convention or seed and whether the verdict survives them "
        f"(kept under `reference/{ROBUSTNESS_DIR}/<variant>/`, made with e.g. "
        "`depthkit run 04 --reference --variant logit -p lens=logit`).",
        "## The rules, fixed before the results\n\n" + markdown_table(rules_table()),
        "A claim is *reproduced* when every testable unit (the run, a task, a direction) shows it as the paper states it, "
        "*partly* when some unit shows at least its direction, *not reproduced* when none does and *not testable* when "
        "no unit meets the conditions. A difference counts only where its interval, as printed, excludes zero (or the paper's bound): an end shown as 0.00 is no finding.",
    ]) + "\n"


def write_findings_page(book_dir: str | Path, results_root: str | Path | None = None) -> Path:
    """Write ``book/_generated/findings.md`` from the saved results (unchanged text
    keeps the file's timestamp, so Sphinx's incremental build holds)."""
    target = Path(book_dir) / FINDINGS_PAGE
    text = findings_markdown(findings_table((), results_root))
    if not target.is_file() or target.read_text(encoding="utf-8") != text:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, text)
    return target
