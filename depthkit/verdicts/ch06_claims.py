"""Chapter 06's claim (a book addition): content words need more depth than
function words in running text. Its test, its reference (the paper's word-class
gap, for comparison), and the class gap derived from the chapter's saved scores."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from depthkit.core.results import Run
from depthkit.stats import MIN_N, unit_mean
from depthkit.verdicts.ch04_claims import _ref_classes
from depthkit.verdicts.quantities import Q_AGREE, Q_CLASS_TOKENS, Q_DEPTH_GAP, _boot
from depthkit.verdicts.records import Check, Evidence, Reference, Stat
from depthkit.verdicts.testability import _check, _lens_gate
from depthkit.verdicts.wording import _above, _ci


def _depth_gap(ev: Evidence, ref: Reference) -> list[Check]:
    counts = {c: ev.get("06", Q_CLASS_TOKENS.format(c=c)) for c in ("function", "content")}
    few = [c for c, s in counts.items() if s is None or s.value < MIN_N]
    gate = f"fewer than {MIN_N} {' and '.join(few)}-word tokens" if few else None

    def score(s: Stat) -> tuple[int, str]:
        later = _above(s.lo, 0.0)
        return int(later) * 2, f"content minus function d1/L {_ci(s)}" + ("" if later else ": no clear difference")

    return [_check("d1/L gap", ev.get("06", Q_DEPTH_GAP), [gate, _lens_gate(ev, "06")], score)]


def _ref_depth_gap(paper: pd.DataFrame) -> Reference:
    return Reference(math.nan, f"book addition; the paper's word-class onset gap {_ref_classes(paper).text}")


def _classes_06(scores: pd.DataFrame, min_group: int) -> pd.DataFrame | None:
    """The tokens chapter 06 compares by word class, as its ``pos_tables`` keeps them:
    correctly predicted first pieces of words, in tags with at least ``min_group``
    tokens (the saved scores carry each token's tag, not its class)."""
    from depthkit.analyses.part_of_speech import word_class

    if "word_class" in scores:
        return scores
    if not {"pos", "correct", "first_piece"} <= set(scores.columns):
        return None
    kept = scores[scores["correct"].astype(bool) & scores["first_piece"].astype(bool)]
    counts = kept["pos"].value_counts()
    kept = kept[kept["pos"].isin(counts[counts >= min_group].index)]
    return kept.assign(word_class=kept["pos"].map(word_class))


def _derive_06(run: Run, other: Callable[[str], Run | None]) -> list[tuple]:
    from depthkit.chapters.ch06_depth_score import class_difference

    s = run["scores"]
    agree = unit_mean(s.assign(agree=s["settles_on_final"].astype(float)), "agree", "item", **_boot(run)).iloc[0]
    rows = [(Q_AGREE, agree["estimate"], agree["lo"], agree["hi"], agree["n"])]
    kept = _classes_06(s, int(run.params.get("min_group", 1)))
    if kept is not None:
        counts = kept["word_class"].value_counts()
        rows += [(Q_CLASS_TOKENS.format(c=c), float(counts.get(c, 0)), np.nan, np.nan, np.nan) for c in ("function", "content")]
        gap = class_difference(kept, **_boot(run))
        rows.append((Q_DEPTH_GAP, gap.estimate, gap.lo, gap.hi, gap.n))
    return rows
