"""Summary statistics over trajectories: frequency-bucket shares, decision flips,
earliest-layer-at-rank-≤k onsets, agreement with baseline guesses (intervals
from :mod:`depthkit.stats`).

Every function takes tidy DataFrames (the ``steps`` / ``targets`` frames of
:class:`depthkit.Trajectories`, a token frequency table
``[token_id, count, rank, share]``) and returns a tidy DataFrame, so that the
chapters stay thin and the numbers can be checked by hand on small frames.

Functions here are self-contained: each validates its own inputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from depthkit.stats import LEVEL, MIN_N, bootstrap_ci

_KEYS = ("item", "position")
# Row 0 is the token embedding read through the lens, before any block has run: a
# lens-only baseline, not depth. Onsets and "early" windows start here.
FIRST_DEPTH_LAYER = 1


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

    ``edges=None``: the paper's fixed buckets (:data:`depthkit.analyses.frequency.BUCKETS`);
    otherwise equal-mass edges from :func:`depthkit.analyses.frequency.equal_mass_buckets`.
    """
    from depthkit.analyses import frequency

    if edges is None:
        return np.asarray(frequency.bucket_of(ranks)), list(frequency.BUCKETS)
    return np.asarray(frequency.bucket_of_mass(ranks, edges)), list(frequency.mass_bucket_labels(edges))


def label_buckets(steps: pd.DataFrame, freq: pd.DataFrame, *, edges: Sequence[int] | None = None) -> pd.DataFrame:
    """``steps`` with the corpus rank (``freq_rank``) and frequency ``bucket`` of each
    layer's top-1 token. ``bucket`` is an ordered categorical (frequent first)."""
    from depthkit.analyses.frequency import ranks_of

    _require(steps, ["layer", "top1_id"], "The steps frame")
    _require(freq, ["token_id", "rank"], "The frequency table")
    ranks = ranks_of(freq, steps["top1_id"].to_numpy())
    labels, order = _bucket_labels(ranks, edges)
    out = steps.copy()
    out["freq_rank"] = ranks
    out["bucket"] = pd.Categorical(labels, categories=order, ordered=True)
    return out


def _rate(hits: np.ndarray, n_boot: int, seed: int, level: float, min_n: int) -> dict[str, float]:
    """The share of 0/1 ``hits``, their count, and with ``n_boot`` its interval
    (the hits resampled)."""
    hits = np.asarray(hits, dtype=bool)  # a share: exact bounds at 0/n and n/n (stats.bootstrap_ci)
    out = {"rate": float(hits.mean()), "hits": int(hits.sum())}
    if n_boot:
        ci = bootstrap_ci(hits, n_boot=n_boot, seed=seed, level=level, min_n=min_n)
        out.update(lo=ci.lo, hi=ci.hi)
    return out


def bucket_shares(
    steps: pd.DataFrame,
    freq: pd.DataFrame,
    *,
    edges: Sequence[int] | None = None,
    n_boot: int = 0,
    seed: int = 0,
    level: float = LEVEL,
    min_n: int = MIN_N,
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
            r = _rate(hit, n_boot, seed, level, min_n)
            rows.append({"layer": int(layer), "bucket": b, "share": r.pop("rate"), "n": r.pop("hits"), "n_total": len(hit), **r})
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
    level: float = LEVEL,
    min_n: int = MIN_N,
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
        r = _rate(v, n_boot, seed, level, min_n)
        rows.append({"layer": int(layer), "bucket": bucket, "flip_rate": r.pop("rate"), "n_flipped": r.pop("hits"), "n": len(v), **r})
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


def onset_layers(
    targets: pd.DataFrame, ks: Sequence[int] | None = None, *, target: str | None = None, first_layer: int = 0
) -> pd.DataFrame:
    """Per item and k, the earliest layer ≥ ``first_layer`` at which the target's
    rank is ≤ k (``NaN`` if it never is).

    ``targets``: rows ``[item, (position,) layer, rank]`` of one target (e.g.
    ``traj.target("answer")``; pass ``target=`` to pick one from a frame of several).
    ``ks`` defaults to :func:`log_grid`. Pass ``first_layer=FIRST_DEPTH_LAYER`` to
    count depth only (layer 0 is the embedding read through the lens). Returns
    ``[item, (position,) k, onset]``.
    """
    ks = log_grid() if ks is None else [int(k) for k in ks]
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be positive integers, got {ks}.")
    t = _one_target(targets, target)
    t = t[t["layer"] >= int(first_layer)]
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
    level: float = LEVEL,
    min_n: int = MIN_N,
    censor_at: float | None = None,
    unit: str | None = None,
) -> pd.DataFrame:
    """Mean onset layer per k (and group), over the items that ever reach rank ≤ k.

    ``onsets``: output of :func:`onset_layers`, optionally with grouping columns
    ``by`` merged in (e.g. ``tag``). Returns ``[*by, k, mean_onset, n_reached,
    n_items]`` (+ ``lo``/``hi`` with ``n_boot > 0``, resampling the reaching items).

    ``censor_at``: the output row L. An onset there means "not before the output",
    not a measurement: ``mean_onset`` then averages the onsets before it only, and
    ``n_censored`` and ``censored`` (the share of reaching items censored, with
    ``censored_lo``/``censored_hi`` when ``n_boot > 0``) say how many were left out.

    ``unit``: a column naming what the intervals resample (e.g. the passage several
    items share); default, each item.
    """
    by = list(by)
    _require(onsets, [*by, "k", "onset", *([unit] if unit else [])], "The onsets frame")
    rows = []
    for key, g in onsets.groupby([*by, "k"], sort=True, observed=True):
        key = key if isinstance(key, tuple) else (key,)
        v = g["onset"].to_numpy(dtype=float)
        units = g[unit].to_numpy()[~np.isnan(v)] if unit else None
        reached = v[~np.isnan(v)]
        at_output = reached >= censor_at if censor_at is not None else np.zeros(len(reached), dtype=bool)
        before = reached[~at_output]
        row = dict(zip([*by, "k"], key))
        row.update(
            mean_onset=float(before.mean()) if len(before) else np.nan,
            n_reached=len(reached),
            n_items=len(v),
        )
        if n_boot:
            ci = bootstrap_ci(before, n_boot=n_boot, seed=seed, level=level, min_n=min_n,
                              units=None if units is None else units[~at_output])
            row.update(lo=ci.lo, hi=ci.hi)
        if censor_at is not None:
            row.update(n_censored=int(at_output.sum()), censored=float(at_output.mean()) if len(reached) else np.nan)
            if n_boot:
                share = bootstrap_ci(at_output, n_boot=n_boot, seed=seed, level=level, min_n=min_n, units=units)
                row.update(censored_lo=share.lo, censored_hi=share.hi)
        rows.append(row)
    out = pd.DataFrame(rows)
    out["k"] = out["k"].astype(np.int64)
    return out


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
