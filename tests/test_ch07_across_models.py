"""Chapter 07 reads other chapters' saved runs through their headline API, puts
layers on ℓ/L and keeps the paper's rows apart."""

from __future__ import annotations

import pandas as pd
import pytest

from depthkit.chapters import ch07_across_models as across
from depthkit.chapters import headlines
from depthkit.core.results import RunRecorder


def _save_pos_run(root, name: str, n_blocks: int, function: float, content: float) -> None:
    info = {"name": name, "n_blocks": n_blocks}
    k1 = pd.DataFrame(
        {"word_class": ["function", "content"], "estimate": [function, content], "lo": [function - 1, content - 1],
         "hi": [function + 1, content + 1], "n": [40, 40]}
    )
    with RunRecorder("04_pos_onset", info, {"k": 1}, 0, root=root) as rec:
        rec.table("k1_by_class", k1)


def test_headlines_are_normalised_by_each_models_depth(tmp_path):
    _save_pos_run(tmp_path, "model-a", 30, 6.0, 24.0)
    h = headlines("model-a", "04", tmp_path).set_index("quantity")
    assert h.loc["rank-1 onset, content words", "value_norm"] == 24 / 30
    assert h.loc["rank-1 onset, function words", "hi_norm"] == 7 / 30
    assert (h["n_blocks"] == 30).all() and (h["chapter"] == "04").all()


def test_collect_summary_and_missing(tmp_path):
    _save_pos_run(tmp_path, "model-a", 30, 6.0, 24.0)
    _save_pos_run(tmp_path, "model-b", 18, 9.0, 9.0)
    models, available, missing = across.availability([], str(tmp_path))
    assert models == ["model-a", "model-b"]
    assert available.loc["model-a", "04_pos_onset"] == "saved" and available.loc["model-b", "01_guess_then_refine"] == "missing"
    assert ("model-a", "04_pos_onset") not in missing and ("model-a", "05_residual_phase_change") in missing
    table, unreadable = across.collect(models, missing, str(tmp_path))
    assert unreadable == []
    ours = table[table["source"] == across.OURS].set_index(["model", "quantity"])
    assert ours.loc[("model-b", "rank-1 onset, content words"), "value"] == 0.5
    chart_rows = across.depth_rows(table)
    paper = chart_rows[chart_rows["source"] == across.PAPER_SOURCE]
    assert set(paper["quantity"]) == {"rank-1 onset, function words", "rank-1 onset, content words"}
    wide = across.wide_table(table)
    assert wide.loc["rank-1 onset, content words", "model-a"] == "0.80 [0.77, 0.83]"
    # the output row is censoring, and ends that print alike are no interval
    edge = table.assign(value=[0.5, 1.0] + [0.5] * (len(table) - 2), lo=[0.501, 0.9] + list(table["lo"].iloc[2:]),
                        hi=[0.504, 1.0] + list(table["hi"].iloc[2:]), scale="layer", source=across.OURS)
    cells = across.wide_table(edge.iloc[:2])
    assert set(cells.to_numpy().ravel()) - {""} == {"0.50 (in at least 95 % of resamples)", "the output, not before (95 % CI from ℓ/L 0.90)"}
    placed = across.depth_rows(edge.iloc[:2])
    assert list(placed.loc[placed["source"] == across.OURS, "value"]) == [0.5]  # the output row has no depth to place
    text = across.summary(table, models)
    assert "0.20 vs 0.80 of the depth" in text and "no ℓ* (chapter 05 missing)" in text
    assert "model-b**, 01_guess_then_refine" not in across.missing_text(missing, unreadable)
    assert "**model-b**: no saved run of 00_lenses" in across.missing_text(missing, unreadable)


def test_an_unreadable_run_is_named_not_filled_in(tmp_path):
    info = {"name": "model-a", "n_blocks": 30}
    with RunRecorder("04_pos_onset", info, {"k": 1}, 0, root=tmp_path) as rec:
        rec.table("something_else", pd.DataFrame({"x": [1]}))
    models, _, missing = across.availability(["model-a"], str(tmp_path))
    table, unreadable = across.collect(models, missing, str(tmp_path))
    assert [u[:2] for u in unreadable] == [("model-a", "04_pos_onset")]
    assert not len(table[table["source"] == across.OURS])


def test_verdict_caveats_mark_the_table_and_leave_untestable_rows_out_of_the_chart(tmp_path):
    from depthkit import verdicts

    _save_pos_run(tmp_path, "model-a", 30, 6.0, 24.0)
    info = {"name": "model-a", "n_blocks": 30}
    est = pd.DataFrame({"task": ["sst2"], "collection_layer": [6.0], "collection_lo": [5.0], "collection_hi": [7.0],
                        "decision_layer": [20.0], "decision_lo": [18.0], "decision_hi": [22.0], "n": [200]})
    with RunRecorder("02_mcq_collection_vs_reasoning", info, {}, 0, root=tmp_path) as rec:
        rec.table("layer_estimates", est)
        rec.table("patching_transitions", pd.DataFrame({"what": ["x"], "direction": ["a → b"], "transition_layer": [1.0],
                                                        "lo": [0.0], "hi": [2.0], "n_pairs": [2.0]}))
    models, _, missing = across.availability([], str(tmp_path))
    table, _ = across.collect(models, missing, str(tmp_path))
    with pytest.warns(UserWarning, match="chapter 0[24]: KeyError"):
        found = [f for f in verdicts.findings(models, tmp_path) if f.rule.chapter in ("02", "04")]
    # These runs lack the tables the rules derive their statistics from: their headlines
    # stand, and every verdict on them is "not measured".
    caveats = pd.DataFrame([("model-a", "02", "MCQ answer settled (sst2)", False, "answer chosen later: one answer to 100% of prompts"),
                            ("model-a", "04", "rank-1 onset, content words", True, "function words: controls disagree")],
                           columns=verdicts.CAVEAT_COLUMNS)
    marked = across.with_caveats(table, caveats)
    wide = across.wide_table(marked)
    assert wide.loc["MCQ answer settled (sst2)", "model-a"] == "0.67 [0.60, 0.73] †"
    assert wide.loc["MCQ options collected (sst2)", "model-a"] == "0.20 [0.17, 0.23]"
    assert wide.loc["rank-1 onset, content words", "model-a"].endswith("†")
    chart = across.depth_rows(marked)
    assert "MCQ answer settled (sst2)" not in set(chart["quantity"]) and "rank-1 onset, content words" in set(chart["quantity"])
    text = across.caveat_text(caveats)
    assert "MCQ answer settled (sst2) (left out of the chart): answer chosen later: one answer to 100% of prompts" in text
    assert "None" in across.caveat_text(caveats.iloc[:0])
    assert {f.verdict.outcome for f in found} == {"not testable"}
    summary = across.summary(marked, models, found)
    assert "0 reproduced, 0 partly, 0 not reproduced, 4 not testable of the claims" in summary
    assert "GPT2-XL (1.5B parameters, 48 blocks)" in summary
    assert "— not testable: word-class gap not measured" in summary
    empty = across.with_caveats(table, caveats.iloc[:0])
    assert not empty["caveat"].astype(bool).any() and empty["testable"].all()
