"""Chapter 07 reads other chapters' saved runs through their headline API, puts
layers on ℓ/L and keeps the paper's rows apart."""

from __future__ import annotations

import pandas as pd

from depthkit.chapters import ch07_across_models as across
from depthkit.chapters import headlines
from depthkit.results import RunRecorder


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
