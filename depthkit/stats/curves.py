"""Curves over layers, one per item, resampled as wholes: the mean curve with its
pointwise interval, and a layer read off the mean curve with its interval."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from depthkit.stats.intervals import LEVEL, MIN_N, _check, _nan_quantiles, _require
from depthkit.stats.layers import layer_ci


def unit_curves(per_item: pd.DataFrame, value: str, by: str) -> tuple[np.ndarray, np.ndarray]:
    """``(x, curves)``: the sorted values of ``by`` (layers or blocks) and the
    [item, x] array of ``value`` (NaN where an item lacks a layer)."""
    _require(per_item, ["item", by, value], "The frame")
    x = np.sort(per_item[by].unique())
    wide = per_item.pivot_table(index="item", columns=by, values=value, aggfunc="mean")
    if wide.empty:
        raise ValueError("No rows to build curves from.")
    return x, wide.reindex(columns=x).to_numpy(dtype=float)


def layer_means(
    per_item: pd.DataFrame,
    value: str,
    *,
    by: str = "block",
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    min_n: int = MIN_N,
) -> pd.DataFrame:
    """Mean of ``value`` per ``by`` (layer or block) over items, with the interval
    from resampling items: columns ``[by, mean, lo, hi, n]``."""
    _check(level, n_boot)
    x, curves = unit_curves(per_item, value, by)
    n = curves.shape[0]
    lo = hi = np.full(len(x), np.nan)
    if n >= min_n:
        rng = np.random.default_rng(seed)
        boots = np.stack([np.nanmean(curves[rng.integers(0, n, n)], axis=0) for _ in range(int(n_boot))])
        alpha = (1 - level) / 2
        lo, hi = _nan_quantiles(boots, [alpha, 1 - alpha], axis=0)
    return pd.DataFrame({by: x, "mean": np.nanmean(curves, axis=0), "lo": lo, "hi": hi, "n": n})


@dataclass(frozen=True)
class LayerEstimate:
    """A layer read off the mean curve over items, with its interval over items
    (``mode_share``, ``step``, ``censored_share``: as in :class:`LayerCI`)."""

    name: str
    estimate: float
    lo: float
    hi: float
    n: int
    n_boot: int
    mode_share: float = np.nan
    step: float = 1.0
    censored_share: float = np.nan

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def curve_estimate(
    per_item: pd.DataFrame,
    value: str,
    estimator: Callable[[np.ndarray, np.ndarray], float],
    *,
    by: str = "layer",
    name: str | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    min_n: int = MIN_N,
    censor_at: float | None = None,
) -> LayerEstimate:
    """``estimator(x, mean_curve)`` on the mean curve of ``value`` over items, with
    the interval of the same estimator on the mean curves of resampled items.
    ``censor_at``: the output row, where the estimator only finds what the output
    gives (e.g. a level first reached there)."""
    _check(level, n_boot)
    x, curves = unit_curves(per_item, value, by)
    x = x.astype(float)
    point = estimator(x, np.nanmean(curves, axis=0))
    n = curves.shape[0]
    samples = None
    if n >= min_n:
        rng = np.random.default_rng(seed)
        samples = np.array([estimator(x, np.nanmean(curves[rng.integers(0, n, n)], axis=0)) for _ in range(int(n_boot))])
    ci = layer_ci(point, samples, n, grid=x, censor_at=censor_at, level=level)
    return LayerEstimate(name or value, ci.estimate, ci.lo, ci.hi, n, int(n_boot), ci.mode_share, ci.step, ci.censored_share)
