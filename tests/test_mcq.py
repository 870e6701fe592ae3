"""Multiple-choice prompts and the option collection / reasoning analysis."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from depthkit import data as dkdata
from depthkit.analyses.mcq import (
    SYMBOLS,
    WORD_TASKS,
    Example,
    accuracy,
    add_option_ids,
    build_prompts,
    collection_reasoning,
    first_layer_reaching,
    layer_estimates,
    load_mcq_file,
    option_ranks,
    per_item,
    render,
)
from depthkit.data import choice_sets


def _frame(spec):
    """spec: {item: (gold, [[rank, prob] per option] per layer)} -> rank frame."""
    rows = []
    for item, (task, gold, layers) in spec.items():
        for layer, opts in enumerate(layers):
            for o, (rank, prob) in enumerate(opts):
                rows.append(dict(task=task, item=item, layer=layer, option=o, rank=rank, prob=prob, is_gold=o == gold))
    return pd.DataFrame(rows)


HAND = _frame(
    {
        # item 0: options collected from layer 1, choice settles on option 1 at layer 2
        0: ("t", 1, [[(50, 0.01), (90, 0.0)], [(1, 0.3), (2, 0.2)], [(2, 0.2), (1, 0.5)], [(2, 0.1), (1, 0.8)]]),
        # item 1: never collected (option 1 stays far), answer option 0 throughout, gold 1
        1: ("t", 1, [[(3, 0.2), (400, 0.0)], [(1, 0.6), (7, 0.01)], [(1, 0.7), (9, 0.01)], [(1, 0.9), (5, 0.02)]]),
    }
)


def test_per_item_and_shares_by_hand():
    p = per_item(HAND)
    assert p[p.item == 0]["collected"].tolist() == [False, True, True, True]
    assert p[p.item == 1]["collected"].tolist() == [False, False, False, False]
    assert p[p.item == 0]["choice"].tolist() == [0, 0, 1, 1]
    assert (p[p.item == 0]["answer"] == 1).all() and (p[p.item == 1]["answer"] == 0).all()
    s = collection_reasoning(HAND)
    assert s["collected_share"].tolist() == [0.0, 0.5, 0.5, 0.5]
    assert s["final_share"].tolist() == [0.5, 0.5, 1.0, 1.0]
    assert s["gold_share"].tolist() == [0.0, 0.0, 0.5, 0.5]
    assert s["mass"].iloc[3] == pytest.approx(((0.1 + 0.8) + (0.9 + 0.02)) / 2)
    acc = accuracy(HAND)
    assert acc["accuracy"].iloc[0] == 0.5
    # answers 1 and 0, one each: a tie goes to the first option
    assert acc["majority_answer"].iloc[0] == 0 and acc["majority_share"].iloc[0] == 0.5


def test_layer_estimates_by_hand():
    est = layer_estimates(HAND, n_boot=200, min_n=1).iloc[0]
    assert est.collection_layer == 1  # half of the peak share (0.5) is reached at layer 1
    assert est.peak_collected_share == 0.5
    assert est.decision_layer == 2  # agreement with the answer is 1.0 from layer 2 on
    assert est.decision_lo <= 2 <= est.decision_hi
    assert est.n_layers == 3


def test_first_layer_reaching():
    layers = np.array([0, 1, 2, 3, 4])
    curve = np.array([0.1, 0.95, 0.5, 0.92, 1.0])
    assert first_layer_reaching(curve, layers, 0.9, stay=False) == 1
    assert first_layer_reaching(curve, layers, 0.9, stay=True) == 3
    assert np.isnan(first_layer_reaching(curve * 0.5, layers, 0.9, stay=True))


def test_bad_rank_frame_raises():
    with pytest.raises(ValueError, match="lacks columns"):
        per_item(HAND.drop(columns="prob"))
    with pytest.raises(ValueError, match="duplicate"):
        per_item(pd.concat([HAND, HAND.head(1)]))


def test_render_letters_and_verbalisers():
    ex = Example("Review: good", "Sentiment", ("negative", "positive"), 1)
    text, opts, gold = render(ex, None, [1, 0])
    assert text.endswith("Sentiment (positive or negative):") and opts == [" negative", " positive"] and gold == 1
    text, opts, gold = render(ex, ("A", "B"), [1, 0])
    assert "A. positive\nB. negative\nAnswer:" in text and opts == [" A", " B"] and gold == 0


def test_render_written_out_options():
    ex = Example("Which organelle makes energy?", "", ("nucleus", "mitochondria", "ribosome"), 1)
    text, opts, gold = render(ex, "words", [2, 0, 1])
    assert text == "Which organelle makes energy?\nChoices: ribosome; nucleus; mitochondria\nAnswer:"
    # columns stay in canonical order whatever the listing order
    assert opts == [" nucleus", " mitochondria", " ribosome"] and gold == 1


@pytest.mark.parametrize("task", WORD_TASKS)
def test_word_tasks_answer_with_the_gold_choice_itself(task):
    f = build_prompts(task, 6, shots=3, seed=2)
    pool = choice_sets.choice_set(task.removesuffix("_words"))
    assert len(f) == 6 and (f["labels"] == "default").all()
    for ex, prompt, opts, gold in zip(f.example, f.prompt, f.options, f.gold):
        head, last = prompt.rsplit("\n\n", 1)
        assert last.endswith("\nAnswer:") and last not in head
        assert len(head.split("\nAnswer: ")) == 4  # three demonstrations, each answered with words
        assert opts == [f" {c}" for c in pool.choices.iloc[ex]] and opts[gold] == f" {pool.choices.iloc[ex][pool.answer.iloc[ex]]}"
        firsts = [o.split()[0].lower() for o in opts]
        assert len(set(firsts)) == len(firsts)  # only questions whose options start differently


def test_dropping_options_that_share_a_first_token(tiny_llama):
    f = pd.DataFrame({"task": ["x", "x", "y"], "prompt": ["a", "b", "c"], "options": [[" cat", " cat"], [" cat", " dog"], [" the", " the"]],
                      "gold": [0, 1, 0], "example": [0, 1, 2]})
    out = add_option_ids(tiny_llama, f, drop_shared=True)
    assert out["prompt"].tolist() == ["b"] and out.index.tolist() == [0]
    assert out.attrs["dropped_shared_first_token"] == {"x": 1, "y": 1}
    with pytest.raises(ValueError, match="share a first token"):
        add_option_ids(tiny_llama, f)


@pytest.mark.parametrize("task", ["mmlu", "sst2", "mrpc", "rte", "arc_easy", "arc_challenge", "sciq", "openbookqa", "piqa"])
def test_build_prompts_never_uses_the_evaluated_example_as_demo(task):
    f = build_prompts(task, 6, shots=4, seed=3)
    assert len(f) == 6 and f["prompt"].is_unique
    for prompt, opts, gold in zip(f.prompt, f.options, f.gold):
        head, last = prompt.rsplit("\n\n", 1)
        assert last not in head  # the question is not among the demonstrations
        assert 0 <= gold < len(opts)
        assert prompt.endswith(":")
        # four demonstrations, each closed by an option continuation
        assert sum(head.count(f"{o}\n\n") for o in opts) + sum(head.endswith(o) for o in opts) == 4
    if task in dkdata.GLUE_TASKS:
        pool = dkdata.glue(task)
        assert (f["gold"].to_numpy() == pool.label.to_numpy()[f["example"].to_numpy()]).all()
    if task in choice_sets.SETS:
        pool = choice_sets.choice_set(task)
        for ex, prompt, opts, gold in zip(f.example, f.prompt, f.options, f.gold):
            # the gold letter names the gold choice of that very question
            assert f"{opts[gold].strip()}. {pool.choices.iloc[ex][pool.answer.iloc[ex]]}" in prompt.rsplit("\n\n", 1)[1]
            assert len(opts) == len(pool.choices.iloc[ex]) and opts[0] == " A"


def test_choice_sets_are_clean_and_sciq_answers_are_not_always_a():
    for task in choice_sets.SETS:
        f = choice_sets.choice_set(task)
        n = 2 if task == "piqa" else 4
        assert len(f) > 250 and (f.choices.map(len) == n).all() and f.answer.between(0, n - 1).all(), task
        assert f.answer.value_counts(normalize=True).max() < 0.35 + (0.25 if n == 2 else 0), task
    sciq = choice_sets.choice_set("sciq")
    raw = choice_sets._arrow_table("sciq/none/validation").column("correct_answer").to_pylist()
    assert [c[a] for c, a in zip(sciq.choices, sciq.answer)] == raw  # the right answer is kept, only moved
    with pytest.raises(dkdata.DataError, match="Unknown multiple-choice set"):
        choice_sets.choice_set("hellaswag")


def test_symbols_and_permutation_keep_the_gold_option():
    plain = build_prompts("mmlu", 8, seed=1)
    perm = build_prompts("mmlu", 8, seed=1, labels="symbols", permute=True)
    assert (plain.example == perm.example).all()
    mm = dkdata.mmlu(split="test")
    for (_, a), (_, b) in zip(plain.iterrows(), perm.iterrows()):
        choices = mm.choices.iloc[a.example]
        assert f"{a.options[a.gold].strip()}. {choices[mm.answer.iloc[a.example]]}" in a.prompt.rsplit("\n\n", 1)[1]
        assert f"{b.options[b.gold].strip()}. {choices[mm.answer.iloc[b.example]]}" in b.prompt.rsplit("\n\n", 1)[1]
        assert b.options == [f" {s}" for s in SYMBOLS]
    assert (perm.gold != plain.gold).any()


def test_user_file(tmp_path):
    path = tmp_path / "mc.jsonl"
    recs = [{"prompt": "2 + 2 =", "options": [" 4", " 5"], "answer": " 4"}, {"prompt": "Sky:", "options": [" blue", " red"], "answer": 1}]
    path.write_text("\n".join(json.dumps(r) for r in recs))
    f = load_mcq_file(path)
    assert f["gold"].tolist() == [0, 1] and f["task"].tolist() == ["mc", "mc"]
    # Named after its file; a file called like an embedded task keeps its own name.
    clash = tmp_path / "mmlu.json"
    clash.write_text(json.dumps(recs))
    assert load_mcq_file(clash)["task"].tolist() == ["mmlu_file", "mmlu_file"]
    assert load_mcq_file(path, task="quiz")["task"].tolist() == ["quiz", "quiz"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "options": [" a", " b"], "answer": " c"}))
    with pytest.raises(dkdata.DataError, match="neither one of the options"):
        load_mcq_file(bad)


def test_option_ranks_on_tiny_model(tiny_llama):
    # Short prompts and words the tiny tokenizer knows (its context is 256 tokens).
    f = pd.DataFrame(
        {
            "task": ["a", "a", "b"],
            "example": [0, 1, 2],
            "prompt": ["The cat sat on the", "The dog lay by", "Water boils at"],
            "options": [[" the", " cat"], [" the", " cat"], [" the", " door"]],
            "gold": [0, 1, 1],
        }
    )
    f = add_option_ids(tiny_llama, f)
    r = option_ranks(tiny_llama, f, lens="logit", progress=False)
    L = tiny_llama.cfg.n_layers
    assert len(r) == 3 * (L + 1) * 2
    assert r.groupby("item")["is_gold"].sum().eq(L + 1).all()
    s = collection_reasoning(r)
    assert s[s.layer == L]["final_share"].eq(1.0).all()
    r2, trajs = option_ranks(tiny_llama, f, lens="logit", progress=False, return_trajectories=True)
    pd.testing.assert_frame_equal(r, r2)
    assert sorted(trajs) == ["a", "b"]
    gold = trajs["a"].target("gold")
    assert gold["token_id"].drop_duplicates().tolist() == [f.option_ids[0][0], f.option_ids[1][1]]
    same = pd.DataFrame({"task": ["x"], "prompt": ["a"], "options": [[" a", " a"]], "gold": [0], "example": [0]})
    with pytest.raises(ValueError, match="share a first token"):
        add_option_ids(tiny_llama, same)


def test_accuracy_reports_a_model_that_answers_alike():
    same = _frame(
        {
            0: ("t", 0, [[(1, 0.6), (2, 0.3)], [(1, 0.7), (2, 0.2)]]),
            1: ("t", 1, [[(1, 0.5), (2, 0.4)], [(1, 0.8), (2, 0.1)]]),
            2: ("t", 0, [[(2, 0.3), (1, 0.6)], [(1, 0.6), (2, 0.3)]]),
        }
    )
    acc = accuracy(same).iloc[0]
    assert acc["majority_answer"] == 0 and acc["majority_share"] == 1.0
    assert acc["accuracy"] == pytest.approx(2 / 3)
