"""Summary statistics over trajectories: frequency-bucket shares, decision flips,
earliest-layer-at-rank-≤k onsets, agreement with baseline guesses, bootstrap
intervals.

Every function takes tidy DataFrames (the ``steps`` / ``targets`` frames of
:class:`depthkit.Trajectories`, a token frequency table
``[token_id, count, rank, share]``) and returns a tidy DataFrame, so that the
chapters stay thin and the numbers can be checked by hand on small frames.

Functions here are self-contained: each validates its own inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

Stat = Callable[..., float]

_KEYS = ("item", "position")


def _require(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{what} must be a pandas DataFrame, got {type(df).__name__}.")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} lacks column(s) {missing}; it has {list(df.columns)}.")
    if df.empty:
        raise ValueError(f"{what} is empty: there is nothing to summarise.")


def _keys(df: pd.DataFrame) -> list[str]:
    """The columns that identify one prediction (``position`` is optional)."""
    return [c for c in _KEYS if c in df.columns]


def _bucket_labels(ranks: np.ndarray, edges: Sequence[int] | None) -> tuple[np.ndarray, list[str]]:
    """Bucket names of ``ranks`` and the buckets in order from frequent to rare.

    ``edges=None``: the paper's fixed buckets (:data:`depthkit.frequency.BUCKETS`);
    otherwise equal-mass edges from :func:`depthkit.frequency.equal_mass_buckets`.
    """
    from depthkit import frequency

    if edges is None:
        return np.asarray(frequency.bucket_of(ranks)), list(frequency.BUCKETS)
    return np.asarray(frequency.bucket_of_mass(ranks, edges)), list(frequency.mass_bucket_labels(edges))


def label_buckets(steps: pd.DataFrame, freq: pd.DataFrame, *, edges: Sequence[int] | None = None) -> pd.DataFrame:
    """``steps`` with the corpus rank (``freq_rank``) and frequency ``bucket`` of each
    layer's top-1 token. ``bucket`` is an ordered categorical (frequent first)."""
    from depthkit.frequency import ranks_of

    _require(steps, ["layer", "top1_id"], "The steps frame")
    _require(freq, ["token_id", "rank"], "The frequency table")
    ranks = ranks_of(freq, steps["top1_id"].to_numpy())
    labels, order = _bucket_labels(ranks, edges)
    out = steps.copy()
    out["freq_rank"] = ranks
    out["bucket"] = pd.Categorical(labels, categories=order, ordered=True)
    return out


def bucket_shares(
    steps: pd.DataFrame,
    freq: pd.DataFrame,
    *,
    edges: Sequence[int] | None = None,
    n_boot: int = 0,
    seed: int = 0,
    level: float = 0.95,
) -> pd.DataFrame:
    """Per layer, the share of predictions whose top-1 token falls in each frequency
    bucket.

    Returns ``[layer, bucket, share, n, n_total]`` with every (layer, bucket) pair
    present (zero shares included, so stacked charts line up); ``n`` predictions of
    ``n_total`` at that layer are in the bucket. With ``n_boot > 0``, adds percentile
    bootstrap bounds ``lo``/``hi`` (predictions resampled with replacement).
    """
    lab = label_buckets(steps, freq, edges=edges)
    order = list(lab["bucket"].cat.categories)
    rows = []
    for layer, g in lab.groupby("layer", sort=True):
        codes = g["bucket"].cat.codes.to_numpy()
        for j, b in enumerate(order):
            hit = (codes == j).astype(float)
            row = {"layer": int(layer), "bucket": b, "share": hit.mean(), "n": int(hit.sum()), "n_total": len(hit)}
            if n_boot:
                ci = bootstrap_ci(hit, n_boot=n_boot, seed=seed, level=level)
                row.update(lo=ci.lo, hi=ci.hi)
            rows.append(row)
    out = pd.DataFrame(rows)
    out["bucket"] = pd.Categorical(out["bucket"], categories=order, ordered=True)
    return out


def final_top1(steps: pd.DataFrame, final: pd.DataFrame | None = None) -> pd.DataFrame:
    """The final prediction of every item: ``[item, (position,) final_id]``.

    ``final``: a frame with ``token_id`` per item (e.g. ``traj.target("final")``,
    the model's own top-1); if ``None``, the top-1 at the deepest layer of ``steps``.
    Under the canonical convention both are the model's own prediction.
    """
    keys = _keys(steps)
    if final is None:
        deepest = steps[steps["layer"] == steps["layer"].max()]
        return deepest[keys + ["top1_id"]].rename(columns={"top1_id": "final_id"}).reset_index(drop=True)
    _require(final, [*keys, "token_id"], "The final-prediction frame")
    f = final[keys + ["token_id"]].drop_duplicates()
    if f.duplicated(keys).any():
        raise ValueError("The final-prediction frame gives more than one token per item; pass traj.target('final').")
    return f.rename(columns={"token_id": "final_id"}).reset_index(drop=True)


def flip_rates(
    steps: pd.DataFrame,
    freq: pd.DataFrame,
    *,
    final: pd.DataFrame | None = None,
    edges: Sequence[int] | None = None,
    n_boot: int = 0,
    seed: int = 0,
    level: float = 0.95,
) -> pd.DataFrame:
    """Decision flip rate per layer and frequency bucket of the layer's top-1: the
    fraction of predictions whose layer-ℓ top-1 differs from the final top-1.

    Returns ``[layer, bucket, flip_rate, n_flipped, n]`` for the (layer, bucket) pairs
    that occur (a bucket with no predictions at a layer has no rate), plus ``lo``/
    ``hi`` with ``n_boot > 0``. ``final``: see :func:`final_top1`.
    """
    lab = label_buckets(steps, freq, edges=edges)
    keys = _keys(steps)
    fin = final_top1(steps, final)
    merged = lab.merge(fin, on=keys, how="left", validate="many_to_one")
    if merged["final_id"].isna().any():
        raise ValueError("Some items have no final prediction; the final frame must cover every item of steps.")
    merged["flip"] = (merged["top1_id"] != merged["final_id"]).astype(float)
    rows = []
    for (layer, bucket), g in merged.groupby(["layer", "bucket"], sort=True, observed=True):
        v = g["flip"].to_numpy()
        row = {"layer": int(layer), "bucket": bucket, "flip_rate": v.mean(), "n_flipped": int(v.sum()), "n": len(v)}
        if n_boot:
            ci = bootstrap_ci(v, n_boot=n_boot, seed=seed, level=level)
            row.update(lo=ci.lo, hi=ci.hi)
        rows.append(row)
    out = pd.DataFrame(rows)
    out["bucket"] = pd.Categorical(out["bucket"], categories=lab["bucket"].cat.categories, ordered=True)
    return out


def agreement_by_layer(steps: pd.DataFrame, guesses: pd.DataFrame) -> pd.DataFrame:
    """Per layer, the share of predictions whose top-1 equals a reference guess.

    ``guesses``: ``[item, (position,) guess, token_id]``, one row per item and named
    guess (e.g. ``"unigram"``, ``"bigram"``, ``"final"``). Items without a guess of
    some name (e.g. no bigram successor known) are left out of that guess's share.
    Returns ``[layer, guess, share, n_agree, n]``.
    """
    _require(steps, ["layer", "top1_id"], "The steps frame")
    keys = _keys(steps)
    _require(guesses, [*keys, "guess", "token_id"], "The guesses frame")
    g = guesses.dropna(subset=["token_id"])
    merged = steps[keys + ["layer", "top1_id"]].merge(g[keys + ["guess", "token_id"]], on=keys, how="inner")
    merged["agree"] = merged["top1_id"].to_numpy() == merged["token_id"].to_numpy().astype(np.int64)
    out = (
        merged.groupby(["layer", "guess"], sort=True)["agree"]
        .agg(share="mean", n_agree="sum", n="size")
        .reset_index()
    )
    out["n_agree"] = out["n_agree"].astype(np.int64)
    return out


def log_grid(max_k: int = 10000, per_decade: int = 4) -> list[int]:
    """Integer k values from 1 to ``max_k``, about ``per_decade`` per factor of ten,
    evenly spaced on a log scale (duplicates after rounding removed; 1 and ``max_k``
    always included)."""
    if int(max_k) != max_k or max_k < 1:
        raise ValueError(f"max_k must be a positive integer, got {max_k!r}.")
    if int(per_decade) != per_decade or per_decade < 1:
        raise ValueError(f"per_decade must be a positive integer, got {per_decade!r}.")
    n = int(np.ceil(np.log10(max_k) * per_decade))
    values = np.rint(10 ** (np.arange(n + 1) / per_decade)).astype(np.int64)
    return sorted({1, int(max_k), *(int(v) for v in values if v <= max_k)})


def _one_target(targets: pd.DataFrame, target: str | None) -> pd.DataFrame:
    _require(targets, [*_keys(targets), "layer", "rank"], "The targets frame")
    if "target" in targets.columns:
        names = targets["target"].unique()
        if target is not None:
            targets = targets[targets["target"] == target]
            if targets.empty:
                raise ValueError(f"No target {target!r} in the targets frame; it has {sorted(names)}.")
        elif len(names) > 1:
            raise ValueError(
                f"The targets frame holds several targets {sorted(names)}; pass target=... "
                "or a frame of one target (e.g. traj.target('answer'))."
            )
    if targets.duplicated([*_keys(targets), "layer"]).any():
        raise ValueError("The targets frame has several rows for one (item, layer); give one target's rows.")
    return targets


def onset_layers(targets: pd.DataFrame, ks: Sequence[int] | None = None, *, target: str | None = None) -> pd.DataFrame:
    """Per item and k, the earliest layer at which the target's rank is ≤ k
    (``NaN`` if it never is).

    ``targets``: rows ``[item, (position,) layer, rank]`` of one target (e.g.
    ``traj.target("answer")``; pass ``target=`` to pick one from a frame of several).
    ``ks`` defaults to :func:`log_grid`. Returns ``[item, (position,) k, onset]``.
    """
    ks = log_grid() if ks is None else [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be positive integers, got {ks}.")
    t = _one_target(targets, target)
    keys = _keys(t)
    wide = t.pivot(index=keys, columns="layer", values="rank").sort_index(axis=1)
    layers = wide.columns.to_numpy()
    r = wide.to_numpy(dtype=float)  # a layer missing for some item stays NaN: never "reached"
    r = np.where(np.isnan(r), np.inf, r)
    best_so_far = np.minimum.accumulate(r, axis=1)  # [item, layer], non-increasing
    k_arr = np.asarray(ks, dtype=float)
    reached = best_so_far[:, :, None] <= k_arr[None, None, :]  # [item, layer, k]
    first = reached.argmax(axis=1)  # earliest True along layers
    onset = np.where(reached.any(axis=1), layers[first].astype(float), np.nan)  # [item, k]
    index = wide.index.to_frame(index=False)
    out = index.loc[index.index.repeat(len(ks))].reset_index(drop=True)
    out["k"] = np.tile(np.asarray(ks, dtype=np.int64), len(index))
    out["onset"] = onset.reshape(-1)
    return out


def onset_curve(
    onsets: pd.DataFrame,
    *,
    by: Sequence[str] = (),
    n_boot: int = 0,
    seed: int = 0,
    level: float = 0.95,
) -> pd.DataFrame:
    """Mean onset layer per k (and group), over the items that ever reach rank ≤ k.

    ``onsets``: output of :func:`onset_layers`, optionally with grouping columns
    ``by`` merged in (e.g. ``tag``). Returns ``[*by, k, mean_onset, n_reached,
    n_items]`` (+ ``lo``/``hi`` with ``n_boot > 0``, resampling the reaching items).
    """
    by = list(by)
    _require(onsets, [*by, "k", "onset"], "The onsets frame")
    rows = []
    for key, g in onsets.groupby([*by, "k"], sort=True, observed=True):
        key = key if isinstance(key, tuple) else (key,)
        v = g["onset"].to_numpy(dtype=float)
        reached = v[~np.isnan(v)]
        row = dict(zip([*by, "k"], key))
        row.update(
            mean_onset=float(reached.mean()) if len(reached) else np.nan,
            n_reached=len(reached),
            n_items=len(v),
        )
        if n_boot:
            ci = bootstrap_ci(reached, n_boot=n_boot, seed=seed, level=level)
            row.update(lo=ci.lo, hi=ci.hi)
        rows.append(row)
    out = pd.DataFrame(rows)
    out["k"] = out["k"].astype(np.int64)
    return out


class CI(NamedTuple):
    """A statistic with its percentile bootstrap interval."""

    estimate: float
    lo: float
    hi: float
    n: int


def _boot_stats(values: np.ndarray, stat: Stat, n_boot: int, rng: np.random.Generator) -> np.ndarray:
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


def bootstrap_ci(
    values: Sequence[float] | np.ndarray | pd.Series,
    stat: Stat = np.mean,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    *,
    dropna: bool = True,
) -> CI:
    """Percentile bootstrap interval of ``stat(values)``.

    Resamples ``values`` with replacement ``n_boot`` times (``numpy`` generator seeded
    with ``seed``) and returns the ``(1 - level) / 2`` and ``(1 + level) / 2``
    quantiles of the resampled statistic. ``NaN`` values are dropped first unless
    ``dropna=False`` (then they raise). No values: estimate and bounds are ``NaN``.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie strictly between 0 and 1 (e.g. 0.95), got {level}.")
    if int(n_boot) != n_boot or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}.")
    v = np.asarray(values, dtype=float).ravel()
    if np.isnan(v).any():
        if not dropna:
            raise ValueError("values contain NaN; drop them or pass dropna=True.")
        v = v[~np.isnan(v)]
    if len(v) == 0:
        return CI(np.nan, np.nan, np.nan, 0)
    est = float(stat(v))
    boots = _boot_stats(v, stat, int(n_boot), np.random.default_rng(seed))
    alpha = (1 - level) / 2
    lo, hi = np.quantile(boots, [alpha, 1 - alpha])
    return CI(est, float(lo), float(hi), len(v))


def bootstrap_ci_by(
    df: pd.DataFrame,
    value: str,
    by: str | Sequence[str],
    stat: Stat = np.mean,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> pd.DataFrame:
    """:func:`bootstrap_ci` of column ``value`` within each group of ``by``
    (groups resampled independently). Returns ``[*by, estimate, lo, hi, n]``."""
    by = [by] if isinstance(by, str) else list(by)
    _require(df, [*by, value], "The frame")
    rows = []
    for key, g in df.groupby(by, sort=True, observed=True):
        key = key if isinstance(key, tuple) else (key,)
        ci = bootstrap_ci(g[value].to_numpy(), stat=stat, n_boot=n_boot, seed=seed, level=level)
        rows.append({**dict(zip(by, key)), **ci._asdict()})
    return pd.DataFrame(rows)


def rank_bins(ranks: np.ndarray | pd.Series, edges: Sequence[int] = (10, 30, 100, 300, 1000, 3000)) -> pd.Categorical:
    """Bin frequency ranks into ordered intervals ``1-10, 11-30, ..., >3000``
    (finer than the paper's buckets, for matching on frequency)."""
    e = [int(x) for x in edges]
    if not e or e != sorted(set(e)) or e[0] < 1:
        raise ValueError(f"edges must be increasing positive integers, got {list(edges)}.")
    lows = [1, *(x + 1 for x in e)]
    names = [f"{lo}-{hi}" for lo, hi in zip(lows, e)] + [f">{e[-1]}"]
    r = np.asarray(ranks, dtype=np.int64)
    if (r < 1).any():
        raise ValueError("Frequency ranks start at 1; got a rank below 1.")
    codes = np.searchsorted(np.asarray(e), r, side="left")
    return pd.Categorical.from_codes(codes, categories=names, ordered=True)


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
    level: float = 0.95,
) -> pd.DataFrame:
    """Mean of ``value`` for group ``b`` minus group ``a`` within each stratum (e.g.
    content minus function words within a frequency bin), and their average over the
    strata where both groups occur, weighted by the stratum's number of rows.

    Rows with ``NaN`` values are dropped. The bootstrap resamples rows within each
    (stratum, group) cell, so the pooled interval respects the matching. Returns
    ``[stratum, n_a, n_b, mean_a, mean_b, diff, lo, hi]`` with a last row
    ``stratum = "matched (weighted)"``.
    """
    _require(df, [value, group, strata], "The frame")
    d = df.dropna(subset=[value])
    rng = np.random.default_rng(seed)
    alpha = (1 - level) / 2
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
        }
        if len(va) and len(vb):
            boot = _boot_stats(vb, np.mean, n_boot, rng) - _boot_stats(va, np.mean, n_boot, rng)
            row.update(diff=row["mean_b"] - row["mean_a"], lo=np.quantile(boot, alpha), hi=np.quantile(boot, 1 - alpha))
            boot_rows.append(boot)
            weights.append(len(va) + len(vb))
        else:
            row.update(diff=np.nan, lo=np.nan, hi=np.nan)
        rows.append(row)
    out = pd.DataFrame(rows)
    pooled = {"stratum": "matched (weighted)", "n_a": np.nan, "n_b": np.nan, "mean_a": np.nan, "mean_b": np.nan}
    if weights:
        w = np.asarray(weights, dtype=float) / sum(weights)
        has = out["diff"].notna()
        pooled.update(
            n_a=int(out.loc[has, "n_a"].sum()),
            n_b=int(out.loc[has, "n_b"].sum()),
            diff=float(np.dot(w, out.loc[has, "diff"].to_numpy())),
        )
        boot = np.stack(boot_rows).T @ w
        pooled.update(lo=float(np.quantile(boot, alpha)), hi=float(np.quantile(boot, 1 - alpha)))
    else:
        pooled.update(diff=np.nan, lo=np.nan, hi=np.nan)
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
    level: float = 0.95,
) -> pd.DataFrame:
    """Difference of ``value`` between groups ``b`` and ``a`` adjusted linearly for
    ``covariate``: the coefficient of the indicator ``group == b`` in the least-squares
    fit ``value ~ 1 + covariate + [group == b]`` over the rows of both groups.

    Complements :func:`stratified_difference` when the groups barely overlap in the
    covariate (it then extrapolates along the fitted line instead of matching). Rows
    with ``NaN`` are dropped; the bootstrap resamples rows within each group.
    Returns one row ``[estimate, lo, hi, slope, n_a, n_b]`` (``slope``: the
    covariate's coefficient).
    """
    _require(df, [value, group, covariate], "The frame")
    d = df[df[group].isin([a, b])].dropna(subset=[value, covariate])
    ya = d.loc[d[group] == a, [value, covariate]].to_numpy(dtype=float)
    yb = d.loc[d[group] == b, [value, covariate]].to_numpy(dtype=float)
    if len(ya) < 1 or len(yb) < 1 or len(ya) + len(yb) < 4:
        return pd.DataFrame([{"estimate": np.nan, "lo": np.nan, "hi": np.nan, "slope": np.nan, "n_a": len(ya), "n_b": len(yb)}])

    def fit(ra: np.ndarray, rb: np.ndarray) -> np.ndarray:
        rows = np.concatenate([ra, rb])
        x = np.column_stack([np.ones(len(rows)), rows[:, 1], np.r_[np.zeros(len(ra)), np.ones(len(rb))]])
        return np.linalg.lstsq(x, rows[:, 0], rcond=None)[0]

    coef = fit(ya, yb)
    rng = np.random.default_rng(seed)
    boots = np.array(
        [fit(ya[rng.integers(0, len(ya), len(ya))], yb[rng.integers(0, len(yb), len(yb))])[2] for _ in range(int(n_boot))]
    )
    alpha = (1 - level) / 2
    lo, hi = np.quantile(boots, [alpha, 1 - alpha])
    return pd.DataFrame(
        [{"estimate": float(coef[2]), "lo": float(lo), "hi": float(hi), "slope": float(coef[1]), "n_a": len(ya), "n_b": len(yb)}]
    )


def layers_later(diff: float, than: str | None = None, *, digits: int = 1) -> str:
    """A signed layer difference in words: ``"16.9 layers later"``, ``"5.4 layers
    earlier than function words"`` or ``"at the same layer as function words"`` (when
    it rounds to zero), so generated prose never shows a negative "later"."""
    if not np.isfinite(diff):
        raise ValueError(f"No layer difference to describe: got {diff!r}.")
    shown = round(abs(float(diff)), digits)
    if shown == 0:
        return "at the same layer" + (f" as {than}" if than else "")
    unit = "layer" if shown == 1 else "layers"
    return f"{shown:.{digits}f} {unit} {'later' if diff > 0 else 'earlier'}" + (f" than {than}" if than else "")
