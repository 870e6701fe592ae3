"""A layer as a statistic: its bootstrap interval on an integer grid of layers, with
what a percentile interval cannot say there on its own (the share of resamples at a
zero-width interval's layer, and at the output row)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

from depthkit.stats.bootstrap import _bootstrap
from depthkit.stats.intervals import LEVEL, MIN_N, Stat, interval


class LayerCI(NamedTuple):
    """A layer with its bootstrap interval over ``n`` units, and what a percentile
    interval cannot say on its own: ``mode_share``, where both percentiles fall on
    one grid point, the share of resamples at that layer (a zero-width interval on a
    grid of ``step`` layers is not a precise layer); ``censored_share``, the share of
    resamples at the output row (reached only at the output: "not before the
    output"), NaN where no output row was named."""

    estimate: float
    lo: float
    hi: float
    n: int
    mode_share: float = np.nan
    step: float = 1.0
    censored_share: float = np.nan


def _grid_step(grid: Sequence[float] | np.ndarray | None) -> float:
    gaps = np.diff(np.unique(np.asarray(grid, dtype=float))) if grid is not None else np.array([])
    return float(gaps.min()) if len(gaps) else 1.0


def layer_ci(
    estimate: float,
    boots: np.ndarray | None,
    n: int,
    *,
    grid: Sequence[float] | np.ndarray | None = None,
    censor_at: float | None = None,
    level: float = LEVEL,
) -> LayerCI:
    """The :class:`LayerCI` of a layer ``estimate`` from its resampled values
    ``boots`` (None: no interval) on the layer ``grid`` (default: every layer);
    ``censor_at``: the output row."""
    step = _grid_step(grid)
    if boots is None:
        return LayerCI(float(estimate), np.nan, np.nan, n, step=step)
    b = np.asarray(boots, dtype=float)
    lo, hi = interval(b, level)
    mode = float(np.mean(b == lo)) if np.isfinite(lo) and lo == hi else np.nan
    censored = float(np.mean(b >= censor_at)) if censor_at is not None else np.nan
    return LayerCI(float(estimate), lo, hi, n, mode, step, censored)


def bootstrap_layer(
    values: Sequence[float] | np.ndarray | pd.Series,
    stat: Stat,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    *,
    grid: Sequence[float] | np.ndarray | None = None,
    censor_at: float | None = None,
    min_n: int = MIN_N,
    units: Sequence | np.ndarray | pd.Series | None = None,
) -> LayerCI:
    """:func:`bootstrap_ci` for a statistic that is a layer of ``grid`` (e.g. the first
    layer a mean curve reaches a level, the values being item indices), as a
    :class:`LayerCI`. NaN values raise: they are indices, not measurements."""
    _, est, boots, n = _bootstrap(values, stat, n_boot, seed, level, False, min_n, units)
    return layer_ci(est, boots, n, grid=grid, censor_at=censor_at, level=level)
