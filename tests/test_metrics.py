"""depthkit.analyses.summaries on hand-made frames whose answers are worked out by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from depthkit import stats
from depthkit.analyses import summaries
from depthkit.analyses.frequency import BUCKETS

TOP, B100, B1000, REST = BUCKETS

# Token id i has frequency rank i + 1: ids 0-9 are "Top 1-10", 10-99 "11-100",
# 100-999 "101-1000", 1000+ "rest".
FREQ = pd.DataFrame(
    {
        "token_id": np.arange(2000),
        "count": np.arange(2000, 0, -1),
        "rank": np.arange(1, 2001),
        "share": np.arange(2000, 0, -1) / np.arange(2000, 0, -1).sum(),
    }
)

# Four prompts, layers 0-2. Layer 2 is the model's own prediction.
TOP1 = {0: [5, 50, 7], 1: [3, 3, 3], 2: [500, 1500, 60], 3: [1, 20, 20]}
STEPS = pd.DataFrame(
    [{"item": i, "position": 9, "layer": l, "top1_id": ids[l]} for i, ids in TOP1.items() for l in range(3)]
)


def _share(df, layer, bucket, col="share"):
    row = df[(df["layer"] == layer) & (df["bucket"] == bucket)]
    assert len(row) == 1
    return row[col].iloc[0]


def test_bucket_shares_by_hand():
    s = summaries.bucket_shares(STEPS, FREQ)
    assert len(s) == 3 * 4  # every (layer, bucket) pair, zeros included
    # layer 0: ids 5, 3, 500, 1 -> three in the Top-10, one in 101-1000
    assert _share(s, 0, TOP) == 0.75
    assert _share(s, 0, B100) == 0.0
    assert _share(s, 0, B1000) == 0.25
    assert _share(s, 0, TOP, "n") == 3
    # layer 1: ids 50, 3, 1500, 20
    assert _share(s, 1, TOP) == 0.25 and _share(s, 1, B100) == 0.5 and _share(s, 1, REST) == 0.25
    # layer 2: ids 7, 3, 60, 20
    assert _share(s, 2, TOP) == 0.5 and _share(s, 2, B100) == 0.5
    assert np.allclose(s.groupby("layer")["share"].sum(), 1.0)
    assert (s["n_total"] == 4).all()
    assert list(s["bucket"].cat.categories) == list(BUCKETS)


def test_bucket_shares_bootstrap_bounds_bracket_share():
    s = summaries.bucket_shares(STEPS, FREQ, n_boot=200, seed=1, min_n=1)
    assert (s["lo"] <= s["share"] + 1e-12).all() and (s["share"] <= s["hi"] + 1e-12).all()
    # a bucket that no prompt is in: 0 of 4, whose exact binomial upper bound is 1 - 0.025^(1/4), not a zero-width 0–0
    empty = s[(s["layer"] == 0) & (s["bucket"] == REST)]
    assert float(empty["lo"].iloc[0]) == 0.0 and abs(float(empty["hi"].iloc[0]) - (1 - 0.025 ** 0.25)) < 1e-9


def test_equal_mass_buckets_are_used_when_edges_given():
    edges = [0, 2, 50, 2000]  # buckets "Top 1-2" (ids 0-1), "3-50" (ids 2-49), "51+"
    s = summaries.bucket_shares(STEPS, FREQ, edges=edges)
    cats = list(s["bucket"].cat.categories)
    assert len(cats) == 3
    # layer 0: ids 5, 3, 500, 1 -> ranks 6, 4, 501, 2 -> buckets 2nd, 2nd, 3rd, 1st
    assert _share(s, 0, cats[0]) == 0.25 and _share(s, 0, cats[1]) == 0.5 and _share(s, 0, cats[2]) == 0.25


def test_flip_rates_by_hand():
    f = summaries.flip_rates(STEPS, FREQ)
    # layer 0: Top-10 guesses are items 0 (5 -> 7 flips), 1 (3 = 3), 3 (1 -> 20 flips)
    assert _share(f, 0, TOP, "flip_rate") == pytest.approx(2 / 3)
    assert _share(f, 0, TOP, "n") == 3 and _share(f, 0, TOP, "n_flipped") == 2
    assert _share(f, 0, B1000, "flip_rate") == 1.0
    # layer 1: 50 -> 7 flips, 20 = 20 does not; 3 = 3; 1500 -> 60 flips
    assert _share(f, 1, B100, "flip_rate") == 0.5
    assert _share(f, 1, TOP, "flip_rate") == 0.0
    assert _share(f, 1, REST, "flip_rate") == 1.0
    assert (f.loc[f["layer"] == 2, "flip_rate"] == 0).all()
    # pairs with no prediction have no row
    assert f[(f["layer"] == 0) & (f["bucket"] == REST)].empty


def test_flip_rates_against_a_given_final_prediction():
    # Say the model's own top-1 for item 1 were 4 instead of 3: its layer-0 and layer-1
    # guess (3) now flips, and so does the deepest lens reading.
    final = pd.DataFrame({"item": [0, 1, 2, 3], "position": 9, "token_id": [7, 4, 60, 20]})
    f = summaries.flip_rates(STEPS, FREQ, final=final)
    assert _share(f, 0, TOP, "flip_rate") == 1.0
    assert _share(f, 2, TOP, "flip_rate") == 0.5
    with pytest.raises(ValueError, match="cover every item"):
        summaries.flip_rates(STEPS, FREQ, final=final.iloc[:3])


def test_agreement_by_layer_by_hand():
    guesses = pd.DataFrame(
        [
            *({"item": i, "position": 9, "guess": "unigram", "token_id": 3} for i in range(4)),
            {"item": 0, "position": 9, "guess": "bigram", "token_id": 50},
            {"item": 3, "position": 9, "guess": "bigram", "token_id": 20},
        ]
    )
    a = summaries.agreement_by_layer(STEPS, guesses)
    uni = a[a["guess"] == "unigram"].set_index("layer")
    assert uni["share"].tolist() == [0.25, 0.25, 0.25]  # only item 1 says 3
    bi = a[a["guess"] == "bigram"].set_index("layer")
    assert bi.loc[0, "n"] == 2  # items without a bigram guess are left out
    assert bi["n_agree"].tolist() == [0, 2, 1]  # layer 1: 50 and 20; layer 2: 20


def test_log_grid():
    assert summaries.log_grid(10000, 4) == [1, 2, 3, 6, 10, 18, 32, 56, 100, 178, 316, 562, 1000, 1778, 3162, 5623, 10000]
    assert summaries.log_grid(100, 1) == [1, 10, 100]
    assert summaries.log_grid(50, 1) == [1, 10, 50]
    assert summaries.log_grid(1) == [1]
    with pytest.raises(ValueError, match="max_k"):
        summaries.log_grid(0)
    with pytest.raises(ValueError, match="per_decade"):
        summaries.log_grid(100, 0)


RANKS = {0: [50, 3, 1, 2], 1: [100, 200, 20, 5]}
TARGETS = pd.DataFrame(
    [
        {"item": i, "position": 4, "layer": l, "target": "answer", "rank": r}
        for i, rs in RANKS.items()
        for l, r in enumerate(rs)
    ]
)
KS = [1, 2, 3, 5, 10, 50, 100]


def test_onset_layers_by_hand():
    o = summaries.onset_layers(TARGETS, KS)
    assert list(o.columns) == ["item", "position", "k", "onset"]
    got = o.pivot(index="item", columns="k", values="onset")
    np.testing.assert_array_equal(got.loc[0].to_numpy(), [2, 2, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(got.loc[1].to_numpy(), [np.nan, np.nan, np.nan, 3, 3, 2, 0])


def test_onset_is_earliest_not_last_entry():
    # rank 1 at layer 1, lost at layer 2, back at 3: the onset is layer 1
    t = pd.DataFrame({"item": 0, "layer": [0, 1, 2, 3], "rank": [9, 1, 4, 1]})
    o = summaries.onset_layers(t, [1, 4, 9])
    assert o["onset"].tolist() == [1, 1, 0]


def test_onset_layers_needs_one_target():
    both = pd.concat([TARGETS, TARGETS.assign(target="final")])
    with pytest.raises(ValueError, match="several targets"):
        summaries.onset_layers(both, KS)
    picked = summaries.onset_layers(both, KS, target="answer")
    pd.testing.assert_frame_equal(picked, summaries.onset_layers(TARGETS, KS))
    with pytest.raises(ValueError, match="No target"):
        summaries.onset_layers(both, KS, target="gold")


def test_onset_curve_by_hand():
    o = summaries.onset_layers(TARGETS, KS)
    c = summaries.onset_curve(o).set_index("k")
    assert c.loc[1, "mean_onset"] == 2.0 and c.loc[1, "n_reached"] == 1 and c.loc[1, "n_items"] == 2
    assert c.loc[5, "mean_onset"] == 2.0 and c.loc[5, "n_reached"] == 2  # (1 + 3) / 2
    assert c.loc[50, "mean_onset"] == 1.0  # (0 + 2) / 2
    # grouped
    o = o.merge(pd.DataFrame({"item": [0, 1], "tag": ["DET", "NOUN"]}), on="item")
    g = summaries.onset_curve(o, by=["tag"], n_boot=50, min_n=1)
    noun = g[g["tag"] == "NOUN"].set_index("k")
    assert np.isnan(noun.loc[1, "mean_onset"]) and noun.loc[1, "n_reached"] == 0
    assert noun.loc[5, "mean_onset"] == 3.0 and noun.loc[5, "lo"] == 3.0 and noun.loc[5, "hi"] == 3.0


def test_bootstrap_ci_constant_and_reproducible():
    ci = stats.bootstrap_ci([2.0] * 10)
    assert ci == stats.CI(2.0, 2.0, 2.0, 10)
    v = np.random.default_rng(5).normal(size=50)
    assert stats.bootstrap_ci(v, seed=3) == stats.bootstrap_ci(v, seed=3)
    assert stats.bootstrap_ci(v, seed=3) != stats.bootstrap_ci(v, seed=4)


def test_bootstrap_ci_matches_a_written_out_percentile_bootstrap():
    v = np.array([0.0, 1.0, 1.0, 3.0, 7.0, 2.0, 2.0, 5.0])
    rng = np.random.default_rng(11)
    means = [v[rng.integers(0, len(v), len(v))].mean() for _ in range(400)]
    lo, hi = np.quantile(means, [0.05, 0.95])
    ci = stats.bootstrap_ci(v, n_boot=400, seed=11, level=0.90, min_n=1)
    assert ci.estimate == v.mean()
    assert ci.lo == pytest.approx(lo) and ci.hi == pytest.approx(hi)


def test_bootstrap_ci_width_matches_normal_theory():
    v = np.random.default_rng(0).normal(loc=1.0, scale=2.0, size=400)
    ci = stats.bootstrap_ci(v, n_boot=2000)
    expected = 2 * 1.96 * v.std(ddof=1) / np.sqrt(len(v))
    assert ci.hi - ci.lo == pytest.approx(expected, rel=0.15)
    assert ci.lo < v.mean() < ci.hi


def test_bootstrap_ci_other_statistics_and_nan():
    v = [1.0, 2.0, np.nan, 4.0, 100.0]
    med = stats.bootstrap_ci(v, stat=np.median, n_boot=100)
    assert med.estimate == 3.0 and med.n == 4
    spread = stats.bootstrap_ci(v, stat=lambda x: x.max() - x.min(), n_boot=100, min_n=1)  # no axis= argument
    assert spread.estimate == 99.0 and 0 <= spread.lo <= spread.hi <= 99.0
    with pytest.raises(ValueError, match="NaN"):
        stats.bootstrap_ci(v, dropna=False)
    assert np.isnan(stats.bootstrap_ci([np.nan]).estimate)
    with pytest.raises(ValueError, match="level"):
        stats.bootstrap_ci([1.0], level=95)


def test_bootstrap_ci_by_groups():
    df = pd.DataFrame({"g": ["a", "a", "b", "b", "b"], "v": [1.0, 1.0, 2.0, 4.0, 6.0]})
    out = stats.bootstrap_ci_by(df, "v", "g", n_boot=100, min_n=1).set_index("g")
    assert out.loc["a", "estimate"] == 1.0 and out.loc["a", "lo"] == 1.0 and out.loc["a", "n"] == 2
    assert out.loc["b", "estimate"] == 4.0 and out.loc["b", "lo"] < 4.0 < out.loc["b", "hi"]


def test_rank_bins():
    b = summaries.rank_bins([1, 10, 11, 30, 31, 3000, 3001])
    assert list(b.codes) == [0, 0, 1, 1, 2, 5, 6]
    assert list(b.categories) == ["1-10", "11-30", "31-100", "101-300", "301-1000", "1001-3000", ">3000"]
    with pytest.raises(ValueError, match="increasing"):
        summaries.rank_bins([1], edges=[10, 5])


def test_stratified_difference_by_hand():
    df = pd.DataFrame(
        {
            "onset": [1.0, 3.0, 5.0, 10.0, 10.0, 14.0, 2.0, np.nan],
            "cls": ["f", "f", "c", "f", "c", "c", "f", "c"],
            "bin": ["s1", "s1", "s1", "s2", "s2", "s2", "s3", "s3"],
        }
    )
    out = stats.stratified_difference(df, "onset", "cls", "bin", a="f", b="c", n_boot=200, min_per_cell=1, min_n=1).set_index("stratum")
    assert out.loc["s1", "diff"] == 3.0  # 5 - (1 + 3) / 2
    assert out.loc["s2", "diff"] == 2.0  # (10 + 14) / 2 - 10
    assert np.isnan(out.loc["s3", "diff"])  # the only "c" value is NaN
    pooled = out.loc["matched (weighted)"]
    assert pooled["diff"] == 2.5  # both strata have 3 rows
    assert pooled["lo"] <= 2.5 <= pooled["hi"]
    assert pooled["n_a"] == 3 and pooled["n_b"] == 3


def test_bad_input_messages():
    with pytest.raises(ValueError, match="lacks column"):
        summaries.bucket_shares(STEPS.drop(columns="top1_id"), FREQ)
    with pytest.raises(ValueError, match="empty"):
        summaries.bucket_shares(STEPS.iloc[:0], FREQ)


def test_adjusted_difference_recovers_a_known_effect():
    cov = np.array([0.0, 1.0, 2.0, 1.5, 2.5, 3.5])
    cls = np.array(["f", "f", "f", "c", "c", "c"])
    onset = 2 + 3 * cov + 5 * (cls == "c")  # exactly linear: the fit is exact, so is every resample
    out = stats.adjusted_difference(pd.DataFrame({"o": onset, "g": cls, "x": cov}), "o", "g", "x", a="f", b="c", n_boot=50, min_n=1)
    r = out.iloc[0]
    assert r["estimate"] == pytest.approx(5) and r["slope"] == pytest.approx(3)
    assert r["lo"] == pytest.approx(5) and r["hi"] == pytest.approx(5)
    # A pure frequency effect: the raw difference is large, the adjusted one is zero.
    rng = np.random.default_rng(0)
    x = np.r_[rng.uniform(0, 2, 50), rng.uniform(1, 3, 50)]
    g = np.r_[["f"] * 50, ["c"] * 50]
    y = 4 * x + rng.normal(scale=0.1, size=100)
    df = pd.DataFrame({"o": y, "g": g, "x": x})
    raw = df.loc[df.g == "c", "o"].mean() - df.loc[df.g == "f", "o"].mean()
    adj = stats.adjusted_difference(df, "o", "g", "x", a="f", b="c", n_boot=200).iloc[0]
    assert raw > 3
    assert abs(adj["estimate"]) < 0.1 and adj["lo"] < 0 < adj["hi"]
    # one group missing: no estimate, no crash
    assert np.isnan(stats.adjusted_difference(df[df.g == "f"], "o", "g", "x", a="f", b="c").iloc[0]["estimate"])


@pytest.mark.parametrize(
    ("diff", "than", "expected"),
    [
        (16.94, None, "16.9 layers later"),
        (-5.44, "function words", "5.4 layers earlier than function words"),
        (1.0, None, "1.0 layer later"),
        (0.04, "function words", "at the same layer as function words"),
        (-0.04, None, "at the same layer"),
    ],
)
def test_layers_later_words_the_sign(diff: float, than: str | None, expected: str) -> None:
    assert summaries.layers_later(diff, than) == expected


def test_layers_later_refuses_nan() -> None:
    with pytest.raises(ValueError, match="No layer difference"):
        summaries.layers_later(float("nan"))


# --------------------------------------------------------------------------- the one bootstrap (depthkit.stats)


def test_no_interval_below_the_minimum_number_of_units():
    few = stats.bootstrap_ci(np.arange(stats.MIN_N - 1, dtype=float))
    assert few.n == stats.MIN_N - 1 and np.isfinite(few.estimate) and np.isnan(few.lo) and np.isnan(few.hi)
    enough = stats.bootstrap_ci(np.arange(stats.MIN_N, dtype=float))
    assert enough.lo < enough.estimate < enough.hi


def test_unit_mean_resamples_whole_units_not_rows():
    # Two passages: one of 100 tokens all 1.0, one of 100 tokens all 0.0. Rows are
    # not independent: with passages as the unit, a resample holds 0, 1 or 2 copies
    # of each passage, so the interval spans most of [0, 1]; rows as units would
    # give a narrow interval around 0.5.
    rows = pd.DataFrame({"passage": np.repeat(np.arange(12), 50), "v": np.repeat(np.arange(12) % 2, 50).astype(float)})
    out = stats.unit_mean(rows, "v", unit="passage", n_boot=2000, seed=0).iloc[0]
    assert out["estimate"] == 0.5 and out["n"] == 12 and out["n_rows"] == 600
    by_rows = stats.bootstrap_ci(rows["v"], n_boot=2000, seed=0)
    assert (out["hi"] - out["lo"]) > 3 * (by_rows.hi - by_rows.lo)
    # Written out: the same resampling of passage means (equal sizes) by hand.
    means = rows.groupby("passage")["v"].mean().to_numpy()
    rng = np.random.default_rng(0)
    boot = means[rng.integers(0, 12, size=(2000, 12))].mean(1)
    assert (out["lo"], out["hi"]) == pytest.approx(tuple(np.quantile(boot, [0.025, 0.975])))


def test_stratified_difference_skips_thin_cells_and_weights_by_precision():
    rng = np.random.default_rng(0)
    df = pd.concat(
        [
            pd.DataFrame({"bin": "s1", "cls": ["f"] * 40 + ["c"] * 1, "onset": np.r_[np.zeros(40), 30.0]}),  # one content word
            pd.DataFrame({"bin": "s2", "cls": ["f"] * 20 + ["c"] * 20, "onset": np.r_[rng.normal(0, 1, 20), rng.normal(2, 1, 20)]}),
            pd.DataFrame({"bin": "s3", "cls": ["f"] * 10 + ["c"] * 40, "onset": np.r_[rng.normal(0, 1, 10), rng.normal(4, 1, 40)]}),
        ]
    )
    out = stats.stratified_difference(df, "onset", "cls", "bin", a="f", b="c", n_boot=300).set_index("stratum")
    assert not out.loc["s1", "used"] and np.isnan(out.loc["s1", "diff"])
    w2, w3 = 20 * 20 / 40, 10 * 40 / 50
    want = (w2 * out.loc["s2", "diff"] + w3 * out.loc["s3", "diff"]) / (w2 + w3)
    pooled = out.loc["matched (weighted)"]
    assert pooled["diff"] == pytest.approx(want) and pooled["n_a"] == 30 and pooled["n_b"] == 60
    assert pooled["lo"] < pooled["diff"] < pooled["hi"]


def test_first_layer_reaching():
    assert stats.first_layer_reaching([0, 1, 2, 3], [0.1, 0.5, 0.4, 0.9], 0.5) == 1
    assert np.isnan(stats.first_layer_reaching([0, 1], [0.1, 0.2], 0.5))


def test_an_interval_of_resamples_that_are_all_nan_is_nan_without_a_warning():
    import warnings

    from depthkit import stats

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lo, hi = stats.interval(np.full(50, np.nan))
        assert np.isnan(lo) and np.isnan(hi)
        assert stats.interval(np.r_[np.full(10, np.nan), np.arange(100.0)]) == pytest.approx((2.475, 96.525))
