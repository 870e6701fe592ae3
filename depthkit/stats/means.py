"""Means over rows that are not independent (tokens of one passage), with the
interval from resampling whole units, and the censored mean of a layer first
reached, where reaching it only at the model's output is "not before the output"."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from depthkit.stats.intervals import LEVEL, MIN_N, _check, _edge_share, _require, interval


def unit_mean(
    df: pd.DataFrame,
    value: str,
    unit: str,
    by: str | Sequence[str] = (),
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    min_n: int = MIN_N,
) -> pd.DataFrame:
    """Mean of ``value`` over rows (e.g. tokens), with the interval from resampling
    whole ``unit``s (e.g. passages): the rows of one unit go in or out together.
    Returns ``[*by, estimate, lo, hi, n, n_rows]`` where ``n`` counts units. A
    boolean ``value`` is a share: at 0/n or n/n its interval is the exact binomial one
    over the units."""
    by = [by] if isinstance(by, str) else list(by)
    _check(level, n_boot)
    _require(df, [*by, value, unit], "The frame")
    d = df.dropna(subset=[value])
    rows = []
    groups = d.groupby(by, sort=True, observed=True) if by else [((), d)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        per = g.groupby(unit, sort=True, observed=True)[value].agg(["sum", "count"])
        sums, counts = per["sum"].to_numpy(dtype=float), per["count"].to_numpy(dtype=float)
        n = len(per)
        est = float(sums.sum() / counts.sum()) if n else np.nan
        lo = hi = np.nan
        if n >= min_n:
            idx = np.random.default_rng(seed).integers(0, n, size=(int(n_boot), n))
            lo, hi = _edge_share(g[value].to_numpy(), n, level) or interval(sums[idx].sum(1) / counts[idx].sum(1), level)
        rows.append({**dict(zip(by, key)), "estimate": est, "lo": lo, "hi": hi, "n": n, "n_rows": len(g)})
    return pd.DataFrame(rows, columns=[*by, "estimate", "lo", "hi", "n", "n_rows"])


def censored_mean(
    df: pd.DataFrame,
    value: str,
    censor_at: float,
    by: str | Sequence[str] = (),
    *,
    unit: str | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    min_n: int = MIN_N,
) -> pd.DataFrame:
    """Mean of a layer ``value`` first reached per row, where reaching it only at
    ``censor_at`` (the model's output row) is censoring: such a row is "not before the
    output", not a measurement at that layer, so it is left out of the mean and
    counted instead. Rows of one ``unit`` (default: each row its own) are resampled
    together. Returns :func:`unit_mean`'s ``[*by, estimate, lo, hi, n, n_rows]`` over
    the rows reached before ``censor_at`` (NaN where none is), plus the share of all
    rows censored with its interval (``censored``, ``censored_lo``, ``censored_hi``)
    and ``n_censored`` (rows at ``censor_at``). NaN values (never reached) count in
    neither."""
    by = [by] if isinstance(by, str) else list(by)
    _require(df, [*by, value, *([unit] if unit else [])], "The frame")
    d = df.dropna(subset=[value]).assign(_unit=lambda f: f[unit] if unit else np.arange(len(f)))
    d["_censored"] = d[value].to_numpy(dtype=float) >= censor_at
    kw = dict(by=by, n_boot=n_boot, seed=seed, level=level, min_n=min_n)
    share = unit_mean(d, "_censored", "_unit", **kw).rename(columns={"estimate": "censored", "lo": "censored_lo", "hi": "censored_hi"})
    share["n_censored"] = d.groupby(by, sort=True, observed=True)["_censored"].sum().to_numpy() if by else int(d["_censored"].sum())
    before = unit_mean(d[~d["_censored"]], value, "_unit", **kw)
    keep = [*by, "censored", "censored_lo", "censored_hi", "n_censored"]
    out = share[keep].merge(before, on=by, how="left") if by else pd.concat([before.reindex([0]), share[keep]], axis=1)
    out[["n", "n_rows"]] = out[["n", "n_rows"]].fillna(0).astype(np.int64)
    return out[[*by, "estimate", "lo", "hi", "n", "n_rows", "censored", "censored_lo", "censored_hi", "n_censored"]]
