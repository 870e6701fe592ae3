"""Chapter 02's test of the paper's two-stage claim, task by task: whether this run
can test it at all (enough units, accuracy above the majority baseline, no single
dominant answer, a lens that agrees with the model), and the prose per task."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from depthkit import stats
from depthkit.analyses import mcq
from depthkit.chapters.ch02_layers import (
    COLLECT_LEVEL,
    DECIDE_LEVEL,
    _est_layer,
    clears_baseline,
    demo_note,
    order_difference,
    share_ci,
)
from depthkit.stats import narrate
from depthkit.stats.narrate import at_output

# Testability of the two-stage claim on one task (the gates depthkit.verdicts applies):
# above ONE_ANSWER_MAX of the prompts getting one answer, a "settled" layer marks where
# that answer takes the lead, not where the task is solved; below LENS_FLOOR agreement
# with the model one layer before the output, the lens reads something other than what
# the model is about to say.
ONE_ANSWER_MAX = 0.8
LENS_FLOOR = 0.5
CLAIM = "the paper's two-stage claim (options collected in the first half, the answer chosen later)"


def _answer_name(prompts: pd.DataFrame, task: str, answer: int) -> str:
    opts = prompts.loc[prompts["task"] == task, "options"].map(tuple)
    return f"option {opts.iloc[0][answer].strip()!r}" if opts.nunique() == 1 else f"option {answer + 1} of the list"


def testability(est: pd.DataFrame, acc: pd.DataFrame, prompts: pd.DataFrame, *, exits: pd.DataFrame | None = None,
                n_blocks: int | None = None, n_boot: int, seed: int) -> pd.DataFrame:
    """Per task, whether this run can test :data:`CLAIM`, and why not (``why``, reasons
    joined by "; "): too few prompts or demonstration sets for an interval; accuracy's
    interval not above the gold majority baseline; one answer to more than
    :data:`ONE_ANSWER_MAX` of the prompts; options never collected; and, where
    ``exits`` are given, the lens agreeing with the model at layer L−1 on fewer than
    :data:`LENS_FLOOR` of the prompts."""
    baseline = mcq.majority_baseline(prompts)
    acc = acc.set_index("task")
    rows = []
    for r in est.itertuples():
        a = acc.loc[r.task]
        n = int(a.n)
        ci = share_ci(a.accuracy, n, n_boot=n_boot, seed=seed)
        base = float(baseline.get(r.task, np.nan))
        sets = int(getattr(r, "demo_sets", 0) or 0)
        units, unit = (sets, "demonstration sets") if sets > 1 else (n, "prompts")
        agree = math.nan
        if exits is not None and n_blocks is not None:
            e = exits[(exits["task"] == r.task) & (exits["layer"] == n_blocks - 1)]
            agree = float(e["agreement"].iloc[0]) if len(e) else math.nan
        why = []
        if units < stats.MIN_N:
            why.append(f"only {units} {unit} kept, fewer than {stats.MIN_N}, so nothing here has an interval")
        elif not clears_baseline(ci, base):
            why.append(f"accuracy {narrate.share(*ci[:3], digits=0)} does not clear the majority baseline of {base:.0%} "
                       "(always giving the most frequent gold answer)")
        if a.majority_share > ONE_ANSWER_MAX:
            why.append(f"the model gives one answer ({_answer_name(prompts, r.task, int(a.majority_answer))}) to "
                       f"{a.majority_share:.1%} of the prompts, more than {ONE_ANSWER_MAX:.0%}, so a 'settled' layer marks where "
                       "that answer takes the lead, not where the task is solved")
        if not np.isfinite(r.collection_layer):
            why.append("the options never all sit in the top-|O|, so there is no collection layer")
        if np.isfinite(agree) and agree < LENS_FLOOR:
            why.append(f"the lens agrees with the model at layer L−1 on {agree:.0%} of the prompts, below {LENS_FLOOR:.0%}")
        rows.append({"task": r.task, "n": n, "units": units, "accuracy": a.accuracy, "accuracy_lo": ci.lo, "accuracy_hi": ci.hi,
                     "majority_baseline": base, "one_answer_share": float(a.majority_share), "lens_agreement_L-1": agree,
                     "testable": not why, "why": "; ".join(why)})
    return pd.DataFrame(rows)


def _names(tasks: list[str]) -> str:
    return ", ".join(tasks[:-1]) + (" and " if len(tasks) > 1 else "") + tasks[-1]


def layer_summary(est: pd.DataFrame, acc: pd.DataFrame, prompts: pd.DataFrame, ranks: pd.DataFrame, n_blocks: int, *,
                  exits: pd.DataFrame | None = None, n_boot: int, seed: int) -> str:
    """Per task: whether the run can test :data:`CLAIM` (:func:`testability`), saying
    plainly why not where it cannot; where the options are collected and where the
    answer settles; and the order of the two, stated only on a testable task."""
    tb = testability(est, acc, prompts, exits=exits, n_blocks=n_blocks, n_boot=n_boot, seed=seed).set_index("task")
    lines, unordered = [], []
    for r in est.itertuples():
        a, t = acc.set_index("task").loc[r.task], tb.loc[r.task]
        half = ("first half; " if r.collection_layer <= n_blocks / 2 else "second half; ") if np.isfinite(r.collection_layer) else ""
        if np.isfinite(r.collection_lo) and r.collection_lo <= n_blocks / 2 < r.collection_hi:
            half = half.replace(";", ", but its interval reaches into both halves;")
        layers = (f"options collected at {_est_layer(r, 'collection', n_blocks)} ({half}peak share {r.peak_collected_share:.0%} "
                  f"at layer {r.peak_layer}); answer settled at {_est_layer(r, 'decision', n_blocks)}")
        if t.testable:
            order = ""
            # which of the two layers is reached only at the output row (a bound, not a value)
            censored = at_output(r.decision_layer, r.collection_layer, n_blocks)
            if np.isfinite(r.collection_layer) and np.isfinite(r.decision_layer):
                # Both at the output: no order to measure, so no bootstrap to run.
                d = order_difference(ranks, r.task, n_boot=n_boot, seed=seed) if censored != "both" else None
                order = " — " + narrate.difference(d.estimate if d else np.nan, d.lo if d else np.nan, d.hi if d else np.nan,
                                                   more="later", less="earlier", subject="settled answers",
                                                   than="collected options", step=getattr(r, "step", None), censored=censored)
            if censored == "both":
                unordered.append(r.task)
                verdict = f"**passes the conditions, but no order can be measured**: {layers}{order}."
            else:
                verdict = f"**testable**: {layers}{order}."
        else:
            verdict = (f"**not testable on this model**: {CLAIM} cannot be tested on {r.task}, because {t.why}. "
                       f"Measured all the same, without a reading as stages: {layers}.")
        lines.append(
            f"* **{r.task}** (n = {r.n}, {demo_note(r)}; accuracy {narrate.share(t.accuracy, t.accuracy_lo, t.accuracy_hi, digits=0)}, "
            f"majority baseline {t.majority_baseline:.0%}, most frequent answer given to {t.one_answer_share:.1%}, "
            f"top-1 is an option for {a.top1_option:.0%}): {verdict}"
        )
    ok = [t for t in tb.index[tb["testable"].astype(bool)] if t not in unordered]
    count = (f"{CLAIM[0].upper()}{CLAIM[1:]} is testable on {len(ok)} of {len(tb)} tasks"
             + (f" ({', '.join(ok)})." if ok else ": on this model no task tests it, and no layer below is a finding about it."))
    if unordered:
        count += (f" {_names(unordered)} {'passes' if len(unordered) == 1 else 'pass'} the conditions, but there both the options "
                  "and the answer are reached only at the output, so no order between them can be measured.")
    return (
        f"Collection layer: the first layer where the share of prompts with every option in the top-|O| reaches "
        f"{COLLECT_LEVEL:.0%} of its peak. Decision layer: the first layer from which at least {DECIDE_LEVEL:.0%} of prompts "
        "already have the final answer as their most probable option. A task tests the claim only if accuracy's interval "
        f"clears its majority baseline, no answer is given to more than {ONE_ANSWER_MAX:.0%} of the prompts"
        + (f", the lens agrees with the model at layer L−1 on at least {LENS_FLOOR:.0%} of them" if exits is not None else "")
        + f" and there are at least {stats.MIN_N} prompts (or demonstration sets) to resample.\n\n{count}\n\n" + "\n".join(lines)
    )
