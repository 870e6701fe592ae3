"""Chapter 02's claims (multiple choice): the options are collected in the first
half, the answer is chosen later in the second, and the patching transition does
not line up with the lens's collection layer. Their tests, the paper's
references, and the per-task quantities derived from the chapter's saved run."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from depthkit.core.results import Run
from depthkit.stats import narrate
from depthkit.verdicts.quantities import (
    Q_ACCURACY,
    Q_AGREE,
    Q_BASELINE,
    Q_ONE_ANSWER,
    Q_ORDER,
    Q_PATCH_GAP,
    _boot,
    _paper,
    _share,
)
from depthkit.verdicts.records import Check, Evidence, Reference, Stat
from depthkit.verdicts.testability import _check, _lens_gate, _task_gate
from depthkit.verdicts.wording import _above, _ci, _excludes_zero, _has_interval, _layer_at


def _tasks(ev: Evidence) -> list[str]:
    return ev.labels("02", "MCQ options collected")


def _collected_first(ev: Evidence, ref: Reference) -> list[Check]:
    def check(task: str) -> Check:
        def score(s: Stat) -> tuple[int, str]:
            first = s.hi <= ref.value  # as printed too: rounding keeps the order
            return int(first) * 2, f"{task}: collected at {_layer_at(s)}" + ("" if first else ", not clearly in the first half")

        return _check(task, ev.get("02", f"MCQ options collected ({task})"), [_task_gate(ev, task)], score)

    return [check(t) for t in _tasks(ev)]


def _settled_later(ev: Evidence, ref: Reference) -> list[Check]:
    def check(task: str) -> Check:
        settled = ev.get("02", f"MCQ answer settled ({task})")
        collected = ev.get("02", f"MCQ options collected ({task})")
        # Layers here are ℓ/L, so the output row is 1. A side reached only there is
        # censored: the true difference is a bound, and with both there no order exists.
        censored = narrate.at_output(*(s.value if s else math.nan for s in (settled, collected)), n_blocks=1)
        both = "options collected and answer settled only at the output: no order can be measured" if censored == "both" else None

        def score(s: Stat) -> tuple[int, str]:
            least = "at least " if censored == "subject" else ""
            text = f"{task}: settled minus collected {least}{_ci(s)}, settled at {_layer_at(settled)}"
            if censored == "than":
                return 0, text + ": options collected only at the output, so no later answer can be shown"
            if not _above(s.lo, 0.0):
                return 0, text + ": not clearly later"
            second = settled is not None and _has_interval(settled) and settled.lo >= ref.value
            return (2, text) if second else (1, text + ", later but not clearly in the second half")

        # With both sides at the output the difference is no measurement: no value is shown.
        order = None if both else ev.get("02", f"{Q_ORDER} ({task})")
        return _check(task, order, [_task_gate(ev, task), both], score)

    return [check(t) for t in _tasks(ev)]


def _patching_apart(ev: Evidence, ref: Reference) -> list[Check]:
    def check(direction: str) -> Check:
        def score(s: Stat) -> tuple[int, str]:
            apart = _excludes_zero(s)
            return int(apart) * 2, f"{direction}: transition minus collection {_ci(s)}" + ("" if apart else ": no clear difference")

        target = direction.split(" → ")[-1]
        return _check(direction, ev.get("02", f"{Q_PATCH_GAP} ({direction})"), [_lens_gate(ev, "02", f" ({target})")], score)

    return [check(d) for d in ev.labels("02", Q_PATCH_GAP)]


def _ref_collected(paper: pd.DataFrame) -> Reference:
    r = _paper(paper, "MCQ options collected")
    return Reference(r["hi"], f"first half (ℓ/L ≤ {r['hi']:.2f}), {r['model']}")


def _ref_settled(paper: pd.DataFrame) -> Reference:
    r = _paper(paper, "MCQ answer settled")
    return Reference(r["lo"], f"after collection, in the second half (ℓ/L ≥ {r['lo']:.2f}), {r['model']}")


def _derive_02(run: Run, other: Callable[[str], Run | None]) -> list[tuple]:
    from depthkit.analyses import mcq
    from depthkit.chapters import ch02_mcq_collection_vs_reasoning as ch02

    L, boot = int(run.model["n_blocks"]), _boot(run)
    ranks, acc = run["option_ranks"], run["accuracy"].set_index("task")
    baseline = mcq.majority_baseline(run["prompts"])
    exits = run["early_exit"]
    rows: list[tuple] = []
    for task, a in acc.iterrows():
        rows += [(f"{Q_ACCURACY} ({task})", *_share(a["accuracy"] * a["n"], a["n"], run)),
                 (f"{Q_BASELINE} ({task})", float(baseline.get(task, np.nan)), np.nan, np.nan, a["n"]),
                 (f"{Q_ONE_ANSWER} ({task})", a["majority_share"], np.nan, np.nan, a["n"])]
        e = exits[(exits["task"] == task) & (exits["layer"] == L - 1)]
        if len(e):
            rows.append((f"{Q_AGREE} ({task})", *_share(e["agreement"].iloc[0] * e["n"].iloc[0], e["n"].iloc[0], run)))
        d = ch02.order_difference(ranks, task, **boot)
        rows.append((f"{Q_ORDER} ({task})", d.estimate / L, d.lo / L, d.hi / L, d.n))
    sweep = run["patching"]
    pt = run["patching_transitions"]
    for direction in pt.loc[pt["what"] == ch02.TRANSITION, "direction"]:
        target = direction.split(" → ")[1]
        if target in set(ranks["task"]):
            d = ch02.transition_difference(sweep[sweep["direction"] == direction], ranks, target, **boot)
            rows.append((f"{Q_PATCH_GAP} ({direction})", d.estimate / L, d.lo / L, d.hi / L, d.n))
    return rows
