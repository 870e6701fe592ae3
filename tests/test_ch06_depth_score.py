"""Chapter 06's module on small constructed frames."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from depthkit import stats
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.chapters import ch06_depth_score as ch

WORDS = [("DET", 0.1), ("ADP", 0.15), ("NOUN", 0.5), ("VERB", 0.55), ("INTJ", 0.3)]


def _scores(n_items: int = 12, per_item: int = 20, gap: float = 0.4, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Scores and tags: content words (NOUN, VERB) ``gap`` later than function words
    (DET, ADP); every fifth token wrong, every seventh not a first piece."""
    rng = np.random.default_rng(seed)
    rows, tags = [], []
    for i in range(n_items):
        for t in range(per_item):
            tag, base = WORDS[t % len(WORDS)]
            d1 = base + (gap - 0.4) * (tag in ("NOUN", "VERB")) + rng.normal(0, 0.02)
            rows.append({"item": i, "position": t, "d1_norm": d1, "d_sat_norm": min(d1 + 0.3, 1.0),
                         "flips_norm": 0.1, "correct": t % 5 != 4, "bucket": "top-10" if t % 2 else "rest"})
            tags.append({"item": i, "position": t, "pos": tag, "first_piece": t % 7 != 6})
    return pd.DataFrame(rows), pd.DataFrame(tags)


def test_group_depths_resample_passages_not_tokens():
    scores, _ = _scores(n_items=stats.MIN_N - 1, per_item=50)
    out = ch.group_depths(scores, "bucket", n_boot=50, seed=0)
    assert set(out["measure"]) == set(ch.MEASURES)
    assert (out["n"] == stats.MIN_N - 1).all() and (out["n_rows"] == 225).all()
    assert out["lo"].isna().all()  # 450 tokens, but only 9 passages: no interval
    enough = ch.group_depths(_scores()[0], "bucket", n_boot=50, seed=0)
    assert (enough["lo"] <= enough["estimate"]).all() and (enough["estimate"] <= enough["hi"]).all()


def test_pos_tables_keep_correct_first_pieces_of_frequent_tags():
    scores, tags = _scores()
    tagged, kept, pos_summary, class_summary = ch.pos_tables(scores, tags, min_group=10, n_boot=20, seed=0)
    assert len(tagged) == len(scores)
    assert kept["correct"].all() and kept["first_piece"].all()
    assert "INTJ" not in set(kept["pos"])  # every INTJ token is wrong (t % 5 == 4)
    assert set(class_summary["word_class"]) == {"function", "content"}
    assert set(pos_summary["pos"]) == {"DET", "ADP", "NOUN", "VERB"}
    none = ch.pos_tables(scores, tags, min_group=10_000, n_boot=20, seed=0)
    assert none[2].empty and none[3].empty


def test_class_difference_is_a_finding_only_when_its_interval_excludes_zero():
    scores, tags = _scores(gap=0.4)
    _, kept, _, cls = ch.pos_tables(scores, tags, min_group=10, n_boot=50, seed=0)
    gap = ch.class_difference(kept, n_boot=200, seed=0)
    assert gap.n == 12 and gap.lo > 0.3 and abs(gap.estimate - 0.4) < 0.05
    buckets = ch.group_depths(scores, "bucket", n_boot=50, seed=0)
    assert "content words are 0.40 L later than function words" in ch.groups_text(buckets, cls, gap, scores)
    scores0, tags0 = _scores(gap=0.0)
    _, kept0, _, cls0 = ch.pos_tables(scores0, tags0, min_group=10, n_boot=50, seed=0)
    gap0 = ch.class_difference(kept0, n_boot=200, seed=0)
    text = ch.groups_text(buckets, cls0, gap0, scores0)
    assert "no clear difference between content words and function words" in text


def test_groups_text_without_both_classes():
    scores, _ = _scores()
    buckets = ch.group_depths(scores, "bucket", n_boot=20, seed=0)
    empty = pd.DataFrame(columns=["word_class", *ch.GROUP_COLUMNS])
    text = ch.groups_text(buckets, empty, stats.CI(np.nan, np.nan, np.nan, 0), scores)
    assert "Too few correctly predicted" in text


def test_dtr_text_has_no_interval_from_few_passages():
    scores, _ = _scores(n_items=4)
    dtr = ch.dtr_table(scores, 0.85)
    assert list(dtr.columns) == ["item", "n_tokens", "n_deep", "dtr", "accuracy"]
    assert "cannot be measured here" in ch.dtr_text(dtr, 0.85, n_boot=20, seed=0)
    many = ch.dtr_table(_scores(n_items=12)[0].assign(d_sat_norm=lambda d: np.where(d["position"] < 5, 0.9, 0.5)), 0.85)
    text = ch.dtr_text(many, 0.85, n_boot=50, seed=0)
    # every resample gives 25 %: no "CI 25.0–25.0" printed as if precise
    assert "**25.0 % (in at least 95 % of resamples)**" in text and "over the 12 passages" in text


def test_verify_text_counts_passages():
    v = pd.DataFrame({"n_tokens": [30, 30], "same_as_simulated": [1.0, 0.95]})
    assert "30 tokens of 1 passage, " in ch.verify_text(v, 1, 2.0) and "at least 95.00%" in ch.verify_text(v, 1, 2.0)
    assert "of 2 passages," in ch.verify_text(v, 2, 2.0)


def _saving(conf: float) -> pd.DataFrame:
    return pd.DataFrame({"policy": list(ch.POLICIES), "target": 0.99, "param": [0.9 if conf == conf else np.nan, 20, np.nan, np.nan],
                         "agreement": 0.99, "frac_layers": [1 - conf, 0.7, 0.6, 0.5], "saving": [conf, 0.3, 0.4, 0.5]})


def test_exit_text_and_verify_taus():
    info = SimpleNamespace(name="m", n_blocks=30, d_model=10, d_vocab=1000)
    sweep = pd.DataFrame({"policy": ["confidence"] * 2, "param": [0.5, 0.999]})
    text = ch.exit_text(_saving(np.nan), sweep, target=0.99, info=info, block_params=100)
    assert "never reaches this agreement" in text and "up to 0.999" in text and "costs more" in text
    assert "save **20%**" in ch.exit_text(_saving(0.2), sweep, target=0.99, info=info, block_params=100_000)
    held = ch.exit_text(_saving(0.2), sweep, target=0.99, info=info, block_params=100, n_select=12, n_report=12)
    assert "chosen on 12 passages" in held and "measured on the other 12" in held
    assert ch.verify_taus(_saving(0.2), [0.5]) == [0.5, 0.9]
    assert ch.verify_taus(_saving(np.nan), [0.9, 0.5]) == [0.5, 0.9]


def test_first_passages_cut_every_table():
    @dataclass
    class T:
        steps: pd.DataFrame
        topk: pd.DataFrame
        targets: pd.DataFrame
        lens: str

    df = pd.DataFrame({"item": [0, 1, 2, 2], "x": range(4)})
    cut = ch.first_passages(T(df, df, df, "tuned"), 2)
    assert cut.steps["item"].tolist() == [0, 1] and cut.targets.index.tolist() == [0, 1] and cut.lens == "tuned"
    df4 = pd.DataFrame({"item": [0, 1, 2, 3, 3], "x": range(5)})
    select, report = ch.split_passages(T(df4, df4, df4, "tuned"))
    assert select.steps["item"].tolist() == [0, 1] and report.steps["item"].tolist() == [2, 3, 3]
    assert not set(select.targets["item"]) & set(report.targets["item"])


def test_headline_table_and_headlines_keep_chapter_07_names():
    scores, _ = _scores()
    dtr = ch.dtr_table(scores, 0.85)
    table = ch.headline_table(scores, dtr, _saving(0.2), 0.99, n_boot=50, seed=0)
    assert table["quantity"].tolist() == [
        "mean onset depth d1/L", "mean saturation depth d_sat/L", "mean flips / L", "mean deep-thinking ratio",
        "block saving at 99% agreement, confidence policy", "block saving at 99% agreement, fixed exit",
        "block saving at 99% agreement, oracle (d_sat)", "block saving at 99% agreement, oracle (d_1)",
    ]
    assert table["value"].iloc[0] == scores["d1_norm"].mean() and (table["n"] == 12).all()
    assert table["lo"].iloc[0] < table["value"].iloc[0] < table["hi"].iloc[0]
    out = ch.headlines({"headline": table})
    assert list(out.columns) == [*HEADLINE_COLUMNS, "censored"]
    assert out["censored"].iloc[0] == 0 and out["censored"].iloc[1:].isna().all()
    assert out["scale"].tolist() == ["other"] * 3 + ["share"] * 5
    assert out["value"].iloc[4] == 0.2
    # Runs saved before the intervals existed have quantity and value only.
    old = ch.headlines({"headline": table[["quantity", "value"]]})
    assert old["lo"].isna().all() and list(ch.PAPER.columns) == PAPER_COLUMNS


def test_d1_at_the_output_is_censored_not_averaged_in():
    scores, tags = _scores()
    # every fourth token reaches rank 1 only at row L: d1/L = 1
    scores.loc[scores["position"] % 4 == 0, "d1_norm"] = 1.0
    before = scores.loc[scores["d1_norm"] < 1, "d1_norm"].mean()
    table = ch.headline_table(scores, ch.dtr_table(scores, 0.85), _saving(0.2), 0.99, n_boot=50, seed=0)
    d1 = table.set_index("quantity").loc["mean onset depth d1/L"]
    assert d1["value"] == pytest.approx(before) and d1["censored"] == 0.25
    summary = ch.summary_table(scores, 30).set_index("measure")
    assert summary.loc["d1_norm", "mean"] == pytest.approx(before) and summary.loc["d1_norm", "at the output"] == 0.25
    groups = ch.group_depths(scores, "bucket", n_boot=50, seed=0)
    d1g = groups[groups["measure"] == "d1_norm"].set_index("bucket")
    assert (d1g["estimate"] < 1).all() and d1g.loc["rest", "censored"] == 0.5  # the censored positions are all even
    # none censored among 12 passages: the exact bound 1 - 0.025^(1/12), not a zero-width interval
    assert d1g.loc["top-10", "censored"] == 0 and d1g.loc["top-10", "censored_hi"] == pytest.approx(1 - 0.025 ** (1 / 12))
    text = ch.groups_text(groups, groups.iloc[:0].assign(word_class=[]), stats.CI(np.nan, np.nan, np.nan, 0), scores)
    assert "before the output (" in text and "only at the output, not before" in text


def _two_depths(sat_gap: float, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Content words 0.4 L later than function words on first reach and ``sat_gap`` L later on saturation."""
    scores, tags = _scores(gap=0.4, seed=seed)
    rng = np.random.default_rng(seed + 1)
    content = scores["position"] % len(WORDS) >= 2  # NOUN, VERB (and INTJ, never kept: every INTJ token is wrong)
    scores["d_sat_norm"] = 0.6 + sat_gap * content + rng.normal(0, 0.02, len(scores))
    return scores, tags


def test_class_gaps_report_first_reach_and_saturation():
    scores, tags = _two_depths(0.1)
    _, kept, _, cls = ch.pos_tables(scores, tags, min_group=10, n_boot=100, seed=0)
    gaps = ch.class_gaps(kept, n_boot=200, seed=0)
    assert abs(gaps["d1_norm"].estimate - 0.4) < 0.02 and abs(gaps["d_sat_norm"].estimate - 0.1) < 0.02
    assert gaps["d_sat_norm"].lo > 0 and gaps["change"].hi < 0 and gaps["change"].n == 12
    # the first-reach gap is the verdicts' class_difference, on the same passage draws
    assert gaps["d1_norm"] == ch.class_difference(kept, "d1_norm", n_boot=200, seed=0)
    assert gaps["d_sat_norm"] == ch.class_difference(kept, "d_sat_norm", n_boot=200, seed=0)
    table = ch.class_gap_table(cls, gaps).set_index("measure")
    assert table.index.tolist() == ["first reach (d₁/L)", "saturation (d_sat/L)"]
    assert table["paper's measure"].tolist() == [True, False] and (table["passages"] == 12).all()
    assert table.loc["saturation (d_sat/L)", "content − function (L)"] == gaps["d_sat_norm"].estimate
    buckets = ch.group_depths(scores, "bucket", n_boot=20, seed=0)
    text = ch.groups_text(buckets, cls, gaps, scores)
    first, sat = text.split(" On saturation, ", 1)
    assert "On first reach" in first and "content words are 0.40 L later than function words" in first
    assert f"content words are {gaps['d_sat_norm'].estimate:.2f} L later than function words" in sat
    assert f"The content − function gap is {abs(gaps['change'].estimate):.2f} L smaller on saturation than on first reach" in sat
    assert "The paper's claim is about first reach" in sat


def test_equal_class_gaps_are_no_clear_change_and_d1_at_the_output_is_left_out():
    scores, tags = _two_depths(0.4)
    _, kept, _, cls = ch.pos_tables(scores, tags, min_group=10, n_boot=50, seed=0)
    gaps = ch.class_gaps(kept, n_boot=200, seed=0)
    assert gaps["change"].lo < 0 < gaps["change"].hi
    assert "The two gaps show no clear difference" in ch.gaps_text(cls, gaps)
    # a content word reaching rank 1 only at the output is censored on first reach, still a value on saturation
    late = kept.assign(d1_norm=np.where((kept["pos"] == "NOUN") & (kept["item"] < 6), 1.0, kept["d1_norm"]))
    g = ch.class_gaps(late, n_boot=50, seed=0)
    assert g["d1_norm"].estimate < 0.41 and g["d_sat_norm"].estimate == pytest.approx(gaps["d_sat_norm"].estimate)


def _dtr(rho_sign: float, n: int = 30, noise: float = 0.02, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = np.linspace(0.1, 0.5, n)
    return pd.DataFrame({"item": range(n), "n_tokens": 50, "n_deep": (x * 50).astype(int), "dtr": x,
                         "accuracy": 0.5 + rho_sign * x + rng.normal(0, noise, n)})


@pytest.mark.parametrize("sign", [-1.0, 1.0])
def test_the_sign_of_a_clear_correlation_is_read_for_the_hypothesis(sign):
    text = ch.dtr_text(_dtr(sign), 0.85, n_boot=200, seed=0)
    corr = ch.dtr_correlation(_dtr(sign), n_boot=200, seed=0)
    assert np.sign(corr.estimate) == np.sign(corr.lo) == np.sign(corr.hi) == sign
    assert f"ρ = {corr.estimate:.2f} (95 % CI {corr.lo:.2f}–{corr.hi:.2f})" in text
    if sign < 0:
        assert "The correlation is negative and its interval" in text and "depth tracks difficulty" in text
        assert "does not support the hypothesis" in text and "positive" not in text
    else:
        assert "The correlation is positive and its interval" in text and "the direction Chen et al. report" in text
        assert "negative" not in text and "depth tracks difficulty" not in text


def test_a_correlation_whose_interval_holds_zero_makes_no_finding():
    flat = _dtr(0.0, noise=0.2)
    corr = ch.dtr_correlation(flat, n_boot=200, seed=0)
    assert corr.lo < 0 < corr.hi
    text = ch.dtr_text(flat, 0.85, n_boot=200, seed=0)
    assert "includes zero: no clear association" in text and "neither supports nor contradicts" in text
    assert "negative" not in text and "positive" not in text
    # an end that prints as zero carries no sign (the seed-1 robustness run had -0.77 to -0.0034)
    edge = ch.sign_text(stats.CI(-0.43, -0.77, -0.0034, 30))
    assert "(95 % CI -0.77 to -0.00) reaches zero at the precision shown: no clear association" in edge and "negative" not in edge
    assert "is negative" in ch.sign_text(stats.CI(-0.43, -0.77, -0.006, 30))
    few = ch.dtr_text(_dtr(-1.0, n=6), 0.85, n_boot=50, seed=0)
    assert "no sign is read" in few and "depth tracks difficulty" not in few


def test_deep_thinking_tokens_accuracy_gap_resamples_passages():
    scores, _ = _scores(n_items=12, per_item=20)
    deep = scores["position"] < 10
    scores = scores.assign(d_sat_norm=np.where(deep, 0.9, 0.5), correct=np.where(deep, scores["position"] % 2 == 0, True))
    gap = ch.deep_token_accuracy(scores, 0.85, n_boot=200, seed=0)
    assert gap.estimate == pytest.approx(-0.5) and gap.n == 12 and gap.hi < 0
    text = ch.sign_text(stats.CI(-0.5, -0.8, -0.2, 12), gap)
    assert "deep-thinking tokens are 50.0 percentage points less often right than the other tokens" in text
    none = ch.deep_token_accuracy(scores.assign(d_sat_norm=0.5), 0.85, n_boot=20, seed=0)
    assert np.isnan(none.estimate) and "Token by token" not in ch.sign_text(stats.CI(-0.5, -0.8, -0.2, 12), none)


def test_the_class_gap_change_is_paired_over_the_same_passage_draws():
    scores, tags = _scores()
    _, kept, _, _ = ch.pos_tables(scores.assign(d_sat_norm=scores["d1_norm"] + 0.2), tags, min_group=10, n_boot=20, seed=0)
    change = ch.class_gaps(kept, n_boot=200, seed=0)["change"]
    assert change.estimate == pytest.approx(0) and change.hi - change.lo < 1e-9
