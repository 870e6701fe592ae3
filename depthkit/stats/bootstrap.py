"""The one resampling loop: a statistic of independent units, or of clusters of
rows that share a unit, with its percentile bootstrap interval (overall or per
group)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from depthkit.stats.intervals import CI, LEVEL, MIN_N, Stat, _check, _edge_share, _require, interval


def _clusters(units: Sequence | np.ndarray | pd.Series) -> list[np.ndarray]:
    """Row positions of each unit."""
    codes, _ = pd.factorize(np.asarray(units), use_na_sentinel=False)
    order = np.argsort(codes, kind="stable")
    return np.split(order, np.cumsum(np.bincount(codes))[:-1])


def _boot_stats(values: np.ndarray, stat: Stat, n_boot: int, rng: np.random.Generator,
                clusters: list[np.ndarray] | None = None) -> np.ndarray:
    if clusters is not None:
        draws = (rng.integers(0, len(clusters), len(clusters)) for _ in range(n_boot))
        return np.array([stat(values[np.concatenate([clusters[j] for j in d])]) for d in draws], dtype=float)
    idx = rng.integers(0, len(values), size=(n_boot, len(values)))
    samples = values[idx]
    try:
        # numpy reductions take axis=; one vectorised call instead of n_boot calls.
        out = np.asarray(stat(samples, axis=1), dtype=float)
        if out.shape == (n_boot,):
            return out
    except TypeError:
        pass
    return np.array([stat(s) for s in samples], dtype=float)


def _bootstrap(
    values: Sequence[float] | np.ndarray | pd.Series, stat: Stat, n_boot: int, seed: int, level: float,
    dropna: bool, min_n: int, units: Sequence | np.ndarray | pd.Series | None,
) -> tuple[np.ndarray, float, np.ndarray | None, int]:
    """``(values, estimate, resampled statistics or None, number of units)``: the one
    resampling loop behind :func:`bootstrap_ci` and :func:`bootstrap_layer`."""
    _check(level, n_boot)
    raw = np.asarray(values).ravel()
    v = raw if raw.dtype == bool else raw.astype(float)
    u = None if units is None else np.asarray(units).ravel()
    if u is not None and len(u) != len(v):
        raise ValueError(f"units has {len(u)} entries for {len(v)} values.")
    if v.dtype != bool and np.isnan(v).any():
        if not dropna:
            raise ValueError("values contain NaN; drop them or pass dropna=True.")
        keep = ~np.isnan(v)
        v, u = v[keep], (None if u is None else u[keep])
    clusters = None if u is None else _clusters(u)
    n = len(v) if clusters is None else len(clusters)
    if len(v) == 0:
        return v, np.nan, None, 0
    est = float(stat(v))
    if n < min_n:
        return v, est, None, n
    return v, est, _boot_stats(v, stat, int(n_boot), np.random.default_rng(seed), clusters), n


def bootstrap_ci(
    values: Sequence[float] | np.ndarray | pd.Series,
    stat: Stat = np.mean,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    *,
    dropna: bool = True,
    min_n: int = MIN_N,
    units: Sequence | np.ndarray | pd.Series | None = None,
) -> CI:
    """``stat(values)`` with its percentile bootstrap interval, each value being one
    independent unit (resampled with replacement ``n_boot`` times, generator seeded
    with ``seed``), or, with ``units`` (one label per value), whole units resampled as
    clusters (``n`` then counts units). NaN values are dropped first unless
    ``dropna=False`` (then they raise). Fewer than ``min_n`` units: the estimate
    only, ``lo``/``hi`` NaN. A share (boolean ``values``, ``stat`` the mean) at 0/n
    or n/n gets the exact binomial interval over the units."""
    v, est, boots, n = _bootstrap(values, stat, n_boot, seed, level, dropna, min_n, units)
    if boots is None:
        return CI(est, np.nan, np.nan, n)
    edge = _edge_share(v, n, level) if stat is np.mean else None
    lo, hi = edge or interval(boots, level)
    return CI(est, lo, hi, n)


def bootstrap_ci_by(
    df: pd.DataFrame,
    value: str,
    by: str | Sequence[str],
    stat: Stat = np.mean,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    *,
    min_n: int = MIN_N,
    unit: str | None = None,
) -> pd.DataFrame:
    """:func:`bootstrap_ci` of column ``value`` within each group of ``by``, one row
    one unit, or with ``unit`` (a column) the rows of one unit resampled together
    (groups resampled independently). Returns ``[*by, estimate, lo, hi, n]``."""
    by = [by] if isinstance(by, str) else list(by)
    _require(df, [*by, value, *([unit] if unit else [])], "The frame")
    rows = []
    for key, g in df.groupby(by, sort=True, observed=True):
        key = key if isinstance(key, tuple) else (key,)
        units = None if unit is None else g[unit].to_numpy()
        ci = bootstrap_ci(g[value].to_numpy(), stat=stat, n_boot=n_boot, seed=seed, level=level, min_n=min_n, units=units)
        rows.append({**dict(zip(by, key)), **ci._asdict()})
    return pd.DataFrame(rows, columns=[*by, "estimate", "lo", "hi", "n"])
