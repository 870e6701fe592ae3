"""Chapter 02's activation patching between two tasks and its random-source control:
the sweeps, the transition layers beside the lens's collection layer, and their prose."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from depthkit.analyses import patching
from depthkit.chapters.ch02_layers import _layer, transition_difference
from depthkit.chapters.ch02_prompts import task_prompts
from depthkit.stats import narrate
from depthkit.stats.narrate import at_output

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

# The ``what`` of a transition row: the headlines and depthkit.verdicts look rows up by it.
TRANSITION = "patching transition"
FOLLOWS = "follows source's answer"


def _pair_prompts(model: Model, prompts: pd.DataFrame, p: Mapping[str, Any], task: str) -> pd.DataFrame:
    """The prompts of ``task`` that the sweeps pair: the run's own, else drawn for them."""
    f = prompts[prompts["task"] == task]
    return (f if len(f) else task_prompts(model, task, p)).head(p["n_pairs"])


def clean_runs(model: Model, prompts: pd.DataFrame, p: Mapping[str, Any]) -> patching.CleanRuns:
    """The clean runs for the option ranks to fill: every prompt's residuals, and the
    contexts of the prompts the sweeps will patch (all three tasks' pairs are targets
    in some direction), so those prompts never run again."""
    tasks = dict.fromkeys([p["patch_source"], p["patch_target"], p["patch_control"]])
    targets = [t for task in tasks for t in prompts.loc[prompts["task"] == task, "prompt"].head(p["n_pairs"])]
    return patching.CleanRuns(model, targets=targets)


def patching_sweeps(
    model: Model, prompts: pd.DataFrame, p: Mapping[str, Any], n_blocks: int, *, clean: patching.CleanRuns | None = None
) -> pd.DataFrame:
    """Patching in both directions between the two tasks, and the random-source
    control within ``patch_control``; one row per (direction, pair, layer).
    ``clean``: the clean runs the option ranks kept (:func:`clean_runs`; the prompts
    they hold do not run again)."""
    layers = sorted(set(range(0, n_blocks + 1, p["patch_layer_step"])) | {n_blocks})
    src, tgt = (_pair_prompts(model, prompts, p, p[k]) for k in ("patch_source", "patch_target"))
    # A user's file may hold fewer prompts than n_pairs: pair as many as both tasks have.
    src, tgt = src.head(len(tgt)), tgt.head(len(src))
    sweeps = []
    if clean is None:
        clean = patching.CleanRuns(model)  # both directions and the control read some prompts twice
    for (a, b), (fa, fb) in (((p["patch_source"], p["patch_target"]), (src, tgt)), ((p["patch_target"], p["patch_source"]), (tgt, src))):
        sw = patching.patching_sweep(model, list(fa["prompt"]), list(fb["prompt"]), target_options=list(fb["option_ids"]),
                                     source_options=list(fa["option_ids"]), layers=layers, clean=clean)
        sweeps.append(sw.assign(direction=f"{a} → {b}", control=False))
    pc = _pair_prompts(model, prompts, p, p["patch_control"])
    # The control pairs prompts whose *model* answers differ: with the same answer,
    # following the source could not be told from keeping the target's own.
    answers = patching.final_tokens(model, list(pc["prompt"]), clean=clean)
    if len(np.unique(answers)) > 1:
        perm = patching.different_answer_sources(answers, seed=p["seed"])
        ctrl = patching.patching_sweep(model, list(pc["prompt"].iloc[perm]), list(pc["prompt"]), target_options=list(pc["option_ids"]),
                                       source_options=list(pc["option_ids"].iloc[perm]), layers=layers, clean=clean)
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
            at = f"layer {col:.0f}" if col < n_blocks else "the output"
            gap = "; " + narrate.difference(ci.estimate, ci.lo, ci.hi, more="later", less="earlier", subject="patching transitions",
                                            than=f"the lens's collection layer for {tgt} ({at})", digits=0, step=1,  # the collection layer is on every layer
                                            censored=at_output(t.transition_layer, col, n_blocks))
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
