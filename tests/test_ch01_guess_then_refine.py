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


def _with_layer0(steps: pd.DataFrame, top1) -> pd.DataFrame:
    zero = steps[steps["layer"] == 1].assign(layer=0)
    zero["top1_id"] = [int(top1(i)) for i in zero["item"]]
    return pd.concat([zero, steps], ignore_index=True).sort_values(["item", "layer"]).reset_index(drop=True)


def _bigram(prev_ids, next_ids) -> pd.DataFrame:
    return pd.DataFrame({"prev_id": prev_ids, "next_id": next_ids, "count": 1, "total": 1})


def test_bigram_guess_backs_off_so_every_share_has_one_denominator():
    steps, final = _guess_then_refine(n_items=20)
    # the last input token of prompt i is 40 + i; only those of the even prompts have a recorded successor (token 0)
    last = ch.last_token_frame([40 + i for i in range(20)], [" w"] * 20)
    bigram = _bigram([40 + i for i in range(0, 20, 2)], [0] * 10)
    guesses = ch.guesses_from(steps, final, last, bigram, unigram_id=3)
    bi = guesses[guesses["guess"] == "bigram"].set_index("item")
    assert bi["backoff"].sum() == 10 and (bi.loc[bi["backoff"], "token_id"] == 3).all()
    assert (bi.loc[~bi["backoff"], "token_id"] == 0).all()
    from depthkit.analyses import summaries

    agreement = summaries.agreement_by_layer(steps, guesses)
    assert (agreement["n"] == 20).all()  # unigram, bigram and final: all prompts
    # layers 1-2 predict token 0 = the bigram guess of the 10 even prompts
    assert agreement.set_index(["layer", "guess"]).loc[(1, "bigram"), "share"] == pytest.approx(0.5)

    class Tok:
        def decode(self, ids):
            return f"<{ids[0]}>"

    note = ch.bigram_note(agreement, guesses, Tok(), 3, 6)
    at_l = agreement.set_index(["layer", "guess"]).loc[(6, "bigram")]
    assert f"{at_l['share']:.1%} ({int(at_l['n_agree'])} of 20 prompts)" in note
    assert "for 10 of 20 prompts that token is never followed" in note and "over all 20 prompts" in note


def _layer0_case(layer0_top1):
    steps, final = _guess_then_refine(n_items=40)
    steps = _with_layer0(steps, layer0_top1)
    freq = _freq()
    last = ch.last_token_frame([45] * 40, [" w"] * 40)
    guesses = ch.guesses_from(steps, final, last, _bigram([45], [0]), unigram_id=0)
    ppg = ch.per_prompt_guesses(ch.per_prompt(steps, final, freq), steps, guesses)
    return steps, final, ch.layer0_vs_layer1(ppg, n_boot=50, seed=0)


def test_layer1_against_layer0_paired_difference():
    # layer 0 predicts the rare token 30 for every prompt, layer 1 the Top-10 token 0: a clear rise
    _, _, comp = _layer0_case(lambda i: 30)
    c = comp.set_index("quantity")
    top = c.loc["top-1 in Top 1-10"]
    assert top["layer0"] == 0 and top["layer1"] == 1 and top["diff_pp"] == pytest.approx(100.0) and top["n"] == 40
    assert c.loc["top-1 = bigram guess", "diff_pp"] == pytest.approx(100.0)
    text = ch.layer0_sentence(comp)
    assert "Top-10 shares at layer 1 are 100.0 percentage points higher than at layer 0" in text
    assert "Layer 1 differs clearly from layer 0: its Top-10 share is higher" in text
    assert "the Top-10 share is 0 % (95 % CI 0–9 %) at layer 0 and 100 % (95 % CI 91–100 %) at layer 1" in text
    shown = ch.layer0_table(comp)
    assert list(shown.columns)[1:4] == ["layer 0 (embeddings) [95 % CI]", "layer 1 [95 % CI]", "layer 1 − layer 0, paired [95 % CI]"]


def test_layer1_equal_to_layer0_is_no_clear_difference():
    # half the prompts move into the Top 10 and half out of it: the shares are equal, nothing is claimed
    steps, final = _guess_then_refine(n_items=40)
    steps.loc[(steps["layer"] == 1) & (steps["item"] % 2 == 1), "top1_id"] = 31
    steps = _with_layer0(steps, lambda i: 0 if i % 2 else 30)
    pp = ch.per_prompt(steps, final, _freq())
    guesses = ch.guesses_from(steps, final, ch.last_token_frame([45] * 40, [" w"] * 40), _bigram([45], [0]), unigram_id=0)
    comp = ch.layer0_vs_layer1(ch.per_prompt_guesses(pp, steps, guesses), n_boot=200, seed=0)
    top = comp.set_index("quantity").loc["top-1 in Top 1-10"]
    assert top["layer0"] == 0.5 and top["layer1"] == 0.5 and top["diff_pp"] == 0
    text = ch.layer0_sentence(comp)
    assert "no clear difference between Top-10 shares at layer 1 and at layer 0" in text
    assert "Layer 1 does not differ clearly from layer 0" in text and "differs clearly" not in text
    # the summary carries the sentence; without a layer-0 row it says so instead of comparing
    assert ch.layer0_sentence(comp.iloc[0:0]).startswith("Layer 0 (the embedding row) was not decoded")
    h = ch.headline_table(ch.bucket_tables(steps, final, _freq(), 6, n_boot=50, seed=0), 6, "toy")
    assert h["result"].iloc[0] == ch.Q_L0 and h["count"].iloc[0] == "20 of 40"


def test_input_groups_select_on_the_last_input_token_not_the_output():
    # prompts 0-19 end in a whitespace-led token; they guess Top-10 token 0 at layer 1, the others a rare token
    steps, final = _guess_then_refine(n_items=40)
    steps.loc[(steps["layer"] == 1) & (steps["item"] >= 20), "top1_id"] = 33
    last = ch.last_token_frame(list(range(100, 140)), [" city"] * 20 + ["ing"] * 10 + [","] * 10)
    assert last["whitespace_led"].tolist() == [True] * 20 + [False] * 20
    pp = ch.per_prompt(steps, final, _freq())
    groups = ch.input_groups(pp, last, n_boot=100, seed=0)
    at1 = groups[groups["quantity"] == ch.Q_L1].set_index("group")
    assert at1.loc[ch.WS_LED, "estimate"] == 1 and at1.loc[ch.NOT_WS_LED, "estimate"] == 0
    assert at1.loc[ch.WS_LED, "n"] == 20 and at1.iloc[-1]["estimate"] == pytest.approx(1.0) and at1.iloc[-1]["lo"] > 0
    text = ch.input_group_sentence(groups)
    assert "does not select on what the model predicts" in text
    assert ("layer-1 Top-10 shares after a whitespace-led last token are 100.0 percentage points higher than those after "
            "other last tokens") in text
    # the groups are the same whatever the model predicts: whitespace predictions do not move a prompt
    steps2 = steps.copy()
    steps2.loc[steps2["layer"] == 1, "top1_id"] = 1
    g2 = ch.input_groups(ch.per_prompt(steps2, final, _freq()), last, n_boot=100, seed=0)
    assert g2.set_index(["quantity", "group"])["n"].equals(groups.set_index(["quantity", "group"])["n"])
    assert "no clear difference" in ch.input_group_sentence(g2)
    shown = ch.input_group_table(groups)
    assert shown["value [95 % CI]"].iloc[2].startswith("+100.0 pp (+100.0 in at least 95 % of resamples)") and not hasattr(ch, "whitespace_items")


def test_summary_carries_the_layer0_and_input_sentences():
    steps, final, comp = _layer0_case(lambda i: 30)
    freq = _freq()
    t = ch.bucket_tables(steps, final, freq, 6, n_boot=50, seed=0)
    pp = ch.per_prompt(steps, final, freq)
    last = ch.last_token_frame(list(range(40)), [" a"] * 20 + ["b"] * 20)
    from depthkit.analyses import summaries

    guesses = ch.guesses_from(steps, final, last, _bigram([0], [7]), unigram_id=0)
    agree = summaries.agreement_by_layer(steps, guesses)
    text = ch.summary(pp, t, ch.peak_layer(pp, n_boot=50, seed=0), agree, L=6, source="s", weights="w", minutes=0.1,
                      n_boot=50, seed=0, layer0=comp, groups=ch.input_groups(pp, last, n_boot=50, seed=0))
    assert "Layer 1 against layer 0 (the embedding row, before any block" in text
    assert "Split by the prompt's last *input* token" in text and "of all 40 prompts" in text


def test_the_peak_is_searched_from_layer_1():
    # the embedding row (layer 0) has the highest Top-10 share, but it is no depth
    steps, final = _steps(40, 6, lambda i, l: 0 if l == 2 else 30)
    zero = steps[steps["layer"] == 1].assign(layer=0, top1_id=1)
    pp = ch.per_prompt(pd.concat([zero, steps], ignore_index=True), final, _freq())
    assert ch.peak_layer(pp, n_boot=20, seed=0).iloc[0]["estimate"] == 2
