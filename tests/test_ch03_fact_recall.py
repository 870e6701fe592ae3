"""Chapter 03's module on small constructed frames."""

from __future__ import annotations

import numpy as np
import pandas as pd

from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.chapters import ch03_fact_recall as ch


class FakeRun:
    def __init__(self, tables: dict[str, pd.DataFrame], params: dict):
        self.tables, self.params = tables, params

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]


def onsets_frame(n: int, first: float, last: float, seed: int = 0) -> pd.DataFrame:
    """k = 1 onsets of answer tokens 1 and 3 of ``n`` correct items, around ``first``
    and ``last``."""
    rng = np.random.default_rng(seed)
    rows = []
    for item in range(n):
        for token, centre in ((1, first), (3, last)):
            rows.append({"item": item, "k": 1, "token": token, "onset": centre + rng.integers(-1, 2), "correct": True, "dataset": "curated"})
    return pd.DataFrame(rows)


def k1_of(onsets: pd.DataFrame) -> pd.DataFrame:
    return ch.onset_k1(onsets.assign(length_group="3", position=0), 30, n_boot=50, seed=0)


def test_token_difference_and_its_wording():
    on = onsets_frame(20, 20, 10)
    d = ch.token_difference(on, "curated", 3, 1, 30, n_boot=200, seed=0)
    assert abs(d["diff"] - 10) < 1.5 and d["lo"] > 0
    text = ch.dataset_summary(k1_of(on), on, "curated", 30, n_boot=200, seed=0)
    assert "token 1 onsets are" in text and "later than token 3 onsets" in text
    assert "layer 19.9 of 30 (95 % CI 19.6–20.2)" in text and "0 % (95 % CI 0–17 %) of 20 only at the output" in text


def test_no_difference_claimed_without_an_interval_or_when_it_spans_zero():
    few = onsets_frame(6, 20, 10)
    text = ch.dataset_summary(k1_of(few), few, "curated", 30, n_boot=200, seed=0)
    assert "later than" not in text and "no finding is drawn" in text
    same = onsets_frame(20, 15, 15)
    text = ch.dataset_summary(k1_of(same), same, "curated", 30, n_boot=200, seed=0)
    assert "no clear difference between token 1 onsets and token 3 onsets" in text


def test_onset_k1_divides_by_depth():
    k1 = k1_of(onsets_frame(12, 20, 10))
    assert np.allclose(k1["onset / L"], k1["mean_onset"] / 30)
    assert len(ch.with_paper(k1)) == len(k1) + 3


def test_headlines_keep_paper_names_for_the_main_dataset():
    k1 = pd.DataFrame({"dataset": ["curated", "curated", "trivia_qa", "curated"], "token": [1, 2, 1, 1],
                       "correct": [True, True, True, False], "mean_onset": [20.0, 15.0, 18.0, 25.0],
                       "lo": [19.0, np.nan, 17.0, 24.0], "hi": [21.0, np.nan, 19.0, 26.0], "n_reached": [30, 8, 12, 5]})
    h = ch.headlines(FakeRun({"onset_k1": k1}, {"dataset": "curated"}))
    assert list(h.columns) == [*HEADLINE_COLUMNS, "censored"] and h["censored"].isna().all()
    assert list(h["quantity"]) == ["fact recall rank-1 onset, answer token 1", "fact recall rank-1 onset, answer token 2",
                                   "fact recall rank-1 onset, answer token 1 (trivia_qa)"]
    assert list(h["value"]) == [20.0, 15.0, 18.0] and list(h["n"]) == [30, 8, 12] and set(h["scale"]) == {"layer"}
    assert set(h["quantity"]) & set(ch.PAPER["quantity"]) == {h["quantity"][0], h["quantity"][1]}


def test_paper_rows():
    assert list(ch.PAPER.columns) == PAPER_COLUMNS
    assert np.allclose(ch.PAPER["value"], [27 / 32, 20 / 32, 12 / 32])


def test_token_trend_is_paired_within_answers_not_pooled_over_lengths():
    # 20 two-token answers (token 1 at 10, token 2 at 20) and 80 one-token answers at 28:
    # pooled over lengths token 1 would look later than token 2; within answers it is 10 layers earlier
    rows = [{"item": i, "k": 1, "token": t, "onset": o, "correct": True, "dataset": "curated"}
            for i in range(20) for t, o in ((1, 10.0), (2, 20.0))]
    rows += [{"item": 100 + i, "k": 1, "token": 1, "onset": 28.0, "correct": True, "dataset": "curated"} for i in range(80)]
    d = ch.token_difference(pd.DataFrame(rows), "curated", 1, 2, 30, n_boot=100, seed=0)
    assert d["diff"] == 10 and d["n"] == 20 and d["lo"] == d["hi"] == 10


def test_onsets_at_the_output_are_censored_not_averaged_in():
    # 20 answers: token 1 at layer 10 for 15 of them, at the output row L = 30 for 5
    on = pd.DataFrame([{"item": i, "k": 1, "token": 1, "onset": 10.0 if i < 15 else 30.0, "correct": True, "dataset": "curated"}
                       for i in range(20)])
    k1 = k1_of(on)
    r = k1.iloc[0]
    assert r["mean_onset"] == 10.0 and r["n_censored"] == 5 and r["censored"] == 0.25  # not (15·10 + 5·30)/20 = 15
    assert r["censored_lo"] < 0.25 < r["censored_hi"]
    text = ch.dataset_summary(k1, on, "curated", 30, n_boot=50, seed=0)
    assert "over the 15 reaching it before the output" in text and "of 20 only at the output, not before" in text
    assert "of 30 (95 % CI 30" not in text and "layer 30 of 30" not in text
    h = ch.headlines(FakeRun({"onset_k1": k1}, {"dataset": "curated"}))
    assert h["value"].iloc[0] == 10.0 and h["n"].iloc[0] == 15 and h["censored"].iloc[0] == 0.25
    # every onset at the output: no mean, the share censored is 1 with its exact lower bound
    all_out = k1_of(on.assign(onset=30.0)).iloc[0]
    assert np.isnan(all_out["mean_onset"]) and all_out["censored"] == 1.0 and all_out["censored_hi"] == 1.0
    assert abs(all_out["censored_lo"] - 0.025 ** (1 / 20)) < 1e-9
    assert "none before the output" in ch.dataset_summary(k1_of(on.assign(onset=30.0)), on, "curated", 30, n_boot=50, seed=0)
    # a pair with a censored token is no paired difference
    two = pd.concat([on, on.assign(token=2, onset=12.0)], ignore_index=True)
    assert ch.token_difference(two, "curated", 1, 2, 30, n_boot=50, seed=0)["n"] == 15


def test_headline_compares_each_position_with_the_paper():
    def text(first: float, last: float, n: int = 20) -> str:
        on = onsets_frame(n, first, last)
        return ch.summary(k1_of(on), on, ["curated"], 30, n_boot=200, seed=0)

    # token 3 at ≈ 26 of 30 (0.87 L), the paper's 12 of 32 (0.38 L): later tokens do not settle early here
    late = text(27, 26)
    assert ("answer token 3: rank-1 onset at 0.87 (95 % CI 0.86–0.88) of the depth (20 tokens before the output, 0% of those "
            "reaching rank 1 only at the output); paper 0.38 — **not reproduced**: later in the depth than the paper's value") in late
    assert "paper 0.84 — later in the depth than the paper's value" in late  # token 1: compared, never "reproduced"
    assert "the paper's token 1 − token 3 is 0.47 of the depth — **reproduced in direction only**" in late
    # as in the paper: both the position and the decline agree with it
    like = text(25, 11)
    assert "paper 0.38 — consistent with the paper's value (its interval includes it)" in like
    assert "**reproduced**: a clear decline whose interval includes the paper's" in like and "not reproduced" not in like
    flat = text(20, 20)
    assert "**not reproduced**: no clear decline, and the interval lies below the paper's decline" in flat
    # too few answers: no interval, no verdict either way
    few = text(27, 26, n=6)
    assert "reproduced" not in few and few.count("no interval, so no comparison is drawn") == 3
    # the headline (per position) comes first; the per-dataset details follow, marked as secondary
    assert late.index("answer token 3:") < late.index(ch.POOLED_NOTE) < late.index("**curated**, correctly predicted tokens — ")


def test_paper_comparison_is_per_dataset_and_position_in_fractions_of_depth():
    on = pd.concat([onsets_frame(20, 27, 26), onsets_frame(20, 25, 11).assign(dataset="trivia_qa", item=lambda f: f["item"] + 100)],
                   ignore_index=True)
    k1 = k1_of(on)
    c = ch.paper_comparison(k1, on, ["curated", "trivia_qa"], 30, n_boot=200, seed=0)
    assert list(c["dataset"]) == ["curated"] * 3 + ["trivia_qa"] * 3 and list(c["token"]) == [1, 3, 3] * 2
    pos = c[~c["quantity"].str.contains("paired")].set_index(["dataset", "token"])
    want = k1[k1["correct"]].set_index(["dataset", "token"])["mean_onset"] / 30
    assert np.allclose(pos["value"], want.loc[pos.index]) and np.allclose(pos["paper"], [27 / 32, 12 / 32] * 2)
    assert pos.loc[("curated", 3), "reading"].startswith("not reproduced")
    assert pos.loc[("trivia_qa", 3), "reading"].startswith("consistent")
    assert ch.headline_summary(c.iloc[:0]).startswith("No correctly predicted answer token")
