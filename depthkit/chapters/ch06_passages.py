"""Chapter 06's unit, the passage: intervals that resample whole passages (the tokens
of one passage share their context and are not independent), and trajectories cut
down to some of the passages."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from depthkit import stats


def _unit_ci(n_units: int, stat: Callable[[np.ndarray], float], *, n_boot: int, seed: int) -> stats.CI:
    """:func:`depthkit.stats.bootstrap_ci` of a statistic of whole units: the resampled
    values are unit indices, so ``stat`` sees which passages were drawn."""

    def of_indices(idx: np.ndarray) -> float:
        # A resample may lack a class or hold one constant value: NaN, not a warning.
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(stat(np.asarray(idx, dtype=int)))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # every resample NaN (e.g. a constant DTR): no interval
        return stats.bootstrap_ci(np.arange(n_units), stat=of_indices, n_boot=n_boot, seed=seed)


def first_passages(traj: Any, n: int) -> Any:
    """The trajectory restricted to passages ``0..n-1``."""
    return _passages(traj, lambda item: item < n)


def split_passages(traj: Any) -> tuple[Any, Any]:
    """The passages split in two halves (the passages are in random order already):
    early-exit thresholds are chosen on the first and measured on the second."""
    half = max(1, int(traj.steps["item"].nunique()) // 2)
    return first_passages(traj, half), _passages(traj, lambda item: item >= half)


def _passages(traj: Any, keep: Callable[[pd.Series], pd.Series]) -> Any:
    sub = lambda df: df[keep(df["item"])].reset_index(drop=True)  # noqa: E731
    return dataclasses.replace(traj, steps=sub(traj.steps), topk=sub(traj.topk), targets=sub(traj.targets))
