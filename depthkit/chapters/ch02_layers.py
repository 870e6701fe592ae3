"""Chapter 02's collection and decision layers: the intervals of a share, of the
decision-minus-collection order and of the patching transition against the lens,
each resampling prompts (or their demonstration sets) once for both sides of a
difference; and how such a layer is written."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from depthkit import stats
from depthkit.analyses import mcq, patching
from depthkit.stats import narrate

# Thresholds of mcq.layer_estimates' defaults, repeated where the prose names them.
COLLECT_LEVEL, DECIDE_LEVEL = 0.5, 0.9


def share_ci(share: float, n: int, *, n_boot: int, seed: int) -> stats.CI:
    """A share of ``n`` prompts with its interval: the share is a mean of one yes/no
    per prompt, so those are rebuilt and resampled as the units (exact binomial
    bounds at 0/n and n/n)."""
    k = int(round(share * n))
    return stats.bootstrap_ci(np.arange(int(n)) < k, n_boot=n_boot, seed=seed)


def clears_baseline(ci: stats.CI, baseline: float) -> bool:
    """Whether an accuracy interval lies above its majority baseline as the pages
    print both: in whole per cent, so a lower end shown equal to the baseline is no
    clearance (a NaN baseline is never cleared)."""
    return narrate.above(ci.lo * 100, baseline * 100, digits=0)


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
