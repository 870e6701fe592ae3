"""The findings table: every rule judged on every model, whether each verdict
survives the robustness runs (the same model under another lens, convention or
seed), and the caveats the short-falling checks put on the headlines they read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from depthkit.chapters import paper_reference
from depthkit.core import results as saved
from depthkit.core.results import Run, list_runs
from depthkit.verdicts.from_runs import _runs, evidence
from depthkit.verdicts.records import Evidence, Reference, Rule, Verdict
from depthkit.verdicts.rules import RULES, judge
from depthkit.verdicts.wording import _values

# Runs of the same models under another lens, convention or seed, one results root
# each: results/_robustness/<variant>/<model>/<chapter>/.
ROBUSTNESS_DIR = "_robustness"
VARIANT_PARAMS = ("lens", "convention", "seed", "lens_budget", "dtype")


def _variant(main: Run | None, other: Run, folder: str) -> str:
    """What differs in ``other``'s parameters from the main run (else the folder)."""
    base = main.params if main is not None else {}
    diff = [f"{k}={other.params[k]}" for k in VARIANT_PARAMS if k in other.params and other.params.get(k) != base.get(k)]
    return ", ".join(diff) or folder


def robustness_roots(root: str | Path | None = None) -> list[Path]:
    folder = saved.results_root(root) / ROBUSTNESS_DIR
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def _robustness(
    rule: Rule, model: str, main: dict[str, Run], others: Sequence[tuple[Path, dict[str, Run], Evidence]], paper: pd.DataFrame,
    verdict: str,
) -> str:
    """Whether ``verdict`` (the main run's) holds in every robustness run of the
    rule's chapter: "stable (…)", or the variants that change it, with their verdicts."""
    parts = [
        (_variant(main.get(rule.chapter), runs[rule.chapter], folder.name), judge(rule, ev, model, paper).outcome)
        for folder, runs, ev in others if rule.chapter in runs
    ]
    if not parts:
        return "not run"
    same = [v for v, o in parts if o == verdict]
    changed = [f"{v}: {o}" for v, o in parts if o != verdict]
    if not changed:
        return f"stable: {verdict} under {', '.join(same)}"
    return f"changes under {'; '.join(changed)}" + (f" (same under {', '.join(same)})" if same else "")


@dataclass(frozen=True)
class Finding:
    rule: Rule
    reference: Reference
    verdict: Verdict
    robustness: str


def findings(models: Sequence[str] = (), results_root: str | Path | None = None) -> list[Finding]:
    """Every rule judged on every model (``models`` empty: each with saved results),
    with the verdicts of its robustness runs (:data:`ROBUSTNESS_DIR`)."""
    root = saved.results_root(results_root)
    runs = list_runs(root)
    paper = paper_reference()
    out = []
    for model in list(models) or sorted(runs["model"].unique()):
        main = _runs(model, root)
        ev = evidence(model, root, main)
        others = [(r, o, evidence(model, r, o)) for r in robustness_roots(root) if (o := _runs(model, r))]
        for rule in RULES:
            verdict = judge(rule, ev, model, paper)
            out.append(Finding(rule, rule.reference(paper), verdict, _robustness(rule, model, main, others, paper, verdict.outcome)))
    return out


FINDINGS_COLUMNS = ["claim", "chapter", "paper (reference)", "model", "value [95 % CI]", "verdict", "why", "robustness"]


def as_table(found: Sequence[Finding]) -> pd.DataFrame:
    """One row per finding: the paper's reference, the model's statistic with its
    interval, the verdict, its one-line reason and the robustness runs' verdicts."""
    rows = [(f.rule.claim, f.rule.chapter, f.reference.text, f.verdict.model, _values(f.verdict), f.verdict.outcome,
             f.verdict.reason, f.robustness) for f in found]
    return pd.DataFrame(rows, columns=FINDINGS_COLUMNS)


def findings_table(models: Sequence[str] = (), results_root: str | Path | None = None) -> pd.DataFrame:
    return as_table(findings(models, results_root))


CAVEAT_COLUMNS = ["model", "chapter", "quantity", "testable", "caveat"]


def caveats(found: Sequence[Finding]) -> pd.DataFrame:
    """The headline quantities each short-falling check reads, with why: a check
    that is not testable, or that shows less than the paper states."""
    rows = [
        (f.verdict.model, f.rule.chapter, q.format(unit=c.label), c.score is not None, f"{f.rule.claim}: {c.why}")
        for f in found for c in f.verdict.checks if c.score != 2 for q in f.rule.reads
    ]
    return pd.DataFrame(rows, columns=CAVEAT_COLUMNS).drop_duplicates(["model", "quantity", "caveat"], ignore_index=True)
