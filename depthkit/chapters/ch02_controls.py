"""Chapter 02's label controls: the control task with its options relabelled with
rare symbols or permuted, and what the symbol control says about whether
"collection" tracks recognised options or merely frequent label tokens."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from depthkit.analyses import mcq
from depthkit.chapters.ch02_layers import _est_layer, clears_baseline, share_ci
from depthkit.chapters.ch02_prompts import task_prompts
from depthkit.stats import narrate

if TYPE_CHECKING:
    from depthkit.engine.handle import Model


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
    words = narrate.share(*ci[:3], digits=0) + (f" against a majority baseline of {base:.0%}" if np.isfinite(base) else "")
    return words, clears_baseline(ci, base)


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
