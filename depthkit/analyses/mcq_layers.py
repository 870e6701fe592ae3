"""Option collection and option reasoning, layer by layer: the pure analysis of the
option-rank frame of :func:`depthkit.analyses.mcq.option_ranks`.

*Collected* at layer ℓ: every option sits in the top-|O| of the whole vocabulary.
*Choice* at ℓ: the most probable option; the model's *answer* is the choice at
ℓ = L. Per-layer shares of both, accuracy against a majority baseline, and the
*collection* and *decision* layers with bootstrap intervals.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from depthkit.stats import LEVEL, MIN_N, bootstrap_layer

_RANK_COLUMNS = ("task", "item", "layer", "option", "rank", "prob", "is_gold")


def _check(ranks: pd.DataFrame) -> None:
    missing = [c for c in _RANK_COLUMNS if c not in ranks.columns]
    if missing:
        raise ValueError(f"The option-rank frame lacks columns {missing}; build it with option_ranks().")
    if ranks.duplicated(["item", "layer", "option"]).any():
        raise ValueError("The option-rank frame has duplicate (item, layer, option) rows.")


def per_item(ranks: pd.DataFrame) -> pd.DataFrame:
    """One row per (item, layer): ``collected`` (all options in the top-|O|),
    ``mass`` (probability on the options), ``choice`` (most probable option),
    ``answer`` (the choice at the last layer = the model's answer), ``gold``,
    ``agrees_final`` and ``agrees_gold``."""
    _check(ranks)
    g = ranks.groupby(["task", "item", "layer"], sort=True)
    out = g.agg(n_options=("option", "size"), worst_rank=("rank", "max"), mass=("prob", "sum")).reset_index()
    out["collected"] = out["worst_rank"] <= out["n_options"]
    best = ranks.loc[ranks.groupby(["item", "layer"])["prob"].idxmax(), ["item", "layer", "option"]]
    out = out.merge(best.rename(columns={"option": "choice"}), on=["item", "layer"])
    last = out.groupby("item")["layer"].transform("max")
    answer = out[out["layer"] == last][["item", "choice"]].rename(columns={"choice": "answer"})
    gold = ranks[ranks["is_gold"]].drop_duplicates("item")[["item", "option"]].rename(columns={"option": "gold"})
    out = out.merge(answer, on="item").merge(gold, on="item", how="left")
    out["agrees_final"] = out["choice"] == out["answer"]
    out["agrees_gold"] = out["choice"] == out["gold"]
    return out


def collection_reasoning(ranks: pd.DataFrame) -> pd.DataFrame:
    """Per task and layer: ``collected_share`` (option collection), ``mass`` (mean
    probability on the options), ``final_share`` and ``gold_share`` (option
    reasoning: the layer's most probable option equals the model's answer / the gold
    one), ``n`` items."""
    p = per_item(ranks)
    return (
        p.groupby(["task", "layer"], sort=True)
        .agg(
            collected_share=("collected", "mean"),
            mass=("mass", "mean"),
            final_share=("agrees_final", "mean"),
            gold_share=("agrees_gold", "mean"),
            n=("item", "size"),
        )
        .reset_index()
    )


def accuracy(ranks: pd.DataFrame) -> pd.DataFrame:
    """Per task, at the model's output: ``accuracy`` (answer = gold),
    ``majority_answer`` and ``majority_share`` (the most frequent answer, ties to the
    first option, and the share of items that get it: near 1, the model answers
    alike whatever the prompt, and "the answer is settled early" says little),
    ``top1_option`` (share whose unrestricted top-1 token is an option, when the
    frame has ``top1_is_option``) and ``n``."""
    p = per_item(ranks)
    last = p[p["layer"] == p.groupby("item")["layer"].transform("max")]
    out = last.groupby("task").agg(accuracy=("agrees_gold", "mean"), n=("item", "size")).reset_index()
    counts = last.groupby(["task", "answer"]).size().rename("count").reset_index()
    top = counts.sort_values(["task", "count", "answer"], ascending=[True, False, True]).drop_duplicates("task")
    out = out.merge(top.rename(columns={"answer": "majority_answer"}), on="task")
    out["majority_share"] = out.pop("count") / out["n"]
    if "top1_is_option" in ranks.columns:
        r = ranks[ranks["layer"] == ranks.groupby("item")["layer"].transform("max")].drop_duplicates("item")
        out = out.merge(r.groupby("task")["top1_is_option"].mean().rename("top1_option").reset_index(), on="task")
    return out


def majority_baseline(prompts: pd.DataFrame) -> pd.Series:
    """Per task, the accuracy of always giving the most frequent gold answer (by its
    position in the option list): what a model that ignores the question scores.
    A task whose accuracy does not clear it says nothing about reasoning."""
    if not {"task", "gold"} <= set(prompts.columns):
        raise ValueError("The prompts need task and gold columns; build them with build_prompts or load_mcq_file.")
    return prompts.groupby("task")["gold"].agg(lambda g: g.value_counts(normalize=True).max()).rename("majority_baseline")


def first_layer_reaching(curve: np.ndarray, layers: np.ndarray, level: float, *, stay: bool) -> float:
    """Earliest layer whose value is ≥ ``level`` (``stay``: and every later one
    too); NaN if none."""
    ok = np.asarray(curve) >= level
    if stay:
        if not ok[-1]:
            return float("nan")
        bad = np.flatnonzero(~ok)
        return float(layers[0 if len(bad) == 0 else bad[-1] + 1])
    hit = np.flatnonzero(ok)
    return float(layers[hit[0]]) if len(hit) else float("nan")


def _collection_layer(m: np.ndarray, layers: np.ndarray, level: float) -> float:
    curve = m.mean(0)
    peak = curve.max()
    return float("nan") if peak <= 0 else first_layer_reaching(curve, layers, level * peak, stay=False)


def _decision_layer(m: np.ndarray, layers: np.ndarray, level: float) -> float:
    return first_layer_reaching(m.mean(0), layers, level, stay=True)


def _demo_units(ranks: pd.DataFrame, items: pd.Index) -> tuple[np.ndarray | None, int]:
    """``(units, sets)``: per item its demonstration set where the items hold more
    than one (prompts sharing demonstrations are not independent), else None (each
    prompt its own unit); ``sets`` counts the named sets (0: none named, e.g. a file)."""
    if "demo_set" not in ranks.columns:
        return None, 0
    sets = ranks.groupby("item")["demo_set"].first().reindex(items)
    named = int(sets.nunique())
    if named < 2:
        return None, named
    return sets.astype(object).where(sets.notna(), "prompt " + items.astype(str)).to_numpy(), named


def _task_estimates(
    task: str, g: pd.DataFrame, ranks: pd.DataFrame, *, collect_level: float, decide_level: float, boot: dict
) -> dict:
    """The row of :func:`layer_estimates` for one task's per-item frame ``g``."""
    coll = g.pivot(index="item", columns="layer", values="collected").sort_index(axis=1)
    agree = g.pivot(index="item", columns="layer", values="agrees_final").sort_index(axis=1)
    layers = coll.columns.to_numpy()
    cm, am = coll.to_numpy(dtype=float), agree.to_numpy(dtype=float)
    units, sets = _demo_units(ranks, coll.index)
    kw = dict(**boot, units=units, grid=layers, censor_at=float(layers.max()))
    idx = np.arange(len(coll), dtype=float)
    c_ci = bootstrap_layer(idx, lambda i: _collection_layer(cm[i.astype(int)], layers, collect_level), **kw)
    d_ci = bootstrap_layer(idx, lambda i: _decision_layer(am[i.astype(int)], layers, decide_level), **kw)
    curve = cm.mean(0)
    return {
        "task": task,
        "collection_layer": c_ci.estimate,
        "collection_lo": c_ci.lo,
        "collection_hi": c_ci.hi,
        "peak_collected_share": float(curve.max()),
        "peak_layer": int(layers[curve.argmax()]),
        "decision_layer": d_ci.estimate,
        "decision_lo": d_ci.lo,
        "decision_hi": d_ci.hi,
        "n_layers": int(layers.max()),
        "n": int(len(coll)),
        "demo_sets": sets,
        "collection_mode_share": c_ci.mode_share,
        "collection_censored_share": c_ci.censored_share,
        "decision_mode_share": d_ci.mode_share,
        "decision_censored_share": d_ci.censored_share,
        "step": c_ci.step,
    }


def layer_estimates(
    ranks: pd.DataFrame,
    *,
    collect_level: float = 0.5,
    decide_level: float = 0.9,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    min_n: int = MIN_N,
) -> pd.DataFrame:
    """Per task: the *collection layer* (earliest layer at which the share of prompts
    with every option in the top-|O| reaches ``collect_level`` × its peak over
    layers) and the *decision layer* (earliest layer from which the share whose
    most probable option equals the model's answer stays ≥ ``decide_level``), each
    with a percentile bootstrap interval (:func:`depthkit.stats.bootstrap_layer`),
    plus the peak collection share, the layer it is reached at and the number of
    blocks L.

    The interval resamples demonstration sets (``demo_set`` of the ranks) as
    clusters where a task has more than one; where all prompts share one set
    (``demo_sets`` = 1) it resamples prompts and so covers prompt variation only.
    ``*_mode_share`` and ``*_censored_share``: the share of resamples at a
    zero-width interval's layer and at the output row L (:class:`depthkit.stats.LayerCI`).
    """
    for name, v in (("collect_level", collect_level), ("decide_level", decide_level)):
        if not 0 < v <= 1:
            raise ValueError(f"{name} must lie in (0, 1], got {v}.")
    p = per_item(ranks)
    boot = dict(n_boot=n_boot, seed=seed, level=level, min_n=min_n)
    rows = [
        _task_estimates(task, g, ranks, collect_level=collect_level, decide_level=decide_level, boot=boot)
        for task, g in p.groupby("task", sort=False)
    ]
    return pd.DataFrame(rows)
