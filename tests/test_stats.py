"""depthkit.stats: exact shares at 0/n and n/n, the cluster bootstrap, censoring at
the output row and layer intervals on a grid, on data whose answer is known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from depthkit import stats


def test_binomial_bounds_match_known_clopper_pearson_values():
    assert stats.binomial_bounds(0, 200) == (0.0, pytest.approx(0.0183, abs=5e-5))
    assert stats.binomial_bounds(0, 200)[1] == pytest.approx(1 - 0.025 ** (1 / 200))  # the closed form at 0/n
    assert stats.binomial_bounds(200, 200) == (pytest.approx(1 - 0.0183, abs=5e-5), 1.0)
    assert stats.binomial_bounds(5, 10) == (pytest.approx(0.1871, abs=1e-4), pytest.approx(0.8129, abs=1e-4))
    with pytest.raises(ValueError):
        stats.binomial_bounds(3, 2)


def test_a_share_at_0_or_n_gets_exact_bounds_not_a_zero_width_interval():
    none = stats.bootstrap_ci(np.zeros(200, dtype=bool), n_boot=100)
    assert none.estimate == 0 and none.lo == 0 and none.hi == pytest.approx(0.0183, abs=5e-5)
    every = stats.bootstrap_ci(np.ones(200, dtype=bool), n_boot=100)
    assert every.hi == 1 and every.lo == pytest.approx(0.9817, abs=5e-5)
    # a mean of numbers (not a share) that never varies keeps its zero-width interval
    assert stats.bootstrap_ci(np.zeros(200), n_boot=100)[1:3] == (0.0, 0.0)
    # clustered at 0/n: the count is of units (20 passages), not of rows
    rows = pd.DataFrame({"hit": np.zeros(200, dtype=bool), "passage": np.repeat(np.arange(20), 10)})
    r = stats.unit_mean(rows, "hit", "passage", n_boot=100).iloc[0]
    assert r["hi"] == pytest.approx(1 - 0.025 ** (1 / 20))


def test_cluster_bootstrap_of_identical_clusters_is_wider_than_the_item_bootstrap():
    rng = np.random.default_rng(0)
    values = np.repeat(rng.normal(size=20), 5)  # 20 clusters of 5 identical values
    units = np.repeat(np.arange(20), 5)
    items = stats.bootstrap_ci(values, n_boot=500)
    clusters = stats.bootstrap_ci(values, n_boot=500, units=units)
    assert clusters.estimate == items.estimate and clusters.n == 20 and items.n == 100
    assert (clusters.hi - clusters.lo) > 1.8 * (items.hi - items.lo)  # about sqrt(5) wider
    # one cluster per value: the same draws as the item bootstrap would make, the same width roughly
    single = stats.bootstrap_ci(values[::5], n_boot=500, units=np.arange(20))
    assert single.hi - single.lo == pytest.approx(clusters.hi - clusters.lo, rel=0.25)
    # fewer than MIN_N clusters: no interval whatever the number of rows
    assert np.isnan(stats.bootstrap_ci(values, units=units // 4).lo)
    by = stats.bootstrap_ci_by(pd.DataFrame({"v": values, "u": units, "g": "a"}), "v", "g", unit="u", n_boot=500).iloc[0]
    assert by["n"] == 20 and by["lo"] == pytest.approx(clusters.lo)


def test_censored_mean_leaves_out_the_output_row_and_counts_it():
    onsets = np.r_[np.full(30, 10.0), np.full(10, 30.0), [np.nan] * 5]  # 10 of 40 reached only at L = 30
    df = pd.DataFrame({"onset": onsets, "g": "a"})
    r = stats.censored_mean(df, "onset", 30, n_boot=200).iloc[0]
    assert r["estimate"] == 10 and r["n"] == 30 and r["n_censored"] == 10 and r["censored"] == 0.25
    assert r["censored_lo"] < 0.25 < r["censored_hi"]
    none = stats.censored_mean(df[df["onset"] < 30], "onset", 30, "g", n_boot=200).iloc[0]
    assert none["censored"] == 0 and none["censored_hi"] == pytest.approx(1 - 0.025 ** (1 / 30))
    every = stats.censored_mean(df[df["onset"] == 30], "onset", 30, "g", n_boot=200).iloc[0]
    assert np.isnan(every["estimate"]) and every["n"] == 0 and every["censored"] == 1
    assert every["censored_lo"] == pytest.approx(0.025 ** (1 / 10))


def test_layer_ci_reports_the_mode_share_and_the_output_share():
    always = stats.bootstrap_layer(np.arange(50.0), lambda i: 3.0, n_boot=100, grid=[0, 2, 4, 6], censor_at=6)
    assert (always.lo, always.hi, always.mode_share, always.step, always.censored_share) == (3, 3, 1.0, 2.0, 0.0)
    # 30 of 50 items at layer 8 (the output), 20 at layer 2: the statistic is the median item's layer
    layers = np.r_[np.full(30, 8.0), np.full(20, 2.0)]
    med = stats.bootstrap_layer(np.arange(50.0), lambda i: float(np.median(layers[i.astype(int)])), n_boot=400, censor_at=8)
    assert med.estimate == 8 and 0.7 < med.censored_share < 1 and np.isnan(med.mode_share)
    assert med.lo < med.hi == 8
    few = stats.bootstrap_layer(np.arange(5.0), lambda i: 1.0)
    assert np.isnan(few.lo) and few.n == 5


def test_curve_estimate_carries_the_grid_fields():
    per_item = pd.DataFrame({"item": np.repeat(np.arange(20), 4), "layer": np.tile([0, 1, 2, 3], 20),
                             "v": np.tile([0.0, 0.2, 1.0, 0.1], 20)})
    est = stats.curve_estimate(per_item, "v", lambda x, y: float(x[np.argmax(y)]), n_boot=50, censor_at=3)
    assert (est.estimate, est.lo, est.hi, est.mode_share, est.censored_share, est.step) == (2, 2, 2, 1.0, 0.0, 1.0)


def _clustered(copies: int, seed: int = 0) -> pd.DataFrame:
    """Two groups in three strata; every row repeated ``copies`` times within its
    unit, so the independent information is that of the rows without copies."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(60):
        g = "content" if u % 2 else "function"
        s_ = u % 3
        v = rng.normal(2.0 * (g == "content") + s_, 1.0)
        rows += [{"unit": u, "group": g, "stratum": s_, "value": v, "x": float(s_)}] * copies
    return pd.DataFrame(rows)


def test_frequency_controls_resample_whole_units():
    one, five = _clustered(1), _clustered(5)
    args = dict(n_boot=400, seed=1, min_per_cell=3)
    by_row = stats.stratified_difference(five, "value", "group", "stratum", a="function", b="content", **args).iloc[-1]
    by_unit = stats.stratified_difference(five, "value", "group", "stratum", a="function", b="content", unit="unit", **args).iloc[-1]
    plain = stats.stratified_difference(one, "value", "group", "stratum", a="function", b="content", **args).iloc[-1]
    assert by_unit["diff"] == pytest.approx(plain["diff"]) == pytest.approx(by_row["diff"])
    width = lambda r: r["hi"] - r["lo"]  # noqa: E731
    # Copies inside a unit add no information: resampling units keeps the width of the
    # copy-free data; resampling rows pretends to five times as many examples.
    assert width(by_unit) == pytest.approx(width(plain), rel=0.3)
    assert width(by_row) < 0.6 * width(by_unit)
    adj = dict(n_boot=300, seed=1)
    a_unit = stats.adjusted_difference(five, "value", "group", "x", a="function", b="content", unit="unit", **adj).iloc[0]
    a_row = stats.adjusted_difference(five, "value", "group", "x", a="function", b="content", **adj).iloc[0]
    a_plain = stats.adjusted_difference(one, "value", "group", "x", a="function", b="content", **adj).iloc[0]
    assert a_unit["estimate"] == pytest.approx(a_plain["estimate"])
    assert width(a_unit) == pytest.approx(width(a_plain), rel=0.3) and width(a_row) < 0.6 * width(a_unit)
    # Too few units for an interval: the estimate alone.
    few = five[five["unit"] < 6]
    r = stats.stratified_difference(few, "value", "group", "stratum", a="function", b="content", unit="unit", n_boot=50, min_per_cell=1)
    assert np.isfinite(r.iloc[-1]["diff"]) and np.isnan(r.iloc[-1]["lo"])
