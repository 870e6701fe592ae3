"""The quantities the rules read, by the names their evidence rows carry, with the
means of writing such rows from a saved run (a share re-bootstrapped from its
count) and of finding the paper's row for a quantity."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from depthkit.core.results import Run
from depthkit.stats import bootstrap_ci
from depthkit.verdicts.records import EVIDENCE_COLUMNS, Reference

Q_AGREE = "lens top-1 agreement at layer L−1"
Q_ACCURACY, Q_BASELINE, Q_ONE_ANSWER = "accuracy", "majority baseline", "one-answer share"
Q_ORDER = "answer settled minus options collected"
Q_PATCH_GAP = "patching transition minus collection layer"
Q_TOKEN_GAP = "token 1 minus token {t} rank-1 onset"
Q_CLASS_GAP = "content minus function rank-1 onset"
Q_MATCHED, Q_ADJUSTED = Q_CLASS_GAP + ", frequency-matched", Q_CLASS_GAP + ", frequency-adjusted"
Q_CLASSES = "function and content words comparable"
Q_SLOPE = "slope change at ℓ*"
Q_EDGE = "ℓ* blocks from the edge of the fit range"
Q_DEPTH_GAP = "content minus function onset depth d1/L"
Q_CLASS_TOKENS = "{c}-word tokens"


def _rows(chapter: str, rows: Sequence[tuple[str, float, float, float, float]]) -> pd.DataFrame:
    return pd.DataFrame([(chapter, *r) for r in rows], columns=EVIDENCE_COLUMNS).astype({c: float for c in EVIDENCE_COLUMNS[2:]})


def _boot(run: Run) -> dict[str, int]:
    return {"n_boot": int(run.params.get("n_boot", 1000)), "seed": int(run.params.get("seed", 0))}


def _share(k: float, n: float, run: Run) -> tuple[float, float, float, float]:
    ci = bootstrap_ci(np.r_[np.ones(int(round(k))), np.zeros(int(n) - int(round(k)))], **_boot(run))
    return ci.estimate, ci.lo, ci.hi, float(ci.n)


def _paper(paper: pd.DataFrame, quantity: str) -> pd.Series:
    return paper[paper["quantity"] == quantity].iloc[0]


def _ref_words(text: str) -> Callable[[pd.DataFrame], Reference]:
    return lambda paper: Reference(math.nan, text)
