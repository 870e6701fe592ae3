"""Activation patching and early exit against identities and an independent
Hugging Face computation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import depthkit as dk
from depthkit.analyses.early_exit import early_exit_table, exit_logits
from depthkit.analyses.patching import (
    class_shares,
    different_answer_sources,
    final_tokens,
    patched_logits,
    patching_sweep,
    transition_layer,
)
from depthkit.engine.batching import masks_by_layer_type
from depthkit.engine.capture import Item, collect_residuals, copy_attention_mask
from depthkit.engine.models import _build_tiny
from depthkit.lens.base import LogitLens

SOURCES = ["The cat sat on the mat and", "Water boils at one hundred", "A quick brown fox"]
TARGETS = ["In 1905 Albert Einstein wrote", "The dog lay by the door of the", "Paris is a city"]


def _last(model, texts):
    return [Item(dk.encode(model, t), [len(dk.encode(model, t)) - 1]) for t in texts]


def _unpatched(model, text):
    ids = torch.tensor([dk.encode(model, text)])
    with torch.no_grad():
        return model(ids)[0, -1]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "neox", "gemma3"])
def test_patching_own_residual_changes_nothing(tiny_models, arch):
    model = tiny_models[arch]
    L = model.cfg.n_layers
    items = _last(model, TARGETS)
    resid = collect_residuals(model, items)  # [depth, target, d]
    layers = [l for l in range(L + 1) for _ in TARGETS]
    rows = [i for _ in range(L + 1) for i in range(len(TARGETS))]
    vec = resid[layers, rows]
    got = patched_logits(model, [items[r].tokens for r in rows], layers, vec, batch_size=5)
    for k, r in enumerate(rows):
        assert (got[k] - _unpatched(model, TARGETS[r])).abs().max().item() < 1e-4


def test_patching_last_layer_copies_source_output(tiny_llama):
    model = tiny_llama
    L = model.cfg.n_layers
    src = collect_residuals(model, _last(model, SOURCES), [L])[0]
    got = patched_logits(model, [dk.encode(model, t) for t in TARGETS], [L] * 3, src)
    for k, s in enumerate(SOURCES):
        assert (got[k] - _unpatched(model, s)).abs().max().item() < 1e-4


def test_patching_layer0_with_target_embedding_changes_nothing(tiny_llama):
    model = tiny_llama
    items = _last(model, TARGETS)
    emb = collect_residuals(model, items, [0])[0]
    got = patched_logits(model, [it.tokens for it in items], [0, 0, 0], emb)
    for k, t in enumerate(TARGETS):
        assert (got[k] - _unpatched(model, t)).abs().max().item() < 1e-4


def test_patching_a_different_vector_changes_the_output(tiny_llama):
    model = tiny_llama
    src = collect_residuals(model, _last(model, SOURCES), [2])[0]
    got = patched_logits(model, [dk.encode(model, t) for t in TARGETS], [2, 2, 2], src)
    assert (got[0] - _unpatched(model, TARGETS[0])).abs().max().item() > 1e-2


@pytest.mark.parametrize("layer", [1, 2, 3])
def test_patched_run_matches_independent_hf_forward(tiny_llama, layer):
    """A fresh Hugging Face model with the same weights, patched with a forward
    pre-hook on its decoder layer (no TransformerLens involved)."""
    model = tiny_llama
    hf, _ = _build_tiny("llama", seed=0, n_layers=model.cfg.n_layers)
    hf.eval()
    src_ids = torch.tensor([dk.encode(model, SOURCES[1])])
    tgt_ids = torch.tensor([dk.encode(model, TARGETS[0])])
    with torch.no_grad():
        src_h = hf(src_ids, output_hidden_states=True).hidden_states[layer][0, -1].clone()

    def pre_hook(module, args, kwargs):
        h = (kwargs.get("hidden_states") if "hidden_states" in kwargs else args[0]).clone()
        h[0, -1] = src_h
        if "hidden_states" in kwargs:
            kwargs["hidden_states"] = h
            return args, kwargs
        return (h, *args[1:]), kwargs

    handle = hf.model.layers[layer].register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        with torch.no_grad():
            expected = hf(tgt_ids).logits[0, -1]
    finally:
        handle.remove()
    sweep_vec = collect_residuals(model, _last(model, [SOURCES[1]]), [layer])[0]
    got = patched_logits(model, [tgt_ids[0].tolist()], [layer], sweep_vec)[0]
    assert (got - expected).abs().max().item() < 1e-4
    assert (expected - _unpatched(model, TARGETS[0])).abs().max().item() > 1e-3  # the patch mattered


def test_patching_sweep_frame_and_classes(tiny_llama):
    model = tiny_llama
    L = model.cfg.n_layers
    t_opts, s_opts = [10, 11, 12], [20, 21]
    df = patching_sweep(model, SOURCES, TARGETS, target_options=t_opts, source_options=s_opts, progress=False)
    assert len(df) == len(TARGETS) * (L + 1)
    assert set(df["class"]) <= {"target-option", "source-option", "other"}
    top = df[df.layer == L]
    src_out = [int(_unpatched(model, s).argmax()) for s in SOURCES]
    assert top.sort_values("pair")["output_id"].tolist() == src_out
    assert set(top["follows"]) <= {"source", "both"}
    bottom = df[df.layer == 0]
    # layer 0 carries only the source's last token embedding: check against a manual run
    for _, row in bottom.iterrows():
        cls = "target-option" if row.output_id in t_opts else "source-option" if row.output_id in s_opts else "other"
        assert row["class"] == cls
    probs = torch.softmax(_unpatched(model, SOURCES[0]), -1)
    assert top[top.pair == 0]["p_source_options"].iloc[0] == pytest.approx(probs[s_opts].sum().item(), abs=1e-5)
    shares = class_shares(df)
    assert np.allclose(shares.groupby("layer")["share"].sum(), 1.0)


def test_transition_layer_on_a_hand_made_sweep():
    rows = []
    for pair in range(10):
        for layer in range(6):
            cls = "source-option" if layer >= 3 + (pair % 2) else "target-option"
            rows.append({"pair": pair, "layer": layer, "class": cls})
    df = pd.DataFrame(rows)
    out = transition_layer(df, n_boot=200)
    # half the pairs switch at 3, half at 4: at layer 3 the shares tie (not ahead) -> 4
    assert out["transition_layer"] == 4
    assert 3 <= out["lo"] <= out["hi"] <= 5
    never = df.assign(**{"class": "target-option"})
    assert np.isnan(transition_layer(never, n_boot=50)["transition_layer"])


def test_random_sources_have_a_different_answer():
    answers = [0, 1, 1, 0, 1, 1, 1]
    for seed in range(20):
        src = different_answer_sources(answers, seed)
        assert len(src) == len(answers)
        assert all(answers[s] != answers[i] for i, s in enumerate(src))
    with pytest.raises(ValueError, match="two different answers"):
        different_answer_sources([1, 1, 1])


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_truncated_forward_matches_the_sweep_and_full_model(tiny_models, arch):
    model = tiny_models[arch]
    L = model.cfg.n_layers
    lens = LogitLens(model)
    items = _last(model, TARGETS)
    full = exit_logits(model, items, L, lens=lens)
    for k, t in enumerate(TARGETS):
        assert (full[k] - _unpatched(model, t)).abs().max().item() < 1e-4
    resid = collect_residuals(model, items)
    for layer in range(L):
        got = exit_logits(model, items, layer, lens=lens)
        assert (got - lens(resid[layer], layer)).abs().max().item() < 1e-4


def test_early_exit_table(tiny_llama):
    model = tiny_llama
    L = model.cfg.n_layers
    gold = [5, 6, 7]
    opts = {"opt0": [5, 6, 7], "opt1": [8, 9, 10]}
    traj = dk.trajectories(model, TARGETS, targets={"gold": gold, **opts}, progress=False)
    tab = early_exit_table(traj, gold="gold", options=["opt0", "opt1"])
    assert tab["layer"].tolist() == list(range(L + 1))
    assert tab["compute_fraction"].iloc[-1] == 1.0 and tab["compute_fraction"].iloc[0] == 0.0
    last = tab.iloc[-1]
    assert last.agreement == 1.0 and last.choice_agreement == 1.0
    # by hand at layer 1
    lens = LogitLens(model)
    resid = collect_residuals(model, _last(model, TARGETS))
    z = lens(resid[1], 1)
    final = lens(resid[L], None)
    agree = (z.argmax(-1) == final.argmax(-1)).float().mean().item()
    acc = np.mean([int(z[i].argmax()) == gold[i] for i in range(3)])
    choice = [int(z[i, [opts["opt0"][i], opts["opt1"][i]]].argmax()) for i in range(3)]
    row = tab[tab.layer == 1].iloc[0]
    assert row.agreement == pytest.approx(agree)
    assert row.accuracy == pytest.approx(acc)
    assert row.choice_accuracy == pytest.approx(np.mean([c == 0 for c in choice]))
    with pytest.raises(ValueError):
        exit_logits(model, TARGETS, L + 1, lens=lens)
    with pytest.raises(ValueError, match="not among the option tokens"):
        early_exit_table(traj, gold="opt1", options=["opt0"])


def test_copy_attention_mask_by_hand():
    # 2 cached prefix tokens, 2 context tokens, 3 copies of the last token.
    m = copy_attention_mask(2, 2, 3)[0, 0].int().tolist()
    assert m == [
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],  # each copy sees prefix, context and itself only
        [1, 1, 1, 1, 0, 1, 0],
        [1, 1, 1, 1, 0, 0, 1],
    ]
    # Window 3: the cache kept the last 2 prefix tokens; a query at position p sees
    # keys at positions > p - 3. Positions: prefix 0-1 (kept 0-1), context 2-3, copies 4.
    w = copy_attention_mask(2, 2, 2, window=3)[0, 0].int().tolist()
    assert w == [
        [1, 1, 1, 0, 0, 0],
        [0, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 1, 1, 0, 1],
    ]
    assert copy_attention_mask(5, 1, 1, window=3).shape[-1] == 2 + 2  # only window - 1 prefix keys stay cached


def test_a_sliding_window_model_takes_a_mask_per_layer_type_only_past_its_window(tiny_models, tiny_llama):
    gemma = tiny_models["gemma3"]  # sliding window of 32 positions

    def copies(columns: int):  # a cached prefix, 11 context tokens and 2 copies of the last: ``columns`` positions
        return lambda window: copy_attention_mask(columns - 12, 11, 2, window)

    at, past = copies(32), copies(33)
    assert torch.equal(at(32), at(None)) and not torch.equal(past(32), past(None))
    assert torch.equal(masks_by_layer_type(gemma, 32, at), at(None))  # the window hides nothing yet
    both = masks_by_layer_type(gemma, 33, past)
    assert torch.equal(both["full_attention"], past(None)) and torch.equal(both["sliding_attention"], past(32))
    assert torch.equal(masks_by_layer_type(tiny_llama, 1000, past), past(None))  # no sliding-window layers

def test_final_tokens_are_the_models_own_top1(tiny_llama):
    got = final_tokens(tiny_llama, TARGETS + [TARGETS[0] + " and"])
    want = [int(_unpatched(tiny_llama, t).argmax()) for t in TARGETS + [TARGETS[0] + " and"]]
    assert got.tolist() == want


def test_clean_runs_run_each_prompt_once_and_change_nothing(tiny_llama, monkeypatch):
    import depthkit.analyses.patching as patching_module

    opts = [dk.encode(tiny_llama, " the")[0], dk.encode(tiny_llama, " a")[0]]
    alone = [patching_sweep(tiny_llama, s, t, target_options=opts, source_options=opts, progress=False)
             for s, t in ((SOURCES, TARGETS), (TARGETS, SOURCES))]
    run = patching_module.residual_rows
    passes: list[int] = []
    monkeypatch.setattr(patching_module, "residual_rows", lambda m, items, *a, **k: passes.append(len(items)) or run(m, items, *a, **k))
    clean = patching_module.CleanRuns(tiny_llama)
    shared = [patching_sweep(tiny_llama, s, t, target_options=opts, source_options=opts, progress=False, clean=clean)
              for s, t in ((SOURCES, TARGETS), (TARGETS, SOURCES))]
    final_tokens(tiny_llama, TARGETS, clean=clean)
    # The second direction and the final tokens read prompts the first direction ran.
    assert passes == [len(SOURCES) + len(TARGETS)]
    for a, b in zip(alone, shared):
        pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize("convention", ["canonical", "authors"])
def test_clean_runs_kept_by_the_option_ranks_are_not_run_again(tiny_llama, monkeypatch, convention):
    import depthkit.analyses.patching as patching_module
    from depthkit.analyses.mcq import add_option_ids, option_ranks

    # A shared lead-in longer than MIN_SHARED_TOKENS, so the cached-prefix path runs too.
    lead = "The cat sat on the mat and the dog lay by the door of the house in Paris, and then "
    prompts = [lead + t for t in TARGETS] + SOURCES
    f = add_option_ids(tiny_llama, pd.DataFrame({"task": ["a"] * 3 + ["b"] * 3, "example": range(6), "prompt": prompts,
                                                 "options": [[" the", " a"]] * 6, "gold": [0, 1, 0, 1, 0, 1]}))
    clean = patching_module.CleanRuns(tiny_llama)
    kept = option_ranks(tiny_llama, f, lens="logit", convention=convention, progress=False, clean=clean)
    # Keeping the residuals changes nothing in the ranks.
    pd.testing.assert_frame_equal(kept, option_ranks(tiny_llama, f, lens="logit", convention=convention, progress=False))
    ids = [dk.encode(tiny_llama, t) for t in prompts]
    fresh = patching_module.CleanRuns(tiny_llama)(ids)
    monkeypatch.setattr(patching_module, "residual_rows", lambda *a, **k: pytest.fail("a kept prompt ran again"))
    got = clean(ids)
    assert got.shape == (tiny_llama.cfg.n_layers + 1, len(prompts), tiny_llama.cfg.d_model)
    torch.testing.assert_close(got, fresh, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="all .* depths"):
        clean.keep(_last(tiny_llama, SOURCES[:1]), got[:2, :1])


def test_patched_targets_given_as_arrays_or_lists_meet_under_one_key(tiny_llama):
    from depthkit.engine.batching import token_key
    from depthkit.engine.capture import patched_final_residuals

    seq = dk.encode(tiny_llama, TARGETS[0])
    assert token_key(seq) == token_key(np.asarray(seq)) == token_key(torch.tensor(seq))
    vectors = torch.randn(3, tiny_llama.info.d_model, generator=torch.Generator().manual_seed(0))
    vectors[2] = vectors[0]  # the same patch twice: the same answer wherever it sits in the group
    as_lists = patched_final_residuals(tiny_llama, [list(seq)] * 3, [1, 2, 1], vectors)
    mixed = patched_final_residuals(tiny_llama, [np.asarray(seq), torch.tensor(seq), list(seq)], [1, 2, 1], vectors)
    torch.testing.assert_close(as_lists, mixed, rtol=0, atol=0)
    torch.testing.assert_close(as_lists[0], as_lists[2], rtol=0, atol=0)
