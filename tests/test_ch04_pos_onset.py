"""Chapter 04's module on small constructed frames: onsets from layer 1, the rank-1
tables, the two frequency controls and what the summary may claim from them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from depthkit.analyses import summaries
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.chapters import ch04_pos_onset as ch

TAG_CLASS = {"DET": "function", "NOUN": "content"}


def k1_frame(n_per_class: int, gap_in_bin: float, seed: int = 0, bins: tuple[str, ...] = ("1-10", "11-30")) -> pd.DataFrame:
    """k = 1 onsets: in every frequency bin, content words ``gap_in_bin`` layers
    after function words, plus noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for b_i, b in enumerate(bins):
        for tag, cls in TAG_CLASS.items():
            for _ in range(n_per_class):
                base = 5 + 4 * b_i + (gap_in_bin if cls == "content" else 0)
                rows.append({"tag": tag, "word_class": cls, "onset": base + rng.normal(0, 1), "freq_bin": b,
                             "freq_rank": 10 ** (b_i + 0.5), "k": 1, "item": len(rows)})
    k1 = pd.DataFrame(rows)
    k1["freq_bin"] = pd.Categorical(k1["freq_bin"], categories=list(bins), ordered=True)
    return k1


def test_onsets_start_at_layer_1():
    # item 0 is at rank 1 from the embedding on (layer 0): its depth onset is layer 1
    targets = pd.DataFrame({"item": [0, 0, 0, 1, 1, 1], "layer": [0, 1, 2] * 2, "rank": [1, 1, 1, 1, 5, 1]})
    traj = SimpleNamespace(target=lambda name: targets)
    kept = pd.DataFrame({"tag": ["DET", "NOUN"], "word_class": ["function", "content"], "answer": [" the", " cat"],
                         "answer_id": [1, 2], "prompt": ["a b c", "d e f"]})
    freq = pd.DataFrame({"token_id": [0, 1, 2], "count": [1, 10, 5], "rank": [3, 1, 2]})
    on = ch.onsets_of(traj, kept, freq, [1, 10], ["DET", "NOUN"])
    k1 = on[on["k"] == 1].set_index("item")["onset"]
    assert k1.tolist() == [1.0, 2.0]
    assert on[on["k"] == 10].set_index("item")["onset"].tolist() == [1.0, 1.0]
    assert summaries.onset_layers(targets, [1]).set_index("item")["onset"].tolist() == [0.0, 0.0]  # the lens-only view
    assert on["prompt_end"].iloc[0] == "…a b c" and list(on["tag"].cat.categories) == ["DET", "NOUN"]


def test_rank1_tables_and_gap():
    k1 = k1_frame(20, 6.0).drop(columns="k")
    on = k1.assign(k=1)
    r1 = ch.rank1(on, 30, compare=True, n_boot=200, seed=0)
    assert set(r1["by_class"]["word_class"]) == {"function", "content"}
    assert abs(r1["gap"]["diff"] - 6.0) < 0.8 and r1["gap"]["lo"] > 0
    table = ch.rank1_table(r1, 30, "toy")
    assert table["group"].tolist() == ["DET", "NOUN", "content", "function", "function", "content"]
    assert table["source"].iloc[-1].startswith("paper (reference)")
    none = ch.rank1(on, 30, compare=False, n_boot=50, seed=0)
    assert none["gap"] is None and none["by_class"].empty


def test_both_controls_agreeing_make_a_finding():
    k1 = k1_frame(20, 3.0)
    c = ch.frequency_controls(k1, n_boot=300, seed=0)
    assert c["matched"]["used"].iloc[:-1].all() and c["adjusted"]["estimate"].iloc[0] > 2
    text = ch.frequency_verdict(c["matched"], c["adjusted"])
    assert text.startswith("At equal frequency content words reach rank 1 later than function words, by both controls")


def test_no_difference_in_both_controls_is_said_so():
    c = ch.frequency_controls(k1_frame(20, 0.0, seed=3), n_boot=300, seed=0)
    assert ch.frequency_verdict(c["matched"], c["adjusted"]).startswith("Neither frequency control finds a difference")


def test_thin_bins_are_left_out_and_a_lone_control_makes_no_finding():
    # one content example per bin: no bin holds MIN_PER_BIN of each class
    k1 = k1_frame(20, 6.0)
    k1 = pd.concat([k1[k1["word_class"] == "function"], k1[k1["word_class"] == "content"].groupby("freq_bin", observed=True).head(1)])
    c = ch.frequency_controls(k1, n_boot=200, seed=0)
    assert not c["matched"]["used"].iloc[:-1].any()
    text = ch.frequency_verdict(c["matched"], c["adjusted"])
    assert "cannot be made" in text and "cannot separate word class from frequency" in text and "later than" not in text


def test_controls_that_disagree_make_no_finding():
    matched = pd.DataFrame([{"stratum": "1-10", "used": True, "n_a": 30, "n_b": 30, "diff": -2.0, "lo": -3.0, "hi": -1.0},
                            {"stratum": "matched (weighted)", "used": True, "n_a": 30, "n_b": 30, "diff": -2.0, "lo": -3.0, "hi": -1.0}])
    adjusted = pd.DataFrame([{"estimate": 2.1, "lo": -1.2, "hi": 5.8, "slope": 1.0, "n_a": 30, "n_b": 30}])
    text = ch.frequency_verdict(matched, adjusted)
    assert text.startswith("The frequency controls do not agree") and "earlier" not in text
    assert "-2.0 layers (95 % CI -3.0–-1.0 layers)" in text and "2.1 layers (95 % CI -1.2–5.8 layers)" in text


def test_summary_without_a_comparison_gives_the_reason_and_no_class_numbers():
    on = k1_frame(12, 6.0).assign(k=1)
    r1 = ch.rank1(on, 30, compare=False, n_boot=50, seed=0)
    report = pd.DataFrame({"level": ["tag", "tag", "class", "class"], "group": ["DET", "NOUN", "function", "content"],
                           "word_class": ["function", "content", "function", "content"], "candidates": [100, 100, 100, 100],
                           "not_word": [0, 0, 0, 0], "kept": [24, 24, 24, 24], "kept_share": [0.24] * 4})
    text = ch.summary(report, r1, None, reason="Function and content words cannot be compared on this run: x.",
                      n_blocks=30, n_per_tag=100, lens_name="tuned", weights="Q4_1", minutes=1.0)
    assert "cannot be compared on this run" in text and "Function words" not in text and "layers 1 to 29; passages resampled" in text
    assert "0 % (95 % CI 0–" in text and "only at the output, not before" in text


def test_headlines_and_paper_rows():
    run = {"k1_by_class": pd.DataFrame({"word_class": ["function", "content"], "estimate": [5.0, 20.0],
                                        "lo": [4.0, 19.0], "hi": [6.0, 21.0], "n": [40, 40]})}
    out = ch.headlines(run)
    assert list(out.columns) == [*HEADLINE_COLUMNS, "censored"] and out["censored"].isna().all() and out["quantity"].tolist() == ["rank-1 onset, function words", "rank-1 onset, content words"]
    assert list(ch.PAPER.columns) == PAPER_COLUMNS and ch.PAPER["value"].tolist() == [5 / 32, 20 / 32]


def test_onsets_at_the_output_are_censored_and_passages_are_the_unit():
    # 20 passages, each giving one DET and one NOUN example; NOUN onsets of passages 0-4 are at L = 30
    rows = [{"tag": tag, "word_class": TAG_CLASS[tag], "k": 1, "passage": p, "item": 2 * p + (tag == "NOUN"),
             "onset": (30.0 if p < 5 else 20.0 + p % 3) if tag == "NOUN" else 5.0 + p % 3}
            for p in range(20) for tag in TAG_CLASS]
    on = pd.DataFrame(rows)
    on["tag"] = pd.Categorical(on["tag"], categories=list(TAG_CLASS), ordered=True)
    r1 = ch.rank1(on, 30, compare=True, n_boot=200, seed=0)
    noun = r1["by_tag"].set_index("tag").loc["NOUN"]
    assert noun["censored"] == 0.25 and noun["n_censored"] == 5 and noun["n_rows"] == 15
    assert abs(noun["estimate"] - np.mean([20.0 + p % 3 for p in range(5, 20)])) < 1e-9  # the five at L are not averaged in
    h = ch.headlines({"k1_by_class": r1["by_class"]}).set_index("quantity")
    assert h.loc["rank-1 onset, content words", "censored"] == 0.25 and h.loc["rank-1 onset, function words", "censored"] == 0
    assert h.loc["rank-1 onset, content words", "n"] == 15  # passages behind the mean
    # the gap resamples passages: examples of one passage go in or out together
    assert r1["gap"]["n"] == 20 and r1["gap"]["diff"] > 14 and r1["gap"]["lo"] > 0
    # duplicating every example within its passage changes no passage-level interval
    twice = ch.rank1(pd.concat([on, on.assign(item=on["item"] + 100)], ignore_index=True), 30, compare=True, n_boot=200, seed=0)
    assert twice["gap"]["n"] == 20
    assert np.isclose(twice["by_class"]["lo"], r1["by_class"]["lo"]).all()


def test_saturation_is_the_layer_from_which_the_answer_stays_within_k():
    # L = 4; layer 0 (the embedding) is no depth. Item 0 is top-1 at layer 1, loses it at 2, holds it from 3;
    # item 2 holds rank 1 only at the output row L.
    ranks = {0: [1, 1, 2, 1, 1], 1: [5, 1, 1, 1, 1], 2: [3, 3, 1, 2, 1]}
    targets = pd.DataFrame([{"item": i, "layer": l, "rank": r} for i, rs in ranks.items() for l, r in enumerate(rs)])
    sat = ch.saturation_layers(targets, [1, 2]).set_index(["item", "k"])["saturation"]
    assert sat.loc[(0, 1)] == 3 and sat.loc[(1, 1)] == 1 and sat.loc[(2, 1)] == 4
    assert sat.loc[(0, 2)] == 1 and sat.loc[(2, 2)] == 2  # within k = 2 item 2 holds from layer 2
    kept = pd.DataFrame({"tag": ["DET", "NOUN", "NOUN"], "word_class": ["function", "content", "content"], "answer": ["a", "b", "c"],
                         "answer_id": [1, 2, 2], "prompt": ["x", "y", "z"]})
    freq = pd.DataFrame({"token_id": [0, 1, 2], "count": [1, 10, 5], "rank": [3, 1, 2]})
    on = ch.onsets_of(SimpleNamespace(target=lambda name: targets), kept, freq, [1], ["DET", "NOUN"]).set_index("item")
    assert on["onset"].tolist() == [1.0, 1.0, 2.0] and on["saturation"].tolist() == [3.0, 1.0, 4.0]
    r1 = ch.rank1(on.reset_index(), 4, compare=False, n_boot=20, seed=0)
    assert r1["k1"]["sat_censored"].tolist() == [False, False, True]  # saturation at L: not before the output


def _two_depths(sat_gap: float, n_passages: int = 30, seed: int = 0) -> pd.DataFrame:
    """One DET and one NOUN example per passage: content words 6 layers later on first
    reach, ``sat_gap`` layers later on saturation; the NOUN saturations of passages 0-2 at L = 30."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_passages):
        for tag, cls in TAG_CLASS.items():
            c = cls == "content"
            onset = 5.0 + 6 * c + rng.integers(0, 3)
            sat = 15.0 + sat_gap * c + rng.integers(0, 3)
            rows.append({"tag": tag, "word_class": cls, "k": 1, "passage": p, "item": len(rows), "onset": onset,
                         "saturation": 30.0 if c and p < 3 else sat})
    on = pd.DataFrame(rows)
    on["tag"] = pd.Categorical(on["tag"], categories=list(TAG_CLASS), ordered=True)
    return on


def test_the_gap_is_reported_on_first_reach_and_on_saturation():
    r1 = ch.rank1(_two_depths(2.0), 30, compare=True, n_boot=300, seed=0)
    assert abs(r1["gap"]["diff"] - 6.0) < 1 and abs(r1["gap_sat"]["diff"] - 2.0) < 1 and r1["gap_sat"]["lo"] > 0
    assert r1["gap_sat"]["n"] == 30 and r1["gap_sat"]["n_b"] == 27  # the three saturations at L are censored, not averaged in
    k1 = r1["k1"]
    before = k1[k1["saturation"] < 30].groupby("word_class")["saturation"].mean()
    assert r1["gap_sat"]["diff"] == pytest.approx(before["content"] - before["function"])
    table = ch.class_gap_table(r1, 30).set_index("measure")
    assert table.index.tolist() == ["first reach", "saturation"] and table["paper's measure"].tolist() == [True, False]
    assert table.loc["saturation", "content − function (layers)"] == r1["gap_sat"]["diff"]
    assert table.loc["saturation", "content − function (L)"] == pytest.approx(r1["gap_sat"]["diff"] / 30)
    assert table.loc["saturation", "content: only at the output"].startswith("10 %")
    text = ch.gaps_text(r1, 30)
    first, sat = text.split("; on saturation (", 1)
    assert "on first reach" in first and "content words are 6." in first and "layers later than function words" in first
    assert f"content words are {r1['gap_sat']['diff']:.1f} layers later than function words" in sat
    assert f"i.e. +{r1['gap_sat']['diff'] / 30:.2f} L of the depth" in sat
    assert "layers smaller on saturation than on first reach" in text and r1["gap_change"].hi < 0
    assert "The paper's claim is about first reach" in text


def test_equal_gaps_are_no_clear_difference_and_old_runs_have_first_reach_only():
    r1 = ch.rank1(_two_depths(6.0), 30, compare=True, n_boot=300, seed=0)
    assert r1["gap_change"].lo < 0 < r1["gap_change"].hi
    assert "The two gaps show no clear difference" in ch.gaps_text(r1, 30)
    # onsets saved before saturation was measured: first reach only, nothing invented
    old = ch.rank1(_two_depths(6.0).drop(columns="saturation"), 30, compare=True, n_boot=100, seed=0)
    assert old["gap_sat"] is None and old["gap_change"] is None and old["by_class_sat"].empty
    assert ch.class_gap_table(old, 30)["measure"].tolist() == ["first reach"]
    assert "saturation" not in ch.gaps_text(old, 30).split("The paper's claim")[0]


def test_summary_reports_both_depths_and_which_one_the_paper_means():
    k1 = k1_frame(20, 6.0)
    on = k1.assign(saturation=k1["onset"].round() + 8 + 2 * (k1["word_class"] == "content"))
    r1 = ch.rank1(on, 30, compare=True, n_boot=100, seed=0)
    controls = ch.frequency_controls(r1["k1"], n_boot=100, seed=0)
    report = pd.DataFrame({"level": ["tag", "tag"], "group": ["DET", "NOUN"], "word_class": ["function", "content"],
                           "candidates": [100, 100], "not_word": [0, 0], "kept": [40, 40], "kept_share": [0.4, 0.4]})
    text = ch.summary(report, r1, controls, reason="", n_blocks=30, n_per_tag=100, lens_name="tuned", weights="Q4_1", minutes=1.0)
    assert "At rank 1, on first reach (" in text and "; on saturation (" in text and "The paper's claim is about first reach" in text
    assert text.index("on first reach") < text.index("The paper reports ≈ layer 5")


def test_the_gap_change_is_paired_over_the_same_passage_draws():
    # saturation = first reach + 9 for every example: the two gaps are equal in every resample
    on = _two_depths(6.0).drop(columns="saturation")
    on = on.assign(saturation=on["onset"] + 9)
    change = ch.rank1(on, 30, compare=True, n_boot=200, seed=0)["gap_change"]
    assert change.estimate == pytest.approx(0) and change.hi - change.lo < 1e-9
