"""The rules, declared once before any result is read (one per claim: its chapter,
statistic, testability conditions, reference and test), and how a rule judges one
model's evidence into a verdict."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from depthkit.chapters import paper_reference
from depthkit.chapters.ch01_guess_then_refine import Q_FINAL, Q_FLIP, Q_L1
from depthkit.stats import MIN_N
from depthkit.verdicts.ch01_claims import _frequent_early, _overturned, _ref_frequent, _ref_overturned
from depthkit.verdicts.ch02_claims import _collected_first, _patching_apart, _ref_collected, _ref_settled, _settled_later
from depthkit.verdicts.ch03_claims import _first_token_deepest, _ref_tokens
from depthkit.verdicts.ch04_claims import _function_first, _ref_classes
from depthkit.verdicts.ch05_claims import _phase_change
from depthkit.verdicts.ch06_claims import _depth_gap, _ref_depth_gap
from depthkit.verdicts.quantities import _ref_words
from depthkit.verdicts.records import Check, Evidence, Rule, Verdict
from depthkit.verdicts.testability import _LENS, _TASK

RULES: tuple[Rule, ...] = (
    Rule("frequent early guesses", "01", "Early layers guess one of the most frequent tokens (guess, then refine)",
         "layer-1 top-1 in Top 1-10 (headline), against the paper's bound and the output's share",
         f"{_LENS} on the chapter's prompts; ≥ {MIN_N} prompts", _ref_frequent, _frequent_early, (Q_L1, Q_FINAL)),
    Rule("early guesses overturned", "01", "Most early high-frequency guesses are overturned by the output",
         "layer-1 Top 1-10 guesses later overturned (headline)",
         f"{_LENS} on the chapter's prompts; ≥ {MIN_N} guesses", _ref_overturned, _overturned, (Q_FLIP,)),
    Rule("function words before content words", "04", "Function words reach rank 1 at fewer layers than content words",
         "content minus function mean rank-1 onset (ℓ/L), with the frequency-matched and frequency-adjusted controls",
         f"the classes comparable in the run; {_LENS} (chapter 00's prompts: chapter 04 saves no layer-wise ranks); "
         f"≥ {MIN_N} examples per class", _ref_classes, _function_first,
         ("rank-1 onset, function words", "rank-1 onset, content words")),
    Rule("first answer token deepest", "03", "The first token of a multi-token answer needs more depth than later ones",
         "token 1 minus token 2 and token 3 rank-1 onset (ℓ/L), paired within correctly predicted answers",
         f"{_LENS} on correctly predicted answer tokens; ≥ {MIN_N} paired answers", _ref_tokens, _first_token_deepest,
         tuple(f"fact recall rank-1 onset, answer token {t}" for t in (1, 2, 3))),
    Rule("options collected first", "02", "Multiple choice: the valid options are gathered in the first half",
         "MCQ options collected (task) (headline, ℓ/L), its interval against the half", _TASK, _ref_collected, _collected_first,
         ("MCQ options collected ({unit})",)),
    Rule("answer chosen later", "02", "Multiple choice: the answer is chosen after the options are collected, in the second half",
         "answer settled minus options collected (task), paired over prompts (ℓ/L), and MCQ answer settled (task)",
         _TASK, _ref_settled, _settled_later, ("MCQ answer settled ({unit})",)),
    Rule("patching apart from the lens", "02", "The patching transition does not line up with the lens's collection layer",
         "patching transition minus the target task's collection layer (direction), ℓ/L",
         f"{_LENS} on the target task's prompts; ≥ {MIN_N} patching pairs",
         _ref_words("they do not line up (Llama-3-8B; no number given)"), _patching_apart, ("patching transition ({unit})",)),
    Rule("residual phase change", "05", "The residual stream changes regime partway through the network",
         "slope change of the two-segment fit at ℓ* and ℓ*'s distance from the fit range's edge",
         f"≥ {MIN_N} passages (no lens involved)",
         _ref_words("book addition (Csordás et al. 2025; Lad et al. 2024): no paper value"), _phase_change),
    Rule("content words deeper in running text", "06", "Content words need more depth than function words in running text",
         "content minus function mean onset depth d1/L over passages",
         f"{_LENS} on the chapter's tokens; ≥ {MIN_N} passages and tokens of each class", _ref_depth_gap, _depth_gap),
)


def rules_table() -> pd.DataFrame:
    """The rules as declared: claim, chapter, statistic, testability conditions."""
    return pd.DataFrame([(r.claim, r.chapter, r.statistic, r.conditions) for r in RULES],
                        columns=["claim", "chapter", "statistic", "testable when"])


def outcome(checks: Sequence[Check]) -> str:
    scores = [c.score for c in checks if c.score is not None]
    if not scores:
        return "not testable"
    if min(scores) == 2:
        return "reproduced"
    return "partly" if max(scores) >= 1 else "not reproduced"


def _reason(checks: Sequence[Check]) -> str:
    if not checks:
        return "not measured: no saved run holds the statistic"
    if len(checks) == 1:
        return checks[0].why
    tested = [c for c in checks if c.score is not None]
    parts = [f"{sum(c.score == 2 for c in tested)} of {len(tested)} testable show it"] if tested else []
    parts += [c.why for c in tested] + [f"{c.label}: not testable, {c.why}" for c in checks if c.score is None]
    return "; ".join(parts)


def judge(rule: Rule, ev: Evidence, model: str, paper: pd.DataFrame | None = None) -> Verdict:
    ref = rule.reference(paper_reference() if paper is None else paper)
    if not ev.has(rule.chapter):
        return Verdict(rule.name, model, "not testable", (), f"no readable saved run of chapter {rule.chapter}")
    checks = tuple(rule.test(ev, ref))
    return Verdict(rule.name, model, outcome(checks), checks, _reason(checks))
