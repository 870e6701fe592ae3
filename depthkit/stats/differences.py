"""Differences between two groups that differ in a third variable: matched within
strata (:func:`stratified_difference`) or adjusted along a fitted line
(:func:`adjusted_difference`), each with an interval that resamples the matched
cells or whole units."""

from __future__ import annotations

import numpy as np
import pandas as pd

from depthkit.stats.bootstrap import _boot_stats, _clusters
from depthkit.stats.intervals import LEVEL, MIN_N, _check, _require, interval

_STRATUM_COLUMNS = ["stratum", "n_a", "n_b", "mean_a", "mean_b", "used", "diff", "lo", "hi"]


def stratified_difference(
    df: pd.DataFrame,
    value: str,
    group: str,
    strata: str,
    a: str,
    b: str,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    min_per_cell: int = 5,
    min_n: int = MIN_N,
    unit: str | None = None,
) -> pd.DataFrame:
    """Mean of ``value`` for group ``b`` minus group ``a`` within each stratum (e.g.
    content minus function words within a frequency bin), and their weighted average
    over the strata where each group has at least ``min_per_cell`` rows (a stratum
    with one example of a group has no variance to speak of). Weights are
    n_a·n_b/(n_a + n_b), the precision of a difference of two means, so a stratum
    dominated by one group does not dominate the average.

    Rows with NaN values are dropped; one row is one unit. The bootstrap resamples
    rows within each (stratum, group) cell, so the pooled interval respects the
    matching; with ``unit`` (a column, e.g. the passage several examples come from)
    whole units are resampled instead, across strata and groups at once, and
    ``min_n`` counts units. Returns ``[stratum, n_a, n_b, mean_a, mean_b, used, diff, lo, hi]``
    with a last row ``stratum = "matched (weighted)"`` (no interval when the used
    strata hold fewer than ``min_n`` rows of either group).
    """
    _require(df, [value, group, strata, *([unit] if unit else [])], "The frame")
    _check(level, n_boot)
    d = df.dropna(subset=[value])
    rng = np.random.default_rng(seed)
    if unit is not None:
        return _stratified_by_unit(d, value, group, strata, a, b, n_boot, rng, level, min_per_cell, min_n, unit)
    return _stratified_by_row(d, value, group, strata, a, b, n_boot, rng, level, min_per_cell, min_n)


def _cell_values(g: pd.DataFrame, value: str, group: str, a: str, b: str) -> tuple[np.ndarray, np.ndarray]:
    """The values of groups ``a`` and ``b`` in one stratum ``g``."""
    va = g.loc[g[group] == a, value].to_numpy(dtype=float)
    vb = g.loc[g[group] == b, value].to_numpy(dtype=float)
    return va, vb


def _stratum_row(stratum: object, va: np.ndarray, vb: np.ndarray, min_per_cell: int) -> dict:
    """A stratum's row with its sizes and means; the difference is filled in by the
    caller, which knows how it resamples."""
    return {
        "stratum": str(stratum),
        "n_a": len(va),
        "n_b": len(vb),
        "mean_a": va.mean() if len(va) else np.nan,
        "mean_b": vb.mean() if len(vb) else np.nan,
        "used": len(va) >= min_per_cell and len(vb) >= min_per_cell,
        "diff": np.nan,
        "lo": np.nan,
        "hi": np.nan,
    }


def _weight(va: np.ndarray, vb: np.ndarray) -> float:
    return len(va) * len(vb) / (len(va) + len(vb))


def _pooled_row(used: pd.DataFrame, weights: list[float]) -> dict:
    """The weighted average's row before its difference and interval are filled in."""
    return {
        "stratum": "matched (weighted)",
        "n_a": int(used["n_a"].sum()),
        "n_b": int(used["n_b"].sum()),
        "mean_a": np.nan,
        "mean_b": np.nan,
        "used": bool(weights),
        "diff": np.nan,
        "lo": np.nan,
        "hi": np.nan,
    }


def _stratified_by_row(
    d: pd.DataFrame, value: str, group: str, strata: str, a: str, b: str, n_boot: int, rng: np.random.Generator,
    level: float, min_per_cell: int, min_n: int,
) -> pd.DataFrame:
    """:func:`stratified_difference` resampling rows within each (stratum, group) cell."""
    rows, boot_rows, weights = [], [], []
    for s, g in d.groupby(strata, sort=True, observed=True):
        va, vb = _cell_values(g, value, group, a, b)
        row = _stratum_row(s, va, vb, min_per_cell)
        if row["used"]:
            boot = _boot_stats(vb, np.mean, n_boot, rng) - _boot_stats(va, np.mean, n_boot, rng)
            row["diff"] = row["mean_b"] - row["mean_a"]
            row["lo"], row["hi"] = interval(boot, level)
            boot_rows.append(boot)
            weights.append(_weight(va, vb))
        rows.append(row)
    out = pd.DataFrame(rows, columns=_STRATUM_COLUMNS)
    used = out[out["used"].astype(bool)] if len(out) else out
    pooled = _pooled_row(used, weights)
    if weights:
        w = np.asarray(weights, dtype=float) / sum(weights)
        pooled["diff"] = float(np.dot(w, used["diff"].to_numpy(dtype=float)))
        if min(pooled["n_a"], pooled["n_b"]) >= min_n:
            pooled["lo"], pooled["hi"] = interval(np.stack(boot_rows).T @ w, level)
    return pd.concat([out, pd.DataFrame([pooled])], ignore_index=True)


def _unit_draws(units: np.ndarray, n_boot: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, counts)``: each row's unit index, and how often each unit is drawn
    in each of ``n_boot`` resamples of the units ([n_boot, n_units])."""
    codes, uniq = pd.factorize(np.asarray(units), use_na_sentinel=False)
    n = len(uniq)
    draws = rng.integers(0, n, size=(n_boot, n))
    return codes, np.stack([np.bincount(row, minlength=n) for row in draws]).astype(float)


def _stratified_by_unit(
    d: pd.DataFrame, value: str, group: str, strata: str, a: str, b: str, n_boot: int, rng: np.random.Generator,
    level: float, min_per_cell: int, min_n: int, unit: str,
) -> pd.DataFrame:
    """:func:`stratified_difference` resampling whole units: every cell's mean in a
    resample is the count-weighted sum over the drawn units (one matrix product)."""
    d = d[d[group].isin([a, b])]
    cells = pd.MultiIndex.from_frame(d[[strata, group]].astype(str))
    cell_codes, cell_keys = pd.factorize(cells)
    codes, counts = _unit_draws(d[unit].to_numpy(), n_boot, rng)
    n_units, n_cells = counts.shape[1], len(cell_keys)
    sums, sizes = np.zeros((n_units, n_cells)), np.zeros((n_units, n_cells))
    np.add.at(sums, (codes, cell_codes), d[value].to_numpy(dtype=float))
    np.add.at(sizes, (codes, cell_codes), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot_means = (counts @ sums) / (counts @ sizes)  # [n_boot, cell]
    col = {key: j for j, key in enumerate(cell_keys)}
    rows, diffs, boots, weights = [], [], [], []
    for s_, g in d.groupby(strata, sort=True, observed=True):
        va, vb = _cell_values(g, value, group, a, b)
        row = _stratum_row(s_, va, vb, min_per_cell)
        if row["used"]:
            boot = boot_means[:, col[(str(s_), str(b))]] - boot_means[:, col[(str(s_), str(a))]]
            row["diff"] = row["mean_b"] - row["mean_a"]
            n_cell_units = g[unit].nunique()
            if n_cell_units >= min_n:
                row["lo"], row["hi"] = interval(boot, level)
            diffs.append(row["diff"]), boots.append(boot), weights.append(_weight(va, vb))
        rows.append(row)
    out = pd.DataFrame(rows, columns=_STRATUM_COLUMNS)
    used_rows = out[out["used"].astype(bool)] if len(out) else out
    pooled = _pooled_row(used_rows, weights)
    if weights:
        w = np.asarray(weights) / sum(weights)
        pooled["diff"] = float(np.dot(w, diffs))
        kept = d[d[strata].astype(str).isin(used_rows["stratum"])]
        if min(kept.loc[kept[group] == a, unit].nunique(), kept.loc[kept[group] == b, unit].nunique()) >= min_n:
            # A resample that loses a used cell has no pooled value; interval() skips it.
            pooled["lo"], pooled["hi"] = interval(np.stack(boots).T @ w, level)
    return pd.concat([out, pd.DataFrame([pooled])], ignore_index=True)


def _shift_fit(ra: np.ndarray, rb: np.ndarray) -> np.ndarray:
    """Coefficients ``[intercept, slope, shift of group b]`` of the least-squares fit
    over rows ``[value, covariate]`` of groups a (``ra``) and b (``rb``)."""
    rows = np.concatenate([ra, rb])
    x = np.column_stack([np.ones(len(rows)), rows[:, 1], np.r_[np.zeros(len(ra)), np.ones(len(rb))]])
    return np.linalg.lstsq(x, rows[:, 0], rcond=None)[0]


def adjusted_difference(
    df: pd.DataFrame,
    value: str,
    group: str,
    covariate: str,
    a: str,
    b: str,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    min_n: int = MIN_N,
    unit: str | None = None,
) -> pd.DataFrame:
    """Difference of ``value`` between groups ``b`` and ``a`` adjusted linearly for
    ``covariate``: the coefficient of the indicator ``group == b`` in the least-squares
    fit ``value ~ 1 + covariate + [group == b]`` over the rows of both groups.

    Complements :func:`stratified_difference` when the groups barely overlap in the
    covariate (it then extrapolates along the fitted line instead of matching). Rows
    with NaN are dropped; one row is one unit, resampled within its group, or with
    ``unit`` (a column) whole units are resampled and ``min_n`` counts units. Returns
    one row ``[estimate, lo, hi, slope, n_a, n_b]`` (no interval below ``min_n`` rows,
    or units, a group).
    """
    _require(df, [value, group, covariate, *([unit] if unit else [])], "The frame")
    _check(level, n_boot)
    d = df[df[group].isin([a, b])].dropna(subset=[value, covariate])
    ya = d.loc[d[group] == a, [value, covariate]].to_numpy(dtype=float)
    yb = d.loc[d[group] == b, [value, covariate]].to_numpy(dtype=float)
    empty = {"estimate": np.nan, "lo": np.nan, "hi": np.nan, "slope": np.nan, "n_a": len(ya), "n_b": len(yb)}
    if len(ya) < 1 or len(yb) < 1 or len(ya) + len(yb) < 4:
        return pd.DataFrame([empty])
    coef = _shift_fit(ya, yb)
    lo = hi = np.nan
    if unit is not None:
        if min(d.loc[d[group] == a, unit].nunique(), d.loc[d[group] == b, unit].nunique()) >= min_n:
            is_b = (d[group] == b).to_numpy()
            yv = d[[value, covariate]].to_numpy(dtype=float)
            clusters = _clusters(d[unit].to_numpy())
            rng = np.random.default_rng(seed)
            boots = []
            for _ in range(int(n_boot)):
                rows_ = np.concatenate([clusters[j] for j in rng.integers(0, len(clusters), len(clusters))])
                ra, rb = yv[rows_[~is_b[rows_]]], yv[rows_[is_b[rows_]]]
                boots.append(_shift_fit(ra, rb)[2] if len(ra) and len(rb) else np.nan)
            lo, hi = interval(np.asarray(boots), level)
    elif min(len(ya), len(yb)) >= min_n:
        rng = np.random.default_rng(seed)
        boots = np.array(
            [_shift_fit(ya[rng.integers(0, len(ya), len(ya))], yb[rng.integers(0, len(yb), len(yb))])[2] for _ in range(int(n_boot))]
        )
        lo, hi = interval(boots, level)
    return pd.DataFrame([{**empty, "estimate": float(coef[2]), "lo": lo, "hi": hi, "slope": float(coef[1])}])
