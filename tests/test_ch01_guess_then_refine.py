"""Chapter 01's module on small constructed frames: per-prompt flags, the headline
table, the peak layer, the prose's difference rule and the headlines of a saved run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.chapters import ch01_guess_then_refine as ch


def _freq(vocab: int = 50) -> pd.DataFrame:
    # Token i has rank i + 1: ids 0..9 are the Top-10.
    return pd.DataFrame({"token_id": np.arange(vocab), "count": np.arange(vocab, 0, -1), "rank": np.arange(1, vocab + 1)})


def _steps(n_items: int, L: int, top1) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows = [
        {"item": i, "position": 5, "layer": l, "top1_id": int(top1(i, l))}
        for i in range(n_items)
        for l in range(1, L + 1)
    ]
    steps = pd.DataFrame(rows)
    final = steps[steps["layer"] == L][["item", "position", "layer", "top1_id"]].rename(columns={"top1_id": "token_id"})
    return steps, final


def _guess_then_refine(n_items=40, L=6):
    # Layers 1-2 guess a Top-10 token (id 0); from layer 3 the prompt's own rare token 20 + i % 10.
    return _steps(n_items, L, lambda i, l: 0 if l <= 2 else 20 + i % 10)


def test_per_prompt_flags_top10_flip_and_final():
    steps, final = _guess_then_refine()
    pp = ch.per_prompt(steps, final, _freq())
    at1 = pp[pp["layer"] == 1]
    assert at1["top10"].eq(1).all() and at1["flip"].eq(1).all() and at1["final_top10"].eq(0).all()
    at_last = pp[pp["layer"] == 6]
    assert at_last["top10"].eq(0).all() and at_last["flip"].eq(0).all()


def test_bucket_tables_and_headline_table():
    steps, final = _guess_then_refine()
    t = ch.bucket_tables(steps, final, _freq(), 6, n_boot=50, seed=0)
    h = ch.headline_table(t, 6, "toy, logit lens")
    assert list(h.columns) == ["result", "source", "value [95 % CI]", "count"]
    ours = h[h["source"] == "toy, logit lens"].set_index("result")
    ours["value [95 % CI]"] = ours["value [95 % CI]"].str.replace(r"\s+", " ", regex=True)
    assert ours.loc[ch.Q_L1, "value [95 % CI]"].startswith("100.0 %")
    assert ours.loc[ch.Q_L1, "count"] == "40 of 40"
    assert ours.loc[ch.Q_FINAL, "value [95 % CI]"].startswith("0.0 %")
    assert ours.loc[ch.Q_FLIP, "count"] == "40 of 40"
    assert h["source"].str.startswith("paper (reference)").sum() == 3


def test_no_interval_below_min_n_in_headline():
    steps, final = _guess_then_refine(n_items=5)
    t = ch.bucket_tables(steps, final, _freq(), 6, n_boot=50, seed=0)
    h = ch.headline_table(t, 6, "toy")
    assert h["value [95 % CI]"].iloc[0].endswith("fewer than 10 units)")


def test_peak_layer_finds_the_peak_with_an_interval():
    # Top-10 share: 0.5 at layer 1, 1.0 at layer 2, 0 later.
    steps, final = _steps(40, 6, lambda i, l: 0 if (l == 2 or (l == 1 and i % 2)) else 30)
    peak = ch.peak_layer(ch.per_prompt(steps, final, _freq()), n_boot=50, seed=0).iloc[0]
    assert peak["estimate"] == 2 and peak["lo"] == 2 and peak["hi"] == 2 and peak["n"] == 40


def test_summary_states_a_fall_only_when_the_interval_excludes_zero():
    steps, final = _guess_then_refine()
    freq = _freq()
    t = ch.bucket_tables(steps, final, freq, 6, n_boot=50, seed=0)
    pp = ch.per_prompt(steps, final, freq)
    agree = pd.DataFrame({"layer": [1, 1], "guess": ["unigram", "bigram"], "share": [1.0, 0.0]})
    kw = dict(L=6, source="logit lens of toy", weights="unquantised", minutes=0.1, n_boot=50, seed=0)
    text = ch.summary(pp, t, ch.peak_layer(pp, n_boot=50, seed=0), agree, **kw)
    assert "100.0 percentage points lower than at layer 1" in text
    # Same Top-10 share at layer 1 and at the output: no direction may be stated.
    flat_steps, flat_final = _steps(40, 6, lambda i, l: i % 10 if i % 2 else 30)
    t2 = ch.bucket_tables(flat_steps, flat_final, freq, 6, n_boot=50, seed=0)
    pp2 = ch.per_prompt(flat_steps, flat_final, freq)
    text2 = ch.summary(pp2, t2, ch.peak_layer(pp2, n_boot=50, seed=0), agree, **kw)
    assert "no clear difference" in text2 and "lower than" not in text2


class _Run:
    def __init__(self, tables):
        self.tables = tables

    def __getitem__(self, name):
        return self.tables[name]


def test_headlines_from_saved_tables():
    steps, final = _guess_then_refine()
    freq = _freq()
    t = ch.bucket_tables(steps, final, freq, 6, n_boot=50, seed=0)
    peak = ch.peak_layer(ch.per_prompt(steps, final, freq), n_boot=50, seed=0)
    tables = {"bucket_shares": t["shares"], "final_bucket_shares": t["final_share"], "flip_rates": t["flips"], "peak_layer": peak}
    h = ch.headlines(_Run(tables)).set_index("quantity")
    assert list(ch.headlines(_Run(tables)).columns) == HEADLINE_COLUMNS
    assert h.loc[ch.Q_PEAK, "scale"] == "layer" and h.loc[ch.Q_PEAK, "value"] == 1
    assert h.loc[ch.Q_L1, "value"] == pytest.approx(1.0) and h.loc[ch.Q_FINAL, "value"] == pytest.approx(0.0)
    # Older runs without the peak table: the argmax of the saved shares, no interval.
    del tables["peak_layer"]
    old = ch.headlines(_Run(tables)).set_index("quantity")
    assert old.loc[ch.Q_PEAK, "value"] == 1 and np.isnan(old.loc[ch.Q_PEAK, "lo"])


def test_paper_rows_and_corpus_table():
    assert list(ch.PAPER.columns) == PAPER_COLUMNS
    assert ch.PAPER["value"].dropna().between(0, 1).all()
    table = ch.corpus_table(_freq(), "toy")
    assert list(table.columns) == [10, 100, 1000]
    assert table.loc["paper (reference): Llama-2 tokenizer, Wikipedia", 10] == "23%"


def test_whitespace_predictions_are_reported_apart():
    # 40 prompts guess Top-10 token 0 at layers 1-2; the first 10 guess the bare space (token 1) at layer 1 instead
    steps, final = _guess_then_refine()
    steps.loc[(steps["layer"] == 1) & (steps["item"] < 10), "top1_id"] = 1
    steps["top1_token"] = np.where(steps["top1_id"] == 1, " ", "w")
    blank = ch.whitespace_items(steps)
    assert blank.tolist() == list(range(10))
    freq = _freq()
    t = ch.bucket_tables(steps, final, freq, 6, n_boot=50, seed=0)
    clean = ch.bucket_tables(ch.drop_items(steps, blank), ch.drop_items(final, blank), freq, 6, n_boot=50, seed=0)
    h = ch.headline_table(t, 6, "toy", clean, len(blank))
    without = h[h["source"] == "toy, without the 10 prompts with a whitespace prediction"].set_index("result")
    assert without.loc[ch.Q_L1, "count"] == "30 of 30" and without.loc[ch.Q_FINAL, "count"] == "0 of 30"
    pp = ch.per_prompt(steps, final, freq)
    agree = pd.DataFrame({"layer": [1, 1], "guess": ["unigram", "bigram"], "share": [1.0, 0.0]})
    text = ch.summary(pp, t, ch.peak_layer(pp, n_boot=50, seed=0), agree, L=6, source="s", weights="w", minutes=0.1,
                      n_boot=50, seed=0, no_blank=clean, n_blank=len(blank))
    assert "Leaving out the 10 prompts whose top-1 is a whitespace token" in text and "of 30 prompts" in text


def test_the_peak_is_searched_from_layer_1():
    # the embedding row (layer 0) has the highest Top-10 share, but it is no depth
    steps, final = _steps(40, 6, lambda i, l: 0 if l == 2 else 30)
    zero = steps[steps["layer"] == 1].assign(layer=0, top1_id=1)
    pp = ch.per_prompt(pd.concat([zero, steps], ignore_index=True), final, _freq())
    assert ch.peak_layer(pp, n_boot=20, seed=0).iloc[0]["estimate"] == 2
