"""The interval convention every statistic follows: the level, the fewest units an
interval is computed from, the result record, the percentile interval of resampled
statistics and the exact binomial interval where a percentile one would mislead."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

LEVEL = 0.95
# Fewest independent units an interval is computed from.
MIN_N = 10

Stat = Callable[..., float]


class CI(NamedTuple):
    """A statistic with its bootstrap interval over ``n`` units (``lo``/``hi`` NaN
    when ``n`` < the minimum)."""

    estimate: float
    lo: float
    hi: float
    n: int


def _require(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise KeyError(f"{what} lacks column(s) {missing}; it has {list(df.columns)}.")


def _check(level: float, n_boot: int) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must lie strictly between 0 and 1 (e.g. 0.95), got {level}.")
    if int(n_boot) != n_boot or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}.")


def _nan_quantiles(boots: np.ndarray, qs: Sequence[float], axis: int = 0) -> np.ndarray:
    """Quantiles that ignore NaN resamples; an all-NaN slice (e.g. a layer no resample
    reaches) gives NaN quietly: "no interval", not a warning on the book's page."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "All-NaN slice", RuntimeWarning)
        return np.nanquantile(boots, qs, axis=axis)


def interval(boots: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval of bootstrap statistics ``boots`` (NaN resamples ignored)."""
    alpha = (1 - level) / 2
    lo, hi = _nan_quantiles(np.asarray(boots, dtype=float), [alpha, 1 - alpha])
    return float(lo), float(hi)


def binomial_bounds(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The exact (Clopper–Pearson) interval of a share of ``k`` hits in ``n`` units:
    the interval for 0/n or n/n, where every bootstrap resample repeats the share."""
    from scipy.stats import beta

    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"binomial_bounds needs 0 <= k <= n and n >= 1, got k={k}, n={n}.")
    alpha = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(alpha, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha, k + 1, n - k))
    return lo, hi


def _edge_share(v: np.ndarray, n_units: int, level: float) -> tuple[float, float] | None:
    """Clopper–Pearson bounds for boolean ``v`` that are all False or all True (the
    count is of units: clustered rows at 0/n are 0 of ``n_units`` independent units)."""
    if v.dtype != bool or not len(v) or v.min() != v.max():
        return None
    return binomial_bounds(int(v[0]) * n_units, n_units, level)
