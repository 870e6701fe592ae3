"""Fact-recall data, teacher forcing by ids and onset tables."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import depthkit as dk
from depthkit import data as dkdata
from depthkit.analyses.facts import (
    answer_ranks,
    continuation,
    fact_items,
    fact_onsets,
    fact_prompts,
    load_facts,
    onset_table,
    trivia_cloze,
)


def test_curated_set_is_large_clean_and_unique():
    f = load_facts()
    assert len(f) >= 300
    assert f["prompt"].is_unique
    assert f["category"].nunique() >= 8
    assert not f["prompt"].str.endswith(" ").any() and not f["answer"].str.startswith(" ").any()
    caps = load_facts("capital")
    assert caps[caps.prompt == "The capital of France is"]["answer"].item() == "Paris"
    with pytest.raises(dkdata.DataError):
        load_facts("nope")


def test_trivia_cloze_and_user_file(tmp_path):
    t = trivia_cloze(5, seed=0)
    assert len(t) == 5 and t["prompt"].str.endswith("\nA:").all() and t["prompt"].str.startswith("Q: ").all()
    path = tmp_path / "f.json"
    path.write_text(json.dumps([{"prompt": "One plus one is", "answer": "two"}]))
    u = fact_prompts(str(path))
    assert u["category"].tolist() == ["file"]
    with pytest.raises(dkdata.DataError):
        fact_prompts("no-such-thing")


def test_continuation():
    assert continuation("The capital is", "Paris") == " Paris"
    assert continuation("The capital is ", "Paris") == "Paris"
    assert continuation("x", " y") == " y"


def test_teacher_forcing_uses_answer_ids(tiny_llama):
    facts = pd.DataFrame({"prompt": ["The cat sat on the"], "answer": ["mat and the dog"], "category": ["x"]})
    items, meta = fact_items(tiny_llama, facts, max_tokens=3)
    ans = dk.answer_token_ids(tiny_llama, "The cat sat on the", " mat and the dog")
    p = dk.encode(tiny_llama, "The cat sat on the")
    it = items[0]
    assert it.tokens == p + ans[:2]
    assert it.positions == [len(p) - 1, len(p), len(p) + 1]
    assert it.targets["answer"] == ans[:3]
    assert meta["token"].tolist() == [1, 2, 3] and (meta["answer_len"] == len(ans)).all()


def test_answer_ranks_match_a_manual_forward(tiny_llama):
    facts = pd.DataFrame({"prompt": ["The cat sat on the", "Water boils at"], "answer": ["mat and the dog", "one"], "category": ["a", "b"]})
    r = answer_ranks(tiny_llama, facts, lens="logit", progress=False)
    L = tiny_llama.cfg.n_layers
    items, _ = fact_items(tiny_llama, facts)
    with torch.no_grad():
        logits = tiny_llama(torch.tensor([items[0].tokens]))[0]
    for j, pos in enumerate(items[0].positions):
        row = r[(r.item == 0) & (r.token == j + 1) & (r.layer == L)].iloc[0]
        z = logits[pos]
        tid = items[0].targets["answer"][j]
        assert row.token_id == tid
        assert row["rank"] == 1 + int((z > z[tid]).sum())
        assert row.correct == (int(z.argmax()) == tid)


def test_onsets_by_hand():
    rows = []
    # item 0 token 1 reaches rank 1 at layer 2; token 2 at layer 1; item 1 token 1 never
    for item, token, ranks, correct in [(0, 1, [9, 3, 1, 1], True), (0, 2, [5, 1, 1, 1], True), (1, 1, [50, 40, 30, 20], False)]:
        for layer, rk in enumerate(ranks):
            rows.append(dict(item=item, position=10 + token, token=token, answer_len=2, length_group="2", category="c", layer=layer, rank=rk, correct=correct))
    on = fact_onsets(pd.DataFrame(rows), ks=[1, 10, 100])
    get = lambda i, t, k: on[(on.item == i) & (on.token == t) & (on.k == k)]["onset"].item()  # noqa: E731
    # layer 0 (the embedding through the lens) is no depth: rank 9 there counts from layer 1
    assert get(0, 1, 1) == 2 and get(0, 2, 1) == 1 and get(0, 1, 10) == 1
    assert np.isnan(get(1, 1, 1)) and get(1, 1, 100) == 1
    tab = onset_table(on, k=1, n_boot=50)
    t1c = tab[(tab.token == 1) & (tab.correct)].iloc[0]
    assert t1c.mean_onset == 2 and t1c.n_reached == 1
    t1w = tab[(tab.token == 1) & (~tab.correct)].iloc[0]
    assert np.isnan(t1w.mean_onset) and t1w.n_items == 1
