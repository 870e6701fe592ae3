"""The book's verdicts on the paper's claims, with the rules declared once, before
any result is read.

Each :class:`Rule` names a claim, the statistic that tests it (a chapter's headline
row or a quantity computed here from the chapter's saved tables), the paper's value
it is compared with (from the chapters' reference rows, :func:`paper_reference`)
and its test. A test reads one model's :class:`Evidence` and returns one
:class:`Check` per unit it measures (the run, a task, a patching direction): a score
(2: as the paper says, 1: the direction only, 0: not shown) or, where the claim
cannot be tested on this model, none and why. A finding counts as shown only where
its interval excludes the comparison value (zero for a difference); a statistic
without an interval shows nothing.

Outcomes: ``reproduced`` (every testable unit scores 2), ``partly`` (some unit
scores at least 1), ``not reproduced`` (none does), ``not testable`` (no unit is
testable). Units are testable when they have :data:`depthkit.stats.MIN_N` units of
resampling and an interval; where the statistic reads the lens, the lens's top-1
agrees with the model at layer L−1 on at least :data:`LENS_FLOOR` of the chapter's
own prompts; and for a multiple-choice task, accuracy's interval clears the gold
majority baseline and no one answer is given to more than :data:`ONE_ANSWER_MAX` of
the prompts.

The modules: :mod:`~depthkit.verdicts.records` (the records),
:mod:`~depthkit.verdicts.quantities` (the evidence rows' names),
:mod:`~depthkit.verdicts.wording`, :mod:`~depthkit.verdicts.testability`, one
``chNN_claims`` module per chapter (its tests, references and derived quantities),
:mod:`~depthkit.verdicts.rules` (the rules and judging),
:mod:`~depthkit.verdicts.from_runs` (evidence from saved runs),
:mod:`~depthkit.verdicts.table` (findings, robustness, caveats) and
:mod:`~depthkit.verdicts.page` (the findings page). Every name is re-exported here.
"""

from __future__ import annotations

# Every name the one module held before the split, the chapter quantities it read
# included, stays an attribute here: the tests and chapter 07 reach them as ``vd.X``.
from depthkit.chapters import CHAPTERS, paper_reference, run_headlines  # noqa: F401
from depthkit.chapters.ch01_guess_then_refine import Q_EARLY_FLIP, Q_FINAL, Q_FLIP, Q_L1  # noqa: F401
from depthkit.chapters.ch02_mcq_collection_vs_reasoning import LENS_FLOOR, ONE_ANSWER_MAX  # noqa: F401
from depthkit.core import results as saved  # noqa: F401
from depthkit.core.files import atomic_write  # noqa: F401
from depthkit.core.results import ResultsError, Run, list_runs, load_run  # noqa: F401
from depthkit.stats import MIN_N, bootstrap_ci, unit_mean  # noqa: F401
from depthkit.verdicts.ch01_claims import (  # noqa: F401
    _derive_01,
    _frequent_early,
    _overturned,
    _ref_frequent,
    _ref_overturned,
)
from depthkit.verdicts.ch02_claims import (  # noqa: F401
    _collected_first,
    _derive_02,
    _patching_apart,
    _ref_collected,
    _ref_settled,
    _settled_later,
    _tasks,
)
from depthkit.verdicts.ch03_claims import _derive_03, _first_token_deepest, _ref_tokens  # noqa: F401
from depthkit.verdicts.ch04_claims import _ch00_agreement, _derive_04, _function_first, _ref_classes  # noqa: F401
from depthkit.verdicts.ch05_claims import _derive_05, _phase_change  # noqa: F401
from depthkit.verdicts.ch06_claims import _classes_06, _depth_gap, _derive_06, _ref_depth_gap  # noqa: F401
from depthkit.verdicts.from_runs import _READ_ERRORS, DERIVED, _runs, evidence  # noqa: F401
from depthkit.verdicts.page import FINDINGS_PAGE, _cell, _tally, findings_markdown, markdown_table, write_findings_page  # noqa: F401
from depthkit.verdicts.quantities import (  # noqa: F401
    Q_ACCURACY,
    Q_ADJUSTED,
    Q_AGREE,
    Q_BASELINE,
    Q_CLASS_GAP,
    Q_CLASS_TOKENS,
    Q_CLASSES,
    Q_DEPTH_GAP,
    Q_EDGE,
    Q_MATCHED,
    Q_ONE_ANSWER,
    Q_ORDER,
    Q_PATCH_GAP,
    Q_SLOPE,
    Q_TOKEN_GAP,
    _boot,
    _paper,
    _ref_words,
    _rows,
    _share,
)
from depthkit.verdicts.records import (  # noqa: F401
    EVIDENCE_COLUMNS,
    OUTCOMES,
    Check,
    Evidence,
    Reference,
    Rule,
    Stat,
    Test,
    Verdict,
)
from depthkit.verdicts.rules import RULES, _reason, judge, outcome, rules_table  # noqa: F401
from depthkit.verdicts.table import (  # noqa: F401
    CAVEAT_COLUMNS,
    FINDINGS_COLUMNS,
    ROBUSTNESS_DIR,
    VARIANT_PARAMS,
    Finding,
    _robustness,
    _variant,
    as_table,
    caveats,
    findings,
    findings_table,
    robustness_roots,
)
from depthkit.verdicts.testability import _LENS, _TASK, _check, _lens_gate, _task_gate, _untestable  # noqa: F401
from depthkit.verdicts.wording import _ci, _has_interval, _layer_at, _values, value_text  # noqa: F401

__all__ = [
    "OUTCOMES", "RULES", "Check", "Evidence", "Finding", "Reference", "Rule", "Stat", "Verdict", "as_table", "caveats",
    "evidence", "findings", "findings_markdown", "findings_table", "judge", "outcome", "robustness_roots", "rules_table",
    "value_text", "write_findings_page",
]
