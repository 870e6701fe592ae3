"""Chapter 00's module on small constructed frames: held-out fidelity prose, the
settling layer of the examples, the paired bias check and its verdict, the
prompt-level KL difference and the headlines of a saved run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.chapters import ch00_lenses as ch

LENSES = ["logit", ch.TUNED, ch.THE, ch.TOP10]


def _compare_steps(n_items: int, L: int, early_frequent: dict[str, float], final_frequent: float, *, kl=None) -> pd.DataFrame:
    """A compare_lenses-like per-prompt frame: in layers < L/3 a lens picks a frequent
    token for the first share of prompts; the final top-1 is frequent for the first
    ``final_frequent`` share of prompts."""
    rows = []
    for lens in LENSES:
        for i in range(n_items):
            for l in range(1, L + 1):
                early = l < 1 + L // 3
                frequent = (i < early_frequent[lens] * n_items) if early else (i < final_frequent * n_items)
                rows.append(
                    {"lens": lens, "item": i, "layer": l, "frequent": bool(frequent), "final_id": 1 if i < final_frequent * n_items else 99,
                     "kl_to_final": (kl or {}).get(lens, 1.0) + 0.01 * (i % 3)}
                )
    return ch.with_final_frequent(pd.DataFrame(rows), frequent_ids=[1])


def test_fidelity_text_and_table():
    L = 8
    heldout = pd.DataFrame(
        [{"layer": l, "lens": lens, "kl": (4.0 if lens == "logit" else 1.0) + (l == 2) * 3, "top1_agreement": 0.5} for l in range(L) for lens in ("logit", "tuned")]
    )
    text, table = ch.fidelity(heldout, L)
    assert "**8 of 8**" in text and "**63%** lower" in text and "worst at layer 2" in text
    assert list(table.columns.get_level_values(0).unique()) == ["KL (nats)", "top-1 agreement"]
    assert len(table) == L


def test_settled_from_is_the_last_change_plus_one():
    steps = pd.DataFrame({"item": 0, "layer": [1, 2, 3, 4], "top1_id": [5, 7, 5, 7]})
    final = pd.DataFrame({"item": 0, "layer": [1, 2, 3, 4], "token_id": 7})
    assert ch.settled_from(steps, final) == {0: 4}
    steps["top1_id"] = 7
    assert ch.settled_from(steps, final) == {0: 1}


def test_bias_table_pairs_prompts_and_reports_intervals():
    steps = _compare_steps(40, 9, {"logit": 0.9, ch.TUNED: 0.8, ch.THE: 0.7, ch.TOP10: 0.6}, 0.25)
    bias = ch.bias_table(steps, 9, n_boot=200, seed=0).set_index("lens")
    assert bias.loc[ch.TUNED, "early layers"] == pytest.approx(0.8)
    assert bias.loc[ch.TUNED, "model output"] == pytest.approx(0.25)
    assert bias.loc[ch.TUNED, "early − output"] == pytest.approx(0.55)
    assert bias.loc[ch.TUNED, "diff lo"] > 0 and bias["n"].eq(40).all()
    text = ch.bias_verdict(bias.reset_index(), ch.early_layers(steps["layer"].unique(), 9))
    assert text.count("percentage points of Top-10 picks more than the model's output") == 3
    # 80 % -> 70 % and 60 %: the drop is stated with its interval and the verdict says so
    assert bias.loc[ch.THE, "drop"] == pytest.approx(0.1) and bias.loc[ch.TOP10, "drop"] == pytest.approx(0.2)
    assert bias.loc[ch.TOP10, "drop lo"] > 0 and np.isnan(bias.loc[ch.TUNED, "drop"])
    assert "early shares through the tuned, Top-10 down-weighted lens are 20.0 percentage points lower" in text
    # The interval is signed like every other difference sentence: down-weighted minus plain.
    low = text.split("Top-10 down-weighted lens are 20.0 percentage points lower than through the plain tuned lens (95 % CI ")[1]
    lo, hi = (float(x) for x in low.split(")")[0].split(" to "))
    assert lo <= -20.0 <= hi < 0
    assert "Down-weighting frequent targets lowers the early Top-10 share" in text and "artefact" not in text


def test_bias_verdict_when_down_weighting_changes_nothing():
    steps = _compare_steps(40, 9, {"logit": 0.9, ch.TUNED: 0.8, ch.THE: 0.8, ch.TOP10: 0.8}, 0.25)
    bias = ch.bias_table(steps, 9, n_boot=200, seed=0)
    text = ch.bias_verdict(bias, ch.early_layers(steps["layer"].unique(), 9))
    assert "Even the lenses trained to discount frequent targets" in text and "does not clearly lower" in text


def test_early_layers_start_at_layer_1():
    assert ch.early_layers(range(0, 31), 30) == list(range(1, 11))
    assert ch.early_layers(range(2, 10), 9) == [2, 3, 4]


def test_bias_verdict_without_a_clear_tuned_preference():
    steps = _compare_steps(40, 9, {"logit": 0.3, ch.TUNED: 0.3, ch.THE: 0.3, ch.TOP10: 0.3}, 0.3)
    text = ch.bias_verdict(ch.bias_table(steps, 9, n_boot=200, seed=0), [1, 2, 3])
    assert "do not clearly pick Top-10 tokens" in text and "no clear difference" in text


def test_bias_verdict_when_down_weighting_removes_it_and_too_few_prompts():
    steps = _compare_steps(40, 9, {"logit": 0.9, ch.TUNED: 0.9, ch.THE: 0.25, ch.TOP10: 0.25}, 0.25)
    assert "no longer clearly prefer" in ch.bias_verdict(ch.bias_table(steps, 9, n_boot=200, seed=0), [1, 2, 3])
    few = ch.bias_table(_compare_steps(6, 9, {k: 1.0 for k in LENSES}, 0.0), 9, n_boot=200, seed=0)
    assert few["lo"].isna().all() and few["diff lo"].isna().all()
    # Without an interval no preference is claimed, however large the difference.
    assert "do not clearly pick" in ch.bias_verdict(few, [1, 2, 3])


def test_kl_cut_is_paired_and_signed():
    steps = _compare_steps(30, 8, {k: 0.5 for k in LENSES}, 0.5, kl={"logit": 3.0, ch.TUNED: 1.0})
    assert "tuned-lens KL values are 2.00 nats lower than logit-lens ones" in ch.kl_cut(steps, 8, n_boot=200)


class _Run:
    def __init__(self, tables):
        self.tables = tables

    def __getitem__(self, name):
        return self.tables[name]


def test_headlines_from_saved_bias_table():
    steps = _compare_steps(40, 9, {"logit": 0.9, ch.TUNED: 0.8, ch.THE: 0.7, ch.TOP10: 0.6}, 0.25)
    out = ch.headlines(_Run({"bias_check": ch.bias_table(steps, 9, n_boot=100)}))
    assert list(out.columns) == HEADLINE_COLUMNS
    h = out.set_index("quantity")
    assert h.loc["early-layer Top-10 share, tuned lens", "value"] == pytest.approx(0.8)
    assert h.loc[ch.Q_OUTPUT, "value"] == pytest.approx(0.25)
    assert set(out["scale"]) == {"share"} and np.isfinite(h.loc["early-layer Top-10 share, tuned lens", "lo"])
    assert list(ch.PAPER.columns) == PAPER_COLUMNS


def test_fidelity_compares_the_trained_lens_with_its_ridge_start():
    L = 4
    rows = [{"layer": l, "lens": lens, "kl": kl, "top1_agreement": a}
            for l in range(L) for lens, kl, a in (("logit", 5.0, 0.1), ("tuned", 1.0, 0.5), (ch.RIDGE_START, 1.5, 0.4))]
    text, table = ch.fidelity(pd.DataFrame(rows), L)
    assert "from 1.50 nats (the ridge start) to 1.00" in text and "from 40.0% to 50.0%" in text and "**4 of 4**" in text
    assert ch.RIDGE_START in table["KL (nats)"].columns


def test_explorer_grid_on_a_tiny_model(tiny_llama):
    """The explorer's data: examples first, the last positions of each prompt, every
    layer, the input token of each column, and a chart whose dropdown lists the prompts."""
    import depthkit as dk
    from depthkit import plots

    texts = ch.explorer_texts(["a b c"], ["one two three four five six seven eight nine ten eleven twelve"], 2)
    assert texts[0] == "a b c" and len(texts) == 2
    items = ch.explorer_items(tiny_llama, texts, n_positions=4)
    assert all(len(it.positions) == min(4, len(it.tokens)) and it.positions[-1] == len(it.tokens) - 1 for it in items)
    traj = dk.trajectories(tiny_llama, items, lens="logit", top_k=3, progress=False)
    grid = ch.explorer_grid(traj, items, texts, tiny_llama.tokenizer)
    L = dk.model_info(tiny_llama).n_blocks
    assert len(grid) == sum(len(it.positions) for it in items) * grid["layer"].nunique()
    assert grid["layer"].max() == L and grid["prob"].between(0, 1).all()
    row = grid.iloc[0]
    top = traj.topk.query("item == @row.prompt and position == @row.position and layer == @row.layer").sort_values("k").head(3)
    assert row["top3"] == "  ".join(f"{t!r} {q:.0%}" for t, q in zip(top["token"], top["prob"]))
    assert row["top1"] == repr(top["token"].iloc[0])
    first = grid[(grid["prompt"] == 0)].sort_values("position")
    tok = tiny_llama.tokenizer
    assert first["column"].iloc[0] == f"{tok.decode([items[0].tokens[items[0].positions[0]]])!r} ·{items[0].positions[0]}"
    spec = plots.lens_explorer_chart(grid).to_dict()
    bind = next(p for p in spec["params"] if p["name"] == "prompt_choice")["bind"]
    assert bind["input"] == "select" and bind["options"] == [0, 1] and bind["labels"][0] == "a b c"
    assert "label" not in spec["datasets"][next(iter(spec["datasets"]))][0]  # labels live in the dropdown only
