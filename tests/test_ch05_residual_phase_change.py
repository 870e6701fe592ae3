"""Chapter 05's module on small constructed frames."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from depthkit import stats
from depthkit.analyses.residual import UPDATE_STATS
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.chapters import ch05_residual_phase_change as ch

N_BLOCKS = 10


def _updates(n_items: int = 12, knot: int = 5, seed: int = 0) -> pd.DataFrame:
    """Per (item, block) statistics; log(block_rel) bends at ``knot``; the MLP update
    is larger than attention in every block."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_items):
        for b in range(N_BLOCKS):
            log_rel = -1.0 - 0.02 * b - 0.4 * max(b - knot, 0) + rng.normal(0, 0.01)
            row = {s: 0.5 + rng.normal(0, 0.01) for s in UPDATE_STATS}
            row.update(item=i, block=b, block_rel=np.exp(log_rel), attn_rel=0.2 + rng.normal(0, 0.01),
                       mlp_rel=0.5 + rng.normal(0, 0.01), n_positions=10)
            rows.append(row)
    return pd.DataFrame(rows)


def _lens_frames(n_items: int = 12) -> tuple[pd.DataFrame, pd.DataFrame]:
    layers = np.arange(N_BLOCKS + 1)
    kl = pd.DataFrame(
        [{"item": i, "layer": l, "kl": 5.0 if l < 6 else 5.0 * (N_BLOCKS - l) / 4, "lens": name}
         for name in ("tuned", "logit") for i in range(n_items) for l in layers]
    )
    top = pd.DataFrame([{"item": i, "layer": l, "top10_share": 0.8 if l < 7 else 0.2} for i in range(n_items) for l in layers])
    return kl, top


def test_update_curves_cover_every_panel_with_intervals_over_passages():
    curves = ch.update_curves(_updates(), n_boot=50, seed=0)
    assert set(curves["stat"]) == set(ch.PANELS)
    assert {"x", "mean", "lo", "hi", "n", "stat", "panel"} <= set(curves.columns)
    assert (curves["n"] == 12).all()
    assert (curves["lo"] <= curves["mean"] + 1e-12).all() and (curves["mean"] <= curves["hi"] + 1e-12).all()


def test_block_statistics_sit_at_the_layer_they_write():
    # one axis: block b's curve point at residual layer b + 1, next to the lens curves at layers 0..L
    u = _updates()
    curves = ch.update_curves(u, n_boot=20, seed=0)
    assert sorted(curves["x"].unique()) == list(range(1, N_BLOCKS + 1))
    rel = curves[curves["stat"] == "block_rel"].set_index("x")["mean"]
    assert rel.loc[1] == pytest.approx(u[u["block"] == 0]["block_rel"].mean())
    kl, top = _lens_frames()
    lens = ch.lens_curves(kl, top, "tuned", n_boot=20, seed=0)
    assert lens["x"].max() == N_BLOCKS and rel.index.max() == N_BLOCKS  # the output row: block L-1 writes layer L
    diff = ch.mlp_vs_attention(u, n_boot=20, seed=0)
    assert (diff["layer"] == diff["block"] + 1).all()
    sens = ch.split_sensitivity(u, n_boot=20, seed=0).set_index("statistic")
    assert sens.loc["block_rel", "split"] == 6
    assert "Block b reads the residual stream at layer ℓ = b and writes layer ℓ = b + 1" in ch.CONVENTION


def test_no_interval_below_min_n_passages():
    curves = ch.update_curves(_updates(n_items=stats.MIN_N - 1), n_boot=20, seed=0)
    assert curves["lo"].isna().all() and curves["hi"].isna().all()


def test_transitions_find_the_knot_and_append_patching():
    kl, top = _lens_frames()
    patching = pd.DataFrame([{"name": "patching transition (a→b)", "estimate": 3.0, "lo": 2.0, "hi": 4.0, "n": 8.0, "n_boot": np.nan}])
    t = ch.transitions(_updates(), kl, top, "tuned", phase_curve="block_rel", top_tol=0.05, n_blocks=N_BLOCKS,
                       patching=patching, n_boot=50, seed=0)
    assert list(t.columns) == [*ch.TRANSITION_COLUMNS, *ch.GRID_COLUMNS, "estimate / L"]
    assert t["name"].iloc[0].startswith("ℓ*")
    assert np.isnan(t["mode_share"].iloc[-1])  # a patching row saved without it
    assert t["censored_share"].iloc[:2].isna().all()  # ℓ* and the knee are no "first reached" layers
    # the log curve bends at block 5, which writes residual layer 6: ℓ* is a layer, like the others in the table
    assert t["estimate"].iloc[0] == 6
    assert t.set_index("name").loc["Top-10 share reaches its final level", "estimate"] == 7
    assert t["name"].iloc[-1] == "patching transition (a→b)"
    assert t["estimate / L"].iloc[-1] == pytest.approx(0.3)


def test_patching_rows_keep_chapter_02_intervals():
    pt = pd.DataFrame([
        {"what": "patching transition", "direction": "sst2→mmlu", "transition_layer": 12, "lo": 10.0, "hi": 14.0, "n_pairs": 20},
        {"what": "control", "direction": "x", "transition_layer": 1, "lo": 0.0, "hi": 2.0, "n_pairs": 20},
    ])
    rows = ch.patching_rows({"patching_transitions": pt})
    assert list(rows["name"]) == ["patching transition (sst2→mmlu)"]
    assert rows[["estimate", "lo", "hi", "n"]].iloc[0].tolist() == [12.0, 10.0, 14.0, 20.0]


def test_mlp_vs_attention_interval_excludes_zero_and_prose_says_so():
    u = _updates()
    diff = ch.mlp_vs_attention(u, n_boot=50, seed=0)
    assert (diff["lo"] > 0).all()
    kl, top = _lens_frames()
    t = ch.transitions(u, kl, top, "tuned", phase_curve="block_rel", top_tol=0.05, n_blocks=N_BLOCKS, n_boot=50, seed=0)
    sens = ch.split_sensitivity(u, n_boot=20, seed=0)
    test = ch.phase_test(u, "block_rel", n_boot=50, seed=0)
    text = ch.summary_text(t, sens, u, diff, model_name="m", n_passages=12, n_positions=120, phase_curve="block_rel", test=test)
    assert "Two segments fit clearly better than one line" in text
    assert "excludes zero in 8 blocks with the MLP larger and 0 with attention larger" in text
    assert "no block-wise difference is claimed" not in text
    # every resample puts ℓ* on block 5: a share of resamples on the grid, not "95 % CI 5–5"
    assert "ℓ\\* = layer 6 in 100 % of resamples (grid: 1 layer)" in text and "(95 % CI 6–6)" not in text
    assert "a block's\nstatistics sitting at the layer ℓ = b + 1 it writes" in text
    assert "blocks that write layers 2–9 (blocks 1–8)" in text


def test_summary_claims_no_blockwise_difference_without_intervals():
    u = _updates(n_items=4)
    diff = ch.mlp_vs_attention(u, n_boot=20, seed=0)
    kl, top = _lens_frames(4)
    t = ch.transitions(u, kl, top, "tuned", phase_curve="block_rel", top_tol=0.05, n_blocks=N_BLOCKS, n_boot=20, seed=0)
    text = ch.summary_text(t, ch.split_sensitivity(u, n_boot=20, seed=0), u, diff, model_name="m",
                           n_passages=4, n_positions=40, phase_curve="block_rel", test=ch.phase_test(u, "block_rel", n_boot=20, seed=0))
    assert "no block-wise difference is claimed" in text
    assert "No clear phase change" in text  # 4 passages: no interval, so no phase change is claimed
    assert "cannot be measured here" in text


def test_skip_text_describes_without_claiming_a_difference():
    later = pd.DataFrame([{"skipped": s, "layer": N_BLOCKS, "rel_change": 0.1 * s} for s in range(N_BLOCKS)])
    output = pd.DataFrame([{"skipped": s, "kl": float(s), "top1_agreement": 1 - 0.05 * s} for s in range(N_BLOCKS)])
    text = ch.skip_text(later, output, split=5, n_passages=1, seconds=1.0)
    assert "block 9 (writes layer 10; KL 9.00 nats" in text
    assert "7 of 10 blocks, each removed on its own, change the top-1 token" in text
    # ℓ* = 5 is a residual layer: blocks 0-3 write layers 1-4 before it, blocks 4-9 write 5-10
    assert "write layers before ℓ\\* (4 blocks): 1.50 nats; for those that\n  write ℓ\\* and later (6 blocks): 6.50 nats" in text
    assert "h_L: 0.15 before ℓ\\*, 0.65 from ℓ\\* on" in text
    assert "no difference between the two sides of ℓ\\* is claimed" in text
    assert "over 1 passage)" in text and "over 3 passages)" in ch.skip_text(later, output, split=5, n_passages=3, seconds=1.0)


def _straight(n_items: int = 12, seed: int = 0) -> pd.DataFrame:
    """log(block_rel) falls along one line: no phase change."""
    u = _updates(n_items, seed=seed)
    rng = np.random.default_rng(seed)
    return u.assign(block_rel=np.exp(-1.0 - 0.05 * u["block"] + rng.normal(0, 0.01, len(u))))


def test_one_line_is_not_a_phase_change():
    test = ch.phase_test(_straight(), "block_rel", n_boot=200, seed=0)
    assert not test.two_segments
    assert "No " in ch.phase_sentence(test, N_BLOCKS) and "Two segments fit clearly" not in ch.phase_sentence(test, N_BLOCKS)
    bent = ch.phase_test(_updates(), "block_rel", n_boot=200, seed=0)
    assert bent.two_segments and bent.split.estimate == 6 and bent.slope_change.hi < 0
    assert "one layer from the edge" not in ch.phase_sentence(bent, N_BLOCKS)
    early = ch.phase_test(_updates(knot=3), "block_rel", n_boot=200, seed=0)
    assert early.two_segments and "one layer from the edge of the range the fit may choose (layers 3–8)" in ch.phase_sentence(early, N_BLOCKS)


def test_a_split_on_the_edge_of_the_fit_range_is_no_phase_change():
    u = _updates(knot=2)  # fitted blocks 1..8: the knot may sit on blocks 2..7 (layers 3..8), and 2 is the first
    test = ch.phase_test(u, "block_rel", n_boot=100, seed=0)
    assert (test.first_knot, test.last_knot) == (3.0, 8.0) and test.split.estimate == 3 and test.at_edge
    assert not test.two_segments and "sits on the first layer the fit may choose (layers 3–8" in ch.phase_sentence(test, N_BLOCKS)
    frame = test.as_frame()
    assert frame["at_edge"].item() and not frame["two_segments"].item()


def test_headlines_drop_l_star_without_a_phase_change():
    t = pd.DataFrame([
        {"name": "ℓ* (two-segment fit, log block_rel)", "estimate": 2.0, "lo": 2.0, "hi": 2.0, "n": 24.0, "n_boot": 200.0},
        {"name": "KL knee (tuned lens)", "estimate": 20.0, "lo": 18.0, "hi": 22.0, "n": 24.0, "n_boot": 200.0},
    ])
    test = ch.phase_test(_updates(knot=2), "block_rel", n_boot=50, seed=0).as_frame()
    assert ch.headlines({"transitions": t, "phase_test": test})["quantity"].tolist() == ["KL knee (tuned lens)"]


def test_headlines_read_the_transitions_table():
    t = pd.DataFrame([
        {"name": "ℓ* (two-segment fit, log block_rel)", "estimate": 12.0, "lo": 10.0, "hi": 14.0, "n": 24.0, "n_boot": 200.0},
        {"name": "KL knee (tuned lens)", "estimate": 20.0, "lo": np.nan, "hi": np.nan, "n": 4.0, "n_boot": 20.0},
    ])
    out = ch.headlines({"transitions": t})
    assert list(out.columns) == HEADLINE_COLUMNS
    assert out["quantity"].tolist() == t["name"].tolist()
    assert out["value"].tolist() == [12.0, 20.0]
    assert (out["scale"] == "layer").all()
    assert list(ch.PAPER.columns) == PAPER_COLUMNS


def test_model_line_mentions_quantisation():
    info = SimpleNamespace(name="m", n_blocks=30, d_model=576, d_vocab=49152, quantisation="4-bit", is_quantised=True)
    line = ch.model_line(info, "tuned", "canonical")
    assert "4-bit weights" in line and "not one of the paper's" in line
    plain = ch.model_line(SimpleNamespace(**{**info.__dict__, "is_quantised": False}), "logit", "authors")
    assert "weights not quantised" in plain and "**authors**" in plain
