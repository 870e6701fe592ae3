"""The records a verdict is made of: a statistic with its interval, the paper's
reference, one checked unit, the verdict, one model's evidence rows, and the rule
that ties a claim to its test."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import pandas as pd

OUTCOMES = ("reproduced", "partly", "not reproduced", "not testable")
EVIDENCE_COLUMNS = ["chapter", "quantity", "value", "lo", "hi", "n"]


class Stat(NamedTuple):
    value: float
    lo: float
    hi: float
    n: float


class Reference(NamedTuple):
    """The paper's comparison value (NaN where the claim has none) and its wording."""

    value: float
    text: str


@dataclass(frozen=True)
class Check:
    """One measured unit of a rule: its statistic and score (None: not testable)."""

    label: str
    stat: Stat | None
    score: int | None
    why: str


@dataclass(frozen=True)
class Verdict:
    rule: str
    model: str
    outcome: str
    checks: tuple[Check, ...]
    reason: str


class Evidence:
    """One model's rows ``[chapter, quantity, value, lo, hi, n]``: the chapters'
    headlines (layers as ℓ/L) and the quantities :func:`~depthkit.verdicts.evidence` derives."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame[EVIDENCE_COLUMNS].reset_index(drop=True)

    def get(self, chapter: str, quantity: str) -> Stat | None:
        rows = self.frame[(self.frame["chapter"] == chapter) & (self.frame["quantity"] == quantity)]
        return None if rows.empty else Stat(*(float(rows.iloc[0][c]) for c in ("value", "lo", "hi", "n")))

    def labels(self, chapter: str, quantity: str) -> list[str]:
        """The ``x`` of every row ``"<quantity> (x)"`` of ``chapter``, in order."""
        q = self.frame.loc[self.frame["chapter"] == chapter, "quantity"]
        found = q[q.str.startswith(quantity + " (") & q.str.endswith(")")]
        return [s[len(quantity) + 2 : -1] for s in found]

    def has(self, chapter: str) -> bool:
        return bool((self.frame["chapter"] == chapter).any())


Test = Callable[[Evidence, Reference], list[Check]]


@dataclass(frozen=True)
class Rule:
    name: str
    chapter: str
    claim: str
    statistic: str
    conditions: str
    reference: Callable[[pd.DataFrame], Reference]
    test: Test
    # Headline quantities the rule reads ("{unit}": a check's task or direction):
    # chapter 07 marks them with the caveats of checks that fall short.
    reads: tuple[str, ...] = ()
