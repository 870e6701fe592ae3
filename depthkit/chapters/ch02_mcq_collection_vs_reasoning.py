"""Chapter 02 (multiple choice: collecting options, then choosing): the chapter's
computations beyond the analysis modules (:mod:`depthkit.analyses.mcq`,
:mod:`depthkit.analyses.patching`, :mod:`depthkit.analyses.early_exit`), its generated prose, its
headline quantities and the paper's reference rows."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from depthkit import stats
from depthkit.analyses import early_exit, mcq, patching
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.lens.trajectories import encode
from depthkit.stats import narrate

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

# Thresholds of mcq.layer_estimates' defaults, repeated where the prose names them.
COLLECT_LEVEL, DECIDE_LEVEL = 0.5, 0.9
# Testability of the two-stage claim on one task (the gates depthkit.verdicts applies):
# above ONE_ANSWER_MAX of the prompts getting one answer, a "settled" layer marks where
# that answer takes the lead, not where the task is solved; below LENS_FLOOR agreement
# with the model one layer before the output, the lens reads something other than what
# the model is about to say.
ONE_ANSWER_MAX = 0.8
LENS_FLOOR = 0.5
CLAIM = "the paper's two-stage claim (options collected in the first half, the answer chosen later)"
TRANSITION = "patching transition"
FOLLOWS = "follows source's answer"

# The paper gives halves of the depth for all four models, not layers.
PAPER = pd.DataFrame(
    [
        ("MCQ options collected", "all four models", math.nan, 0.0, 0.5),
        ("MCQ answer settled", "all four models", math.nan, 0.5, 1.0),
    ],
    columns=PAPER_COLUMNS,
)


def model_note(info: Any, lens_name: str, convention: str) -> str:
    return narrate.model_note(info, lens_name, convention)


# Extra questions drawn for written-out options, of which a few may be dropped
# (options sharing a first token) before ``n_examples`` are kept.
SPARE = 1.1


def task_prompts(model: Model, task: str, p: Mapping[str, Any], *, labels: str | None = None, permute: bool = False) -> pd.DataFrame:
    """``n_examples`` prompts of one task with their option ids. Questions whose
    options share a first token (possible with written-out options) are dropped and
    replaced from spare draws; ``attrs["dropped_shared_first_token"]`` counts them."""
    n = int(p["n_examples"])
    frame = mcq.build_prompts(task, math.ceil(n * SPARE), shots=p["shots"], labels=labels or p["option_labels"], seed=p["seed"], permute=permute)
    frame = mcq.add_option_ids(model, frame, drop_shared=True)
    dropped = frame.attrs["dropped_shared_first_token"]
    if len(frame) > n:
        frame = frame.sample(n, random_state=p["seed"]).sort_index().reset_index(drop=True)
    frame.attrs["dropped_shared_first_token"] = dropped
    return frame


def all_prompts(model: Model, p: Mapping[str, Any]) -> pd.DataFrame:
    frames = [task_prompts(model, t, p) for t in p["tasks"]]
    if p["dataset"]:
        frames.append(mcq.add_option_ids(model, mcq.load_mcq_file(p["dataset"])))
    out = pd.concat(frames, ignore_index=True)
    out.attrs["dropped_shared_first_token"] = {k: v for f in frames for k, v in f.attrs.get("dropped_shared_first_token", {}).items()}
    return out


def prompt_summary(model: Model, prompts: pd.DataFrame) -> pd.DataFrame:
    """Prompts per task, their mean length in tokens, the majority baseline and the
    questions dropped (and replaced) because two options shared a first token."""
    n_tokens = prompts["prompt"].map(lambda s: len(encode(model, s)))
    out = prompts.assign(tokens=n_tokens).groupby("task", sort=False).agg(prompts=("prompt", "size"), mean_tokens=("tokens", "mean")).round(0)
    out["majority_baseline"] = mcq.majority_baseline(prompts).round(3)
    dropped = prompts.attrs.get("dropped_shared_first_token", {})
    out["dropped_shared_first_token"] = [int(dropped.get(t, 0)) for t in out.index]
    return out


def share_ci(share: float, n: int, *, n_boot: int, seed: int) -> stats.CI:
    """A share of ``n`` prompts with its interval: the share is a mean of one yes/no
    per prompt, so those are rebuilt and resampled as the units (exact binomial
    bounds at 0/n and n/n)."""
    k = int(round(share * n))
    return stats.bootstrap_ci(np.arange(int(n)) < k, n_boot=n_boot, seed=seed)


def _matrices(ranks: pd.DataFrame, task: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g = mcq.per_item(ranks[ranks["task"] == task])
    coll = g.pivot(index="item", columns="layer", values="collected").sort_index(axis=1)
    agree = g.pivot(index="item", columns="layer", values="agrees_final").sort_index(axis=1)
    return coll.columns.to_numpy(), coll.to_numpy(dtype=float), agree.to_numpy(dtype=float)


def _collection(cm: np.ndarray, layers: np.ndarray) -> float:
    curve = cm.mean(0)
    return math.nan if curve.max() <= 0 else mcq.first_layer_reaching(curve, layers, COLLECT_LEVEL * curve.max(), stay=False)


def _decision(am: np.ndarray, layers: np.ndarray) -> float:
    return mcq.first_layer_reaching(am.mean(0), layers, DECIDE_LEVEL, stay=True)


def _units(ranks: pd.DataFrame, task: str) -> np.ndarray | None:
    """The demonstration set of each prompt of ``task`` where there are several (the
    unit every interval of the task resamples), else None (prompts)."""
    items = pd.Index(np.sort(ranks.loc[ranks["task"] == task, "item"].unique()))
    return mcq._demo_units(ranks, items)[0]


def order_difference(ranks: pd.DataFrame, task: str, *, n_boot: int, seed: int) -> stats.CI:
    """Decision minus collection layer of one task. Both come from the same prompts,
    so a resample draws prompts (or demonstration sets) once for both layers."""
    layers, cm, am = _matrices(ranks, task)
    idx = np.arange(len(cm), dtype=float)
    return stats.bootstrap_ci(idx, stat=lambda i: _decision(am[i.astype(int)], layers) - _collection(cm[i.astype(int)], layers),
                              n_boot=n_boot, seed=seed, dropna=False, units=_units(ranks, task))


def transition_difference(sweep: pd.DataFrame, ranks: pd.DataFrame, task: str, *, n_boot: int, seed: int) -> stats.CI:
    """Patching transition minus the lens's collection layer of the target task.
    Pair j patches into the target task's prompt j, which is also lens prompt j: a
    resample draws the target prompts (or their demonstration sets) once, and a drawn
    prompt brings its pair along, so the shared prompts are not counted as two
    independent samples. ``n``: the fewer of pairs and resampled units; no interval
    below MIN_N."""
    wide = sweep.pivot(index="pair", columns="layer", values="class").sort_index(axis=1)
    p_layers, to_m, ag_m = wide.columns.to_numpy(), (wide.to_numpy() == "source-option").astype(float), (wide.to_numpy() == "target-option").astype(float)
    layers, cm, _ = _matrices(ranks, task)

    def stat(i: np.ndarray) -> float:
        i = i.astype(int)
        pairs = i[i < len(wide)]
        if not len(pairs):
            return math.nan
        return patching._transition_from_matrix(to_m[pairs], ag_m[pairs], p_layers) - _collection(cm[i], layers)

    ci = stats.bootstrap_ci(np.arange(len(cm), dtype=float), stat=stat, n_boot=n_boot, seed=seed, dropna=False,
                            units=_units(ranks, task))
    n = min(len(wide), ci.n)
    return stats.CI(ci.estimate, ci.lo, ci.hi, n) if n >= stats.MIN_N else stats.CI(ci.estimate, math.nan, math.nan, n)


def _layer(v: float, lo: float, hi: float, n_blocks: int, missing: str = "not reached", **grid: float) -> str:
    """``narrate.layer`` of a layer column; ``grid``: its ``mode_share``,
    ``censored_share`` and ``step`` where the run saved them."""
    clean = {k: float(x) for k, x in grid.items() if x is not None and np.isfinite(x)}
    return missing if not np.isfinite(v) else narrate.layer(v, lo, hi, n_blocks=n_blocks, **clean)


def _est_layer(r: Any, what: str, n_blocks: int, missing: str = "not reached") -> str:
    """The collection or decision layer (``what``) of a row of ``layer_estimates``."""
    extra = {k: getattr(r, f"{what}_{k}", None) for k in ("mode_share", "censored_share")}
    return _layer(getattr(r, f"{what}_layer"), getattr(r, f"{what}_lo"), getattr(r, f"{what}_hi"), n_blocks, missing,
                  step=getattr(r, "step", None), **extra)


def demo_note(r: Any) -> str:
    """Which unit the task's intervals resample: demonstration sets where there are
    several; where all prompts share one set the intervals say nothing about another
    set of demonstrations."""
    sets = int(getattr(r, "demo_sets", 0) or 0)
    if sets > 1:
        return f"intervals resample its {sets} demonstration sets"
    if sets == 1:
        return "every prompt shares one set of demonstrations, so intervals cover prompt variation only"
    return "intervals resample prompts"


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
        elif not (np.isfinite(ci.lo) and ci.lo > base):
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


def layer_summary(est: pd.DataFrame, acc: pd.DataFrame, prompts: pd.DataFrame, ranks: pd.DataFrame, n_blocks: int, *,
                  exits: pd.DataFrame | None = None, n_boot: int, seed: int) -> str:
    """Per task: whether the run can test :data:`CLAIM` (:func:`testability`), saying
    plainly why not where it cannot; where the options are collected and where the
    answer settles; and the order of the two, stated only on a testable task."""
    tb = testability(est, acc, prompts, exits=exits, n_blocks=n_blocks, n_boot=n_boot, seed=seed).set_index("task")
    lines = []
    for r in est.itertuples():
        a, t = acc.set_index("task").loc[r.task], tb.loc[r.task]
        half = ("first half; " if r.collection_layer <= n_blocks / 2 else "second half; ") if np.isfinite(r.collection_layer) else ""
        if np.isfinite(r.collection_lo) and r.collection_lo <= n_blocks / 2 < r.collection_hi:
            half = half.replace(";", ", but its interval reaches into both halves;")
        layers = (f"options collected at {_est_layer(r, 'collection', n_blocks)} ({half}peak share {r.peak_collected_share:.0%} "
                  f"at layer {r.peak_layer}); answer settled at {_est_layer(r, 'decision', n_blocks)}")
        if t.testable:
            order = ""
            if np.isfinite(r.collection_layer) and np.isfinite(r.decision_layer):
                d = order_difference(ranks, r.task, n_boot=n_boot, seed=seed)
                order = " — " + narrate.difference(d.estimate, d.lo, d.hi, more="later", less="earlier", subject="settled answers",
                                                   than="collected options")
            verdict = f"**testable**: {layers}{order}."
        else:
            verdict = (f"**not testable on this model**: {CLAIM} cannot be tested on {r.task}, because {t.why}. "
                       f"Measured all the same, without a reading as stages: {layers}.")
        lines.append(
            f"* **{r.task}** (n = {r.n}, {demo_note(r)}; accuracy {narrate.share(t.accuracy, t.accuracy_lo, t.accuracy_hi, digits=0)}, "
            f"majority baseline {t.majority_baseline:.0%}, most frequent answer given to {t.one_answer_share:.1%}, "
            f"top-1 is an option for {a.top1_option:.0%}): {verdict}"
        )
    ok = list(tb.index[tb["testable"].astype(bool)])
    count = (f"{CLAIM[0].upper()}{CLAIM[1:]} is testable on {len(ok)} of {len(tb)} tasks"
             + (f" ({', '.join(ok)})." if ok else ": on this model no task tests it, and no layer below is a finding about it."))
    return (
        f"Collection layer: the first layer where the share of prompts with every option in the top-|O| reaches "
        f"{COLLECT_LEVEL:.0%} of its peak. Decision layer: the first layer from which at least {DECIDE_LEVEL:.0%} of prompts "
        "already have the final answer as their most probable option. A task tests the claim only if accuracy's interval "
        f"clears its majority baseline, no answer is given to more than {ONE_ANSWER_MAX:.0%} of the prompts"
        + (f", the lens agrees with the model at layer L−1 on at least {LENS_FLOOR:.0%} of them" if exits is not None else "")
        + f" and there are at least {stats.MIN_N} prompts (or demonstration sets) to resample.\n\n{count}\n\n" + "\n".join(lines)
    )


def controls(model: Model, prompts: pd.DataFrame, ranks: pd.DataFrame, lens, p: Mapping[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(shares, layer estimates, accuracy) of the control task with its original,
    relabelled and permuted options, each with a ``variant`` column (the accuracy also
    with the variant's gold ``majority_baseline``)."""
    task = p["control_task"]
    in_run = task in p["tasks"]
    variants = {"original": prompts[prompts["task"] == task] if in_run else task_prompts(model, task, p)}
    for c in p["controls"]:
        # Permuting GLUE's verbalisers would change their meaning; letters can move.
        labels = "symbols" if c == "symbols" else ("letters" if p["option_labels"] == "default" and task != "mmlu" else p["option_labels"])
        variants[c] = task_prompts(model, task, p, labels=labels, permute=c == "permuted")
    out: tuple[list, list, list] = ([], [], [])
    for name, frame in variants.items():
        r = (ranks[ranks["task"] == task] if name == "original" and in_run
             else mcq.option_ranks(model, frame.reset_index(drop=True), lens=lens, convention=p["convention"]))
        out[0].append(mcq.collection_reasoning(r).assign(variant=name))
        out[1].append(mcq.layer_estimates(r, n_boot=p["n_boot"], seed=p["seed"]).assign(variant=name))
        base = float(mcq.majority_baseline(frame).get(task, np.nan))
        out[2].append(mcq.accuracy(r).assign(variant=name, majority_baseline=base))
    shares, est, acc = (pd.concat(x, ignore_index=True) for x in out)
    return shares, est, acc


def control_table(est: pd.DataFrame, acc: pd.DataFrame) -> pd.DataFrame:
    cols = ["variant", "collection_layer", "collection_lo", "collection_hi", "peak_collected_share", "decision_layer", "accuracy"]
    return est.merge(acc[["variant", "accuracy"]], on="variant")[cols].round(2)


def _control_accuracy(a: pd.Series, *, n_boot: int, seed: int) -> tuple[str, bool]:
    """A variant's accuracy in words against its majority baseline, and whether its
    interval clears that baseline."""
    ci = share_ci(float(a["accuracy"]), int(a["n"]), n_boot=n_boot, seed=seed)
    base = float(a.get("majority_baseline", np.nan))
    above = bool(np.isfinite(ci.lo) and np.isfinite(base) and ci.lo > base)
    words = narrate.share(*ci[:3], digits=0) + (f" against a majority baseline of {base:.0%}" if np.isfinite(base) else "")
    return words, above


def symbol_reading(est: pd.DataFrame, acc: pd.DataFrame, n_blocks: int, *, n_boot: int, seed: int) -> str:
    """What the rare-symbol control says, read from its numbers: whether options
    relabelled with rare symbols are still collected, and whether the model can use
    the symbols at all (accuracy against the baseline, how often its top-1 token is a
    symbol). "" when the run has no symbol control."""
    ce, ca = est.set_index("variant"), acc.set_index("variant")
    if "symbols" not in ce.index or "original" not in ce.index:
        return ""
    s, o = ce.loc["symbols"], ce.loc["original"]
    s_words, s_above = _control_accuracy(ca.loc["symbols"], n_boot=n_boot, seed=seed)
    o_words, o_above = _control_accuracy(ca.loc["original"], n_boot=n_boot, seed=seed)
    top1 = float(ca.loc["symbols"].get("top1_option", np.nan))
    shown = f"; the model's own top-1 token is one of the symbols for {top1:.0%} of prompts" if np.isfinite(top1) else ""
    if not np.isfinite(o.collection_layer):
        return ("**Reading the control:** even with the original labels the options are never all in the top-|O|, so the "
                "relabelled options have nothing to be compared with: the control says nothing here.")
    if not np.isfinite(s.collection_layer):
        text = (f"**Reading the control:** with the original labels the options all reach the top-|O| (for up to "
                f"{o.peak_collected_share:.0%} of prompts); relabelled with rare symbols they never do, at any layer (peak "
                f"{s.peak_collected_share:.0%}). On this model the collection measure therefore finds options only when their "
                "label tokens are ordinary, frequent tokens.")
        if s_above:
            return text + (f" Yet the model chooses among the symbols better than its baseline (accuracy {s_words}{shown}): it "
                           "uses options that the lens never places all in the top-|O|, so 'collection' as measured here tracks "
                           "frequent label tokens rather than recognised options.")
        both = ("" if o_above else f" With the original labels accuracy ({o_words}) does not clear its baseline either, so "
                "neither variant shows the options being used.")
        return text + (f" Nor does the run show the model mapping the symbols onto the options (accuracy {s_words}{shown}, "
                       "not clearly above its baseline), so the "
                       "control cannot separate the two readings of the original labels' collection — options recognised from "
                       "the prompt, or frequent label tokens ranked high whatever the prompt: with symbols both predict no "
                       "collection." + both)
    text = (f"**Reading the control:** relabelled with rare symbols, all options still reach the top-|O| for up to "
            f"{s.peak_collected_share:.0%} of prompts (original {o.peak_collected_share:.0%}), with a collection layer at "
            f"{_est_layer(s, 'collection', n_blocks)} (original {_est_layer(o, 'collection', n_blocks)}): the measure can find "
            "options whose tokens are not frequent ones. Whether the symbols are collected later is not tested here (the two "
            "variants have no paired interval).")
    if not s_above:
        text += (f" The model does not choose among the symbols better than its baseline, though (accuracy {s_words}{shown}): "
                 "the symbols are gathered without being used to answer.")
    return text


def control_summary(est: pd.DataFrame, acc: pd.DataFrame, task: str, n_blocks: int, *, n_boot: int, seed: int) -> str:
    ce, ca = est.set_index("variant"), acc.set_index("variant")
    o = ce.loc["original"]

    def coll(r: pd.Series) -> str:
        return _est_layer(r, "collection", n_blocks, "never reached")

    def settled(r: pd.Series) -> str:
        return _est_layer(r, "decision", n_blocks)

    def accuracy(v: str) -> str:
        return _control_accuracy(ca.loc[v], n_boot=n_boot, seed=seed)[0]

    parts = [
        f"with **{v}** options — collection layer: {coll(ce.loc[v])}, original: {coll(o)}; "
        f"peak share of prompts with all options in the top-|O| {ce.loc[v, 'peak_collected_share']:.0%} "
        f"(original {o.peak_collected_share:.0%}); decision layer: {settled(ce.loc[v])}, original: {settled(o)}; "
        f"accuracy {accuracy(v)} (original {accuracy('original')})"
        for v in ce.index.drop("original")
    ]
    if not parts:
        return "No controls were requested."
    reading = symbol_reading(est, acc, n_blocks, n_boot=n_boot, seed=seed)
    return f"On {task}: " + "; ".join(parts) + "." + (f"\n\n{reading}" if reading else "")


def patching_sweeps(model: Model, prompts: pd.DataFrame, p: Mapping[str, Any], n_blocks: int) -> pd.DataFrame:
    """Patching in both directions between the two tasks, and the random-source
    control within ``patch_control``; one row per (direction, pair, layer)."""
    def frame(task: str) -> pd.DataFrame:
        f = prompts[prompts["task"] == task]
        return (f if len(f) else task_prompts(model, task, p)).head(p["n_pairs"])

    layers = sorted(set(range(0, n_blocks + 1, p["patch_layer_step"])) | {n_blocks})
    src, tgt = frame(p["patch_source"]), frame(p["patch_target"])
    # A user's file may hold fewer prompts than n_pairs: pair as many as both tasks have.
    src, tgt = src.head(len(tgt)), tgt.head(len(src))
    sweeps = []
    for (a, b), (fa, fb) in (((p["patch_source"], p["patch_target"]), (src, tgt)), ((p["patch_target"], p["patch_source"]), (tgt, src))):
        sw = patching.patching_sweep(model, list(fa["prompt"]), list(fb["prompt"]), target_options=list(fb["option_ids"]),
                                     source_options=list(fa["option_ids"]), layers=layers)
        sweeps.append(sw.assign(direction=f"{a} → {b}", control=False))
    pc = frame(p["patch_control"])
    # The control pairs prompts whose *model* answers differ: with the same answer,
    # following the source could not be told from keeping the target's own.
    answers = patching.final_tokens(model, list(pc["prompt"]))
    if len(np.unique(answers)) > 1:
        perm = patching.different_answer_sources(answers, seed=p["seed"])
        ctrl = patching.patching_sweep(model, list(pc["prompt"].iloc[perm]), list(pc["prompt"]), target_options=list(pc["option_ids"]),
                                       source_options=list(pc["option_ids"].iloc[perm]), layers=layers)
        sweeps.append(ctrl.assign(direction=control_direction(p), control=True))
    out = pd.concat(sweeps, ignore_index=True)
    out.attrs["control_answers"] = {"task": p["patch_control"], "n": len(answers), "distinct": int(len(np.unique(answers)))}
    return out


def control_direction(p: Mapping[str, Any]) -> str:
    return f"random {p['patch_control']} → {p['patch_control']}"


def transitions(sweep: pd.DataFrame, est: pd.DataFrame, *, n_boot: int, seed: int) -> pd.DataFrame:
    """Per direction: the patching transition and, beside it, the lens's collection
    layer of the target task; for the control, where the output follows the source."""
    rows = []
    for d, g in sweep[~sweep.control].groupby("direction", sort=False):
        tgt = d.split(" → ")[1]
        rows.append({"direction": d, "what": TRANSITION, **patching.transition_layer(g, n_boot=n_boot, seed=seed)})
        e = est.set_index("task")["collection_layer"].get(tgt, np.nan)
        rows.append({"direction": d, "what": f"lens collection layer ({tgt})", "transition_layer": e, "lo": np.nan, "hi": np.nan, "n_pairs": np.nan})
    c = sweep[sweep.control]
    if len(c):
        ctl = patching.transition_layer(c, column="follows", to="source", against="target", n_boot=n_boot, seed=seed)
        rows.append({"direction": c["direction"].iloc[0], "what": FOLLOWS, **ctl})
    return pd.DataFrame(rows).astype({"n_pairs": "float64"})


def class_shares(sweep: pd.DataFrame) -> pd.DataFrame:
    return pd.concat([patching.class_shares(g).assign(direction=d) for d, g in sweep[~sweep.control].groupby("direction", sort=False)], ignore_index=True)


def transition_marks(tr: pd.DataFrame) -> pd.DataFrame:
    marks = tr[tr["what"] != FOLLOWS].rename(columns={"transition_layer": "layer"})[["direction", "what", "layer"]]
    return marks.assign(what=marks["what"].str.replace(r" \(.*\)", "", regex=True))


def _tr_layer(t: pd.Series, n_blocks: int, missing: str = "not reached") -> str:
    return _layer(t.transition_layer, t.lo, t.hi, n_blocks, missing, **{k: t.get(k) for k in ("mode_share", "censored_share", "step")})


def patching_summary(tr: pd.DataFrame, sweep: pd.DataFrame, ranks: pd.DataFrame, n_blocks: int, *, n_boot: int, seed: int) -> str:
    tt = tr.set_index(["direction", "what"])
    txt = []
    for d in tr.loc[tr["what"] == TRANSITION, "direction"]:
        t = tt.loc[(d, TRANSITION)]
        tgt = d.split(" → ")[1]
        col = tt.loc[(d, f"lens collection layer ({tgt})"), "transition_layer"]
        gap = ""
        if np.isfinite(col) and np.isfinite(t.transition_layer):
            ci = transition_difference(sweep[sweep["direction"] == d], ranks, tgt, n_boot=n_boot, seed=seed)
            gap = "; " + narrate.difference(ci.estimate, ci.lo, ci.hi, more="later", less="earlier", subject="patching transitions",
                                            than=f"the lens's collection layer for {tgt} (layer {col:.0f})", digits=0)
        txt.append(f"* **{d}**: source options take over at {_tr_layer(t, n_blocks, 'no stable transition')}{gap}.")
    answers = sweep.attrs.get("control_answers", {})
    if not (tr["what"] == FOLLOWS).any():
        task = answers.get("task", "the control task")
        txt.append(f"* **control** (a random other {task} prompt whose answer differs, {task} target): cannot be measured here: "
                   f"the model gives the same answer to all {answers.get('n', 'the')} {task} prompts, so no pair has different answers.")
    else:
        c = tr[tr["what"] == FOLLOWS].iloc[0]
        task = c.direction.split(" → ")[1]
        follows = ("the output never stably follows the source's answer rather than the target's own" if not np.isfinite(c.transition_layer)
                   else f"the output follows the source's answer rather than the target's own from {_tr_layer(c, n_blocks)}")
        txt.append(f"* **control** (a random other {task} prompt whose answer differs as source, {task} target; "
                   f"{int(c.n_pairs)} pairs): {follows}.")
    return ("\n".join(txt) + "\n\nThe paper found, for Llama-3-8B, that the patching transition and the lens's collection layer do not line up; "
            "the lines above say whether they do here.")


def early_exits(trajs: Mapping[str, Any], model: Model | None = None, prompts: pd.DataFrame | None = None, lens=None) -> pd.DataFrame:
    """Every task's early-exit table. An exit after ℓ blocks reads that residual with
    translator ℓ (the canonical convention), so trajectories read in the authors'
    convention are read again canonically, from ``model``, ``prompts`` and ``lens``."""
    if any(tr.convention != "canonical" for tr in trajs.values()):
        if model is None or prompts is None:
            raise ValueError("These trajectories are not in the canonical convention; pass model, prompts and lens to read the exits.")
        _, trajs = mcq.option_ranks(model, prompts, lens=lens, convention="canonical", return_trajectories=True)

    def options(tr) -> list[str]:
        return sorted([t for t in tr.targets["target"].unique() if t.startswith("opt")], key=lambda s: int(s[3:]))

    return pd.concat([early_exit.early_exit_table(tr, gold="gold", options=options(tr)).assign(task=t) for t, tr in trajs.items()], ignore_index=True)


def early_exit_summary(exits: pd.DataFrame, n_blocks: int, *, n_boot: int, seed: int) -> str:
    lines = []
    for t, g in exits.groupby("task", sort=False):
        g = g.set_index("layer")
        first = mcq.first_layer_reaching(g["choice_agreement"].to_numpy(), g.index.to_numpy(), DECIDE_LEVEL, stay=True)
        n, half = int(g.loc[n_blocks, "n"]), n_blocks // 2

        def share(layer: int, col: str) -> str:
            return narrate.share(*share_ci(g.loc[layer, col], n, n_boot=n_boot, seed=seed)[:3], digits=0)

        reach = ("never agrees with the full model's for 90% of prompts before the output" if not np.isfinite(first) or first >= n_blocks
                 else f"agrees with the full model's for at least 90% of prompts from layer {int(first)} on "
                      f"({g.loc[int(first), 'compute_fraction']:.0%} of the blocks)")
        lines.append(
            f"* **{t}**: the exit's chosen option {reach}. Option accuracy: {share(half, 'choice_accuracy')} at half depth, "
            f"{share(n_blocks, 'choice_accuracy')} for the full model (n = {n}); the exit's top-1 token equals the full model's "
            f"for {share(half, 'agreement')} of prompts at half depth."
        )
    return "\n".join(lines)


def paper_table(est: pd.DataFrame, model_label: str, n_blocks: int) -> pd.DataFrame:
    ref = pd.DataFrame([{"source": "paper (reference)", "model": "GPT2-XL, Pythia-6.9B, Llama-2-7B, Llama-3-8B", "task": "MMLU, SST-2, MRPC, RTE",
                         "collection (fraction of depth)": "first half", "decision (fraction of depth)": "second half"}])

    def frac(v: float) -> str:
        return f"{v / n_blocks:.2f}" if np.isfinite(v) else "not reached"

    ours = pd.DataFrame([{"source": "this run", "model": model_label, "task": r.task, "collection (fraction of depth)": frac(r.collection_layer),
                          "decision (fraction of depth)": frac(r.decision_layer)} for r in est.itertuples()])
    return pd.concat([ref, ours], ignore_index=True)


def prompt_table(prompts: pd.DataFrame) -> pd.DataFrame:
    """The prompts with list columns joined into strings (parquet-friendly)."""
    return prompts.drop(columns=["options", "option_ids"]).assign(
        options=prompts["options"].map("|".join), option_ids=prompts["option_ids"].map(lambda o: ",".join(map(str, o))))


def headlines(run) -> pd.DataFrame:
    """Per task the collection and decision layers (``layer_estimates``) and per
    direction the patching transition (``patching_transitions``). The task or
    direction is part of the quantity: a run has one row per quantity. ``censored``:
    the share of resamples in which the layer is reached only at the output row L
    ("not before the output"; NaN where the run has no interval or predates it)."""
    rows = []
    for r in run["layer_estimates"].itertuples():
        n = float(r.n)
        for name, what in (("MCQ options collected", "collection"), ("MCQ answer settled", "decision")):
            rows.append((f"{name} ({r.task})", getattr(r, f"{what}_layer"), getattr(r, f"{what}_lo"), getattr(r, f"{what}_hi"), n,
                         "layer", getattr(r, f"{what}_censored_share", math.nan)))
    pt = run["patching_transitions"]
    for r in pt[pt["what"] == TRANSITION].itertuples():
        rows.append((f"patching transition ({r.direction})", r.transition_layer, r.lo, r.hi, float(r.n_pairs), "layer",
                     getattr(r, "censored_share", math.nan)))
    out = pd.DataFrame(rows, columns=[*HEADLINE_COLUMNS, "censored"])
    return out.astype({c: float for c in ("value", "lo", "hi", "n", "censored")})
