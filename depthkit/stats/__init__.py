"""Statistics for every chapter: one bootstrap, one interval convention.

Convention: a 95 % percentile bootstrap interval, columns ``lo`` and ``hi``,
resampling the independent unit the caller names (a prompt, a passage, a patching
pair), never a finer one (tokens of the same passage are not independent). Where
rows share a unit (examples of one passage, prompts of one set of demonstrations),
``units=`` resamples the units as clusters. No interval is given from fewer than
:data:`MIN_N` units: ``lo``/``hi`` are NaN then, and prose says "cannot be measured
here" (see :mod:`depthkit.stats.narrate`).

Two cases where a percentile interval would claim a precision it does not have:

* a share (a mean of booleans) at 0/n or n/n: every resample repeats it, so the
  interval is the exact binomial (Clopper–Pearson) one, :func:`binomial_bounds`;
* a layer on an integer grid whose resamples put both percentiles on one layer:
  :class:`LayerCI` keeps the share of resamples at that layer and the grid step.

Row L, the model's own output, is censoring for a layer at which something is first
reached: "at L" means "not before the output". :class:`LayerCI` counts the resamples
at L, and :func:`censored_mean` averages only the items reached before it and
reports the share of items that were not.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


# ---------------------------------------------------------------------------
# Differences between two groups


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
    rows, boot_rows, weights = [], [], []
    for s, g in d.groupby(strata, sort=True, observed=True):
        va = g.loc[g[group] == a, value].to_numpy(dtype=float)
        vb = g.loc[g[group] == b, value].to_numpy(dtype=float)
        row = {
            "stratum": str(s),
            "n_a": len(va),
            "n_b": len(vb),
            "mean_a": va.mean() if len(va) else np.nan,
            "mean_b": vb.mean() if len(vb) else np.nan,
            "used": len(va) >= min_per_cell and len(vb) >= min_per_cell,
            "diff": np.nan,
            "lo": np.nan,
            "hi": np.nan,
        }
        if row["used"]:
            boot = _boot_stats(vb, np.mean, n_boot, rng) - _boot_stats(va, np.mean, n_boot, rng)
            row["diff"] = row["mean_b"] - row["mean_a"]
            row["lo"], row["hi"] = interval(boot, level)
            boot_rows.append(boot)
            weights.append(len(va) * len(vb) / (len(va) + len(vb)))
        rows.append(row)
    out = pd.DataFrame(rows, columns=["stratum", "n_a", "n_b", "mean_a", "mean_b", "used", "diff", "lo", "hi"])
    used = out[out["used"].astype(bool)] if len(out) else out
    pooled = {
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
        va = g.loc[g[group] == a, value].to_numpy(dtype=float)
        vb = g.loc[g[group] == b, value].to_numpy(dtype=float)
        used = len(va) >= min_per_cell and len(vb) >= min_per_cell
        row = {"stratum": str(s_), "n_a": len(va), "n_b": len(vb), "mean_a": va.mean() if len(va) else np.nan,
               "mean_b": vb.mean() if len(vb) else np.nan, "used": used, "diff": np.nan, "lo": np.nan, "hi": np.nan}
        if used:
            boot = boot_means[:, col[(str(s_), str(b))]] - boot_means[:, col[(str(s_), str(a))]]
            row["diff"] = row["mean_b"] - row["mean_a"]
            n_cell_units = g[unit].nunique()
            if n_cell_units >= min_n:
                row["lo"], row["hi"] = interval(boot, level)
            diffs.append(row["diff"]), boots.append(boot), weights.append(len(va) * len(vb) / (len(va) + len(vb)))
        rows.append(row)
    out = pd.DataFrame(rows, columns=["stratum", "n_a", "n_b", "mean_a", "mean_b", "used", "diff", "lo", "hi"])
    used_rows = out[out["used"].astype(bool)] if len(out) else out
    pooled = {"stratum": "matched (weighted)", "n_a": int(used_rows["n_a"].sum()), "n_b": int(used_rows["n_b"].sum()),
              "mean_a": np.nan, "mean_b": np.nan, "used": bool(weights), "diff": np.nan, "lo": np.nan, "hi": np.nan}
    if weights:
        w = np.asarray(weights) / sum(weights)
        pooled["diff"] = float(np.dot(w, diffs))
        kept = d[d[strata].astype(str).isin(used_rows["stratum"])]
        if min(kept.loc[kept[group] == a, unit].nunique(), kept.loc[kept[group] == b, unit].nunique()) >= min_n:
            # A resample that loses a used cell has no pooled value; interval() skips it.
            pooled["lo"], pooled["hi"] = interval(np.stack(boots).T @ w, level)
    return pd.concat([out, pd.DataFrame([pooled])], ignore_index=True)


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

    def fit(ra: np.ndarray, rb: np.ndarray) -> np.ndarray:
        rows = np.concatenate([ra, rb])
        x = np.column_stack([np.ones(len(rows)), rows[:, 1], np.r_[np.zeros(len(ra)), np.ones(len(rb))]])
        return np.linalg.lstsq(x, rows[:, 0], rcond=None)[0]

    coef = fit(ya, yb)
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
                boots.append(fit(ra, rb)[2] if len(ra) and len(rb) else np.nan)
            lo, hi = interval(np.asarray(boots), level)
    elif min(len(ya), len(yb)) >= min_n:
        rng = np.random.default_rng(seed)
        boots = np.array(
            [fit(ya[rng.integers(0, len(ya), len(ya))], yb[rng.integers(0, len(yb), len(yb))])[2] for _ in range(int(n_boot))]
        )
        lo, hi = interval(boots, level)
    return pd.DataFrame([{**empty, "estimate": float(coef[2]), "lo": lo, "hi": hi, "slope": float(coef[1])}])


# ---------------------------------------------------------------------------
# Curves over layers: one curve per unit (item), resampled as wholes


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


@dataclass(frozen=True)
class SegmentFit:
    """Best two-segment least-squares fit of ``y`` against ``x``.

    ``split`` is the layer where the regime changes: the knot of the continuous
    (hinge) fit, or the first x of the second segment of the broken fit.
    """

    split: float
    sse: float
    slope_left: float
    slope_right: float
    fitted: np.ndarray
    kind: str


def two_segment_fit(x: Sequence[float], y: Sequence[float], *, kind: str = "hinge", min_points: int = 2) -> SegmentFit:
    """Fit two straight segments to a curve and return the best split.

    ``kind="hinge"``: a continuous piecewise-linear fit ``y = a + b·x + c·max(x - k, 0)``
    with the knot ``k`` tried at every x that leaves ``min_points`` points on each
    side (knot included on both). ``kind="broken"``: two independent lines on
    ``x < k`` and ``x ≥ k`` (allows a jump). Ties between splits go to the earliest.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-d and of equal length, got shapes {x.shape} and {y.shape}.")
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    if kind not in ("hinge", "broken"):
        raise ValueError(f"kind must be 'hinge' or 'broken', got {kind!r}.")
    if len(x) < 2 * min_points + (0 if kind == "broken" else -1):
        raise ValueError(f"A two-segment fit needs at least {2 * min_points} finite points, got {len(x)}.")
    best: SegmentFit | None = None
    for j in range(len(x)):
        k = x[j]
        if kind == "hinge":
            if j + 1 < min_points or len(x) - j < min_points:
                continue
            design = np.stack([np.ones_like(x), x, np.maximum(x - k, 0.0)], 1)
            coef, *_ = np.linalg.lstsq(design, y, rcond=None)
            fitted = design @ coef
            slopes = (coef[1], coef[1] + coef[2])
        else:
            if j < min_points or len(x) - j < min_points:
                continue
            fitted = np.empty_like(y)
            slopes = []
            for sl in (slice(0, j), slice(j, None)):
                design = np.stack([np.ones_like(x[sl]), x[sl]], 1)
                coef, *_ = np.linalg.lstsq(design, y[sl], rcond=None)
                fitted[sl] = design @ coef
                slopes.append(coef[1])
        sse = float(((y - fitted) ** 2).sum())
        if best is None or sse < best.sse - 1e-12 * max(1.0, abs(best.sse)):
            best = SegmentFit(float(k), sse, float(slopes[0]), float(slopes[1]), fitted, kind)
    if best is None:
        raise ValueError(f"No split leaves {min_points} points on each side of {len(x)} points.")
    return best


def knee(x: Sequence[float], y: Sequence[float]) -> float:
    """The x of largest distance between the curve and the chord joining its first
    and last points, both axes min-max normalised (the Kneedle criterion of
    Satopää et al. 2011, without smoothing)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3:
        raise ValueError(f"A knee needs at least 3 finite points, got {len(x)}.")
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    xn = (x - x[0]) / (x[-1] - x[0])
    span = y.max() - y.min()
    yn = (y - y.min()) / span if span > 0 else np.zeros_like(y)
    chord = yn[0] + (yn[-1] - yn[0]) * xn
    return float(x[int(np.argmax(np.abs(yn - chord)))])


def settling_layer(x: Sequence[float], y: Sequence[float], *, tol: float = 0.05) -> float:
    """Earliest x from which ``y`` stays within ``tol`` (absolute) of its last value
    for good (e.g. where a share reaches its final level)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(x) == 0 or x.shape != y.shape:
        raise ValueError("settling_layer needs non-empty x and y of equal length.")
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    outside = np.abs(y - y[-1]) > tol
    if not outside.any():
        return float(x[0])
    return float(x[int(np.nonzero(outside)[0].max()) + 1])


def first_layer_reaching(x: Sequence[float], y: Sequence[float], level: float) -> float:
    """Earliest x where ``y`` is at least ``level`` (NaN if it never is)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    order = np.argsort(x, kind="stable")
    hit = np.nonzero(y[order] >= level)[0]
    return float(x[order][hit[0]]) if len(hit) else float("nan")
