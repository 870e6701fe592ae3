"""Depth scores, deep-thinking ratio and the early-exit policy on hand-made
trajectories with known answers, and the truncated-pass check on a tiny model."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

import depthkit as dk
from depthkit.analyses.depth_score import (
    deep_thinking_ratio,
    depth_scores,
    exit_sweep,
    saving_at,
    scores_from_arrays,
    token_pos,
    verify_exit,
)
from depthkit.analyses.residual import passage_items
from depthkit.engine.models import ModelInfo
from depthkit.lens.base import LogitLens

# Four predicted tokens of a 4-block model, layers 0..4 (layer 4 = model output).
# (item, position, top-1 per layer, top-1 prob per layer, rank of the final token, true next)
# Over all rows (scores_from_arrays on layers 0..4) / as depth_scores defines them (d1 over
# rows 1..4, d_sat and flips over the lens rows 1..3):
TOKENS = [
    (0, 1, [5, 5, 7, 7, 9], [0.3, 0.6, 0.4, 0.95, 0.8], [10, 4, 2, 2, 1], 9),  # d1 4, d_sat 4, 2 flips / 4, 2, 1; lens ends on 7, not 9
    (0, 2, [3, 8, 8, 8, 8], [0.2, 0.7, 0.9, 0.95, 0.97], [5, 1, 1, 1, 1], 3),  # d1 1, d_sat 1, 1 flip / 1, 1, 0
    (1, 1, [8, 2, 8, 2, 2], [0.9, 0.1, 0.2, 0.3, 0.6], [2, 1, 2, 1, 1], 2),  # d1 1, d_sat 3, 3 flips / 1, 3, 2
    (1, 2, [4, 4, 4, 4, 4], [0.5, 0.5, 0.5, 0.5, 0.5], [1, 1, 1, 1, 1], 1),  # d1 0, d_sat 0, 0 flips / 1, 1, 0
]


@pytest.fixture
def hand_traj() -> dk.Trajectories:
    steps, targets = [], []
    for item, pos, top1, prob, rank, nxt in TOKENS:
        for layer in range(5):
            steps.append(
                dict(item=item, position=pos, layer=layer, top1_id=top1[layer], top1_token=str(top1[layer]),
                     top1_prob=prob[layer], entropy=1.0, kl_to_final=0.0)
            )
            targets.append(dict(item=item, position=pos, layer=layer, target="final", token_id=top1[-1],
                                rank=rank[layer], prob=0.1, logit=0.0))
            targets.append(dict(item=item, position=pos, layer=layer, target="next", token_id=nxt,
                                rank=1, prob=0.1, logit=0.0))
    info = ModelInfo("hand", "none", 4, 8, 16, 64, "none", "tiny", "0")
    return dk.Trajectories(pd.DataFrame(steps), pd.DataFrame(), pd.DataFrame(targets), info, "logit", "canonical")


def test_scores_from_arrays():
    top1 = np.array([t[2] for t in TOKENS])
    rank = np.array([t[4] for t in TOKENS])
    d1, d_sat, flips = scores_from_arrays(top1, rank, np.arange(5))
    assert d1.tolist() == [4, 1, 1, 0]
    assert d_sat.tolist() == [4, 1, 3, 0]
    assert flips.tolist() == [2, 1, 3, 0]
    d1, d_sat, _ = scores_from_arrays(np.array([[1, 2, 2]]), np.array([[3, 2, 2]]), [1, 2, 3])
    assert np.isnan(d1[0]) and d_sat[0] == 2  # never rank 1; settled from the second row (layer 2)


def test_depth_scores(hand_traj):
    s = depth_scores(hand_traj)
    assert s[["item", "position"]].values.tolist() == [[0, 1], [0, 2], [1, 1], [1, 2]]
    # layer 0 is no depth; d_sat and flips read the lens rows 1..3 only, never the model's row 4
    assert s["d1"].tolist() == [4, 1, 1, 1]
    assert s["d_sat_norm"].tolist() == [0.5, 0.25, 0.75, 0.25]
    assert s["flips_norm"].tolist() == [0.25, 0.0, 0.5, 0.0]
    assert s["correct"].tolist() == [True, False, True, False]
    assert s["final_prob"].tolist() == [0.8, 0.97, 0.6, 0.5]
    assert s["settles_on_final"].tolist() == [False, True, True, True]


def test_deep_thinking_ratio(hand_traj):
    s = depth_scores(hand_traj)
    dtr = deep_thinking_ratio(s)
    assert dtr["n_tokens"].tolist() == [2, 2]
    assert dtr["dtr"].tolist() == [0.0, 0.0]  # no lens settles after 85 % of the blocks
    assert deep_thinking_ratio(s, rho=0.7)["dtr"].tolist() == [0.0, 0.5]
    with pytest.raises(ValueError, match="depth fraction"):
        deep_thinking_ratio(s, rho=0)


def test_exit_sweep_policies(hand_traj):
    sw = exit_sweep(hand_traj, taus=[0.5, 0.9, 0.99])
    conf = sw[sw["policy"] == "confidence"].set_index("param")
    # tau 0.9 exits at layers 3 (7, wrong), 2 (8, right), 0 (8, wrong), and the last runs all 4 blocks
    assert conf.loc[0.9, "agreement"] == 0.5 and conf.loc[0.9, "mean_layers"] == pytest.approx(2.25)
    assert conf.loc[0.5, "agreement"] == 0.5 and conf.loc[0.5, "mean_layers"] == pytest.approx(0.5)
    assert conf.loc[0.99, "agreement"] == 1.0 and conf.loc[0.99, "frac_layers"] == 1.0
    fixed = sw[sw["policy"] == "fixed"].set_index("param")
    assert fixed["agreement"].tolist() == [0.25, 0.75, 0.5, 0.75, 1.0]
    assert fixed["frac_layers"].tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    oracle = sw[sw["policy"].str.startswith("oracle")].set_index("policy")
    # d_sat 2, 1, 3, 1, but the first token's lens settles on 7, not the model's 9: it runs all 4 blocks
    assert oracle.loc["oracle (d_sat)", "frac_layers"] == pytest.approx(9 / 16)
    assert oracle.loc["oracle (d_1)", "frac_layers"] == pytest.approx(7 / 16)
    assert (oracle["agreement"] == 1.0).all()


def test_saving_at(hand_traj):
    sw = exit_sweep(hand_traj, taus=[0.5, 0.9, 0.99])
    s99 = saving_at(sw, 0.99).set_index("policy")
    assert s99.loc["confidence", "saving"] == 0.0 and s99.loc["fixed", "saving"] == 0.0
    assert s99.loc["oracle (d_sat)", "saving"] == pytest.approx(7 / 16)
    s75 = saving_at(sw, 0.75).set_index("policy")
    assert s75.loc["fixed", "param"] == 1 and s75.loc["fixed", "saving"] == pytest.approx(0.75)
    sw_no = sw[sw["policy"] != "fixed"].copy()
    sw_no.loc[sw_no["policy"] == "confidence", "agreement"] = 0.1
    assert np.isnan(saving_at(sw_no, 0.99).set_index("policy").loc["confidence", "saving"])


TEXTS = [
    "The cat sat on the mat, and the dog lay by the door.",
    "In 1905 Albert Einstein wrote four papers. Water boils at 100 degrees.",
]


def test_truncated_passes_match_simulation(tiny_llama):
    items = passage_items(tiny_llama, TEXTS, max_tokens=24, min_tokens=4)
    traj = dk.trajectories(tiny_llama, items, lens="logit", progress=False)
    probs = traj.steps["top1_prob"]
    taus = [float(probs.quantile(0.3)), float(probs.quantile(0.8))]
    v = verify_exit(tiny_llama, items, traj, LogitLens(tiny_llama), taus, progress=False)
    assert (v["frac_layers"] < 1).all()  # the check exercises early exits
    assert (v["same_as_simulated"] == 1.0).all()
    assert np.allclose(v["agreement_truncated"], v["agreement_simulated"])
    sim = exit_sweep(traj, taus).query("policy == 'confidence'")
    assert np.allclose(sim["agreement"].to_numpy(), v["agreement_simulated"].to_numpy())


class _Word:
    def __init__(self, i, idx, text, pos):
        self.i, self.idx, self.text, self.pos_ = i, idx, text, pos


class _FakeNLP:
    """Splits on words and punctuation and tags from a table, so the alignment is
    tested without a statistical tagger."""

    TAGS = {"The": "DET", "the": "DET", "cat": "NOUN", "sat": "VERB", "on": "ADP", "mat": "NOUN", ",": "PUNCT",
            "and": "CCONJ", "dog": "NOUN", "lay": "VERB", "by": "ADP", "door": "NOUN", ".": "PUNCT"}

    def pipe(self, texts):
        for t in texts:
            yield [_Word(i, m.start(), m.group(), self.TAGS.get(m.group(), "X"))
                   for i, m in enumerate(re.finditer(r"\w+|[^\w\s]", t))]


def test_token_pos_alignment(tiny_llama):
    text = TEXTS[0]
    items = passage_items(tiny_llama, [text], max_tokens=64, min_tokens=4)
    got = token_pos(tiny_llama, items, [text], nlp=_FakeNLP())
    tok = tiny_llama.tokenizer
    ids = items[0].tokens
    # independent offsets: the decoded pieces of this byte-level BPE concatenate to the text
    pieces = [tok.decode([i]) for i in ids]
    assert "".join(pieces) == text
    starts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
    words = list(_FakeNLP().pipe([text]))[0]
    for _, row in got.iterrows():
        t = row["position"] + 1
        if not pieces[t].strip():
            assert row["pos"] == "SPACE"
            continue
        c = starts[t] + len(pieces[t]) - len(pieces[t].lstrip())
        word = next(w for w in words if w.idx <= c < w.idx + len(w.text))
        assert row["pos"] == word.pos_
    assert set(got["position"]) == set(items[0].positions)
    assert got.loc[got["pos"] == "NOUN", "first_piece"].any()


def test_thresholds_are_chosen_on_one_half_and_measured_on_the_other():
    # choosing half: every tau reaches the target; held-out half: tau 0.5 agrees on 50 % only
    rows = lambda pol, params, agree, frac: pd.DataFrame(  # noqa: E731
        {"policy": pol, "param": params, "agreement": agree, "mean_layers": np.array(frac) * 4, "frac_layers": frac, "n_tokens": 10})
    select = pd.concat([rows("confidence", [0.5, 0.9], [1.0, 1.0], [0.25, 0.5]), rows("fixed", [1.0, 4.0], [0.99, 1.0], [0.25, 1.0]),
                        rows("oracle (d_sat)", [np.nan], [1.0], [0.5])])
    report = pd.concat([rows("confidence", [0.5, 0.9], [0.5, 0.95], [0.3, 0.6]), rows("fixed", [1.0, 4.0], [0.6, 1.0], [0.25, 1.0]),
                        rows("oracle (d_sat)", [np.nan], [1.0], [0.55])])
    from depthkit.analyses.depth_score import held_out_saving

    s = held_out_saving(select, report, 0.99).set_index("policy")
    assert s.loc["confidence", "param"] == 0.5 and s.loc["confidence", "agreement_select"] == 1.0
    assert s.loc["confidence", "agreement"] == 0.5 and s.loc["confidence", "saving"] == pytest.approx(0.7)
    assert s.loc["fixed", "param"] == 1.0 and s.loc["fixed", "agreement"] == 0.6
    assert s.loc["oracle (d_sat)", "saving"] == pytest.approx(0.45)
