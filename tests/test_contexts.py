"""Kept contexts: the key/value states an unpatched run leaves behind give the same
patched outputs as running the target again, and the patched runs then feed only
the copies of the last token."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from conftest import hooked_patch

import depthkit as dk
from depthkit.analyses.patching import CleanRuns, patching_sweep
from depthkit.engine.capture import Item, patched_final_residuals
from depthkit.engine.contexts import can_keep

KEEPING = ("llama", "gpt2", "neox")


def _prompts(vocab: int) -> list[list[int]]:
    # Three prompts sharing a 40-token lead (a cached prefix), three sharing nothing (packed rows).
    g = torch.Generator().manual_seed(0)
    lead = torch.randint(5, vocab, (40,), generator=g).tolist()
    tail = lambda n: torch.randint(5, vocab, (n,), generator=g).tolist()  # noqa: E731
    return [lead + tail(7), lead + tail(3), lead + tail(12), tail(15), tail(9), tail(4)]


def _kept(model, seqs: list[list[int]], **clean) -> CleanRuns:
    runs = CleanRuns(model, targets=seqs, **clean)
    dk.trajectories(model, [Item(s, [len(s) - 1]) for s in seqs], keep=runs.keep, keep_contexts=runs, progress=False)
    return runs


def _rows(model, seqs: list[list[int]]) -> tuple[list[list[int]], list[int], torch.Tensor]:
    layers = list(range(model.info.n_blocks + 1))
    targets = [s for s in seqs for _ in layers]
    vectors = 3.0 * torch.randn(len(targets), model.info.d_model, generator=torch.Generator().manual_seed(1))
    return targets, layers * len(seqs), vectors


@pytest.mark.parametrize("arch", KEEPING)
def test_kept_contexts_give_the_patched_outputs_of_a_full_run(tiny_models, arch):
    model = tiny_models[arch]
    seqs = _prompts(model.info.d_vocab)
    runs = _kept(model, seqs)
    assert sorted(runs.contexts) == sorted(tuple(s) for s in seqs)  # prefix group and packed rows alike
    assert {len(c.own[0][0][0, 0]) for c in runs.contexts.values()} == {7 - 1, 3 - 1, 12 - 1, 15 - 1, 9 - 1, 4 - 1}
    targets, layers, vectors = _rows(model, seqs)
    got = patched_final_residuals(model, targets, layers, vectors, contexts=runs.contexts)
    again = patched_final_residuals(model, targets, layers, vectors)
    torch.testing.assert_close(got, again, rtol=0, atol=1e-5)
    for r in range(0, len(targets), 7):
        torch.testing.assert_close(got[r], hooked_patch(model, targets[r], layers[r], vectors[r]), rtol=0, atol=1e-4)


def test_kept_contexts_run_only_the_copies_several_targets_a_pass(tiny_llama, monkeypatch):
    import depthkit.engine.patched as patched_module

    seqs = _prompts(tiny_llama.info.d_vocab)
    runs = _kept(tiny_llama, seqs)
    targets, layers, vectors = _rows(tiny_llama, seqs)
    shapes: list[tuple[int, ...]] = []
    execute_all = tiny_llama.backend.execute_all
    monkeypatch.setattr(tiny_llama.backend, "execute_all", lambda calls: execute_all([shapes.append(tuple(c.tokens.shape)) or c for c in calls]))
    whole = patched_final_residuals(tiny_llama, targets, layers, vectors, contexts=runs.contexts)
    copies = tiny_llama.info.n_blocks + 1  # one patched row per depth, and no context token
    assert shapes == [(len(seqs), copies)]
    shapes.clear()
    monkeypatch.setattr(patched_module, "KEPT_ROWS_PER_PASS", 2 * copies)
    split = patched_final_residuals(tiny_llama, targets, layers, vectors, contexts=runs.contexts)
    assert shapes == [(2, copies)] * 3
    torch.testing.assert_close(split, whole, rtol=0, atol=1e-5)


def test_a_model_with_sliding_window_layers_keeps_the_contexts_its_window_holds(tiny_models):
    model = tiny_models["gemma3"]  # sliding window of 32 positions
    assert not can_keep(model) and can_keep(model, 31) and not can_keep(model, 32)
    seqs = _prompts(model.info.d_vocab)
    plain = dk.trajectories(model, [Item(s, [len(s) - 1]) for s in seqs], progress=False)
    runs = CleanRuns(model, targets=seqs)
    kept = dk.trajectories(model, [Item(s, [len(s) - 1]) for s in seqs], keep=runs.keep, keep_contexts=runs, progress=False)
    pd.testing.assert_frame_equal(kept.targets, plain.targets, check_exact=True)  # keeping states changes no result
    # The three packed prompts share a row of 28 positions; the cached prefix and its tails make 52.
    assert sorted(runs.contexts) == sorted(tuple(s) for s in seqs[3:])
    targets, layers, vectors = _rows(model, seqs)
    got = patched_final_residuals(model, targets, layers, vectors, contexts=runs.contexts)
    torch.testing.assert_close(got, patched_final_residuals(model, targets, layers, vectors), rtol=0, atol=1e-5)
    for r in range(0, len(targets), 7):
        torch.testing.assert_close(got[r], hooked_patch(model, targets[r], layers[r], vectors[r]), rtol=0, atol=1e-4)


def test_a_context_longer_than_a_sliding_window_is_not_used(tiny_models, monkeypatch):
    import depthkit.engine.capture as capture_module

    model = tiny_models["gemma3"]
    seqs = _prompts(model.info.d_vocab)
    # Kept as if the window allowed it: states of every position, every layer.
    monkeypatch.setattr(capture_module, "can_keep", lambda m, columns=None: True)
    runs = _kept(model, seqs)
    assert len(runs.contexts) == len(seqs)
    monkeypatch.undo()
    targets, layers, vectors = _rows(model, seqs[:3])  # 43-52 tokens: past the window
    torch.testing.assert_close(patched_final_residuals(model, targets, layers, vectors, contexts=runs.contexts),
                               patched_final_residuals(model, targets, layers, vectors), rtol=0, atol=0)


def test_contexts_past_the_budget_run_again_with_the_same_result(tiny_llama):
    seqs = _prompts(tiny_llama.info.d_vocab)
    assert _kept(tiny_llama, seqs, context_mb=0).contexts == {}
    every = _kept(tiny_llama, seqs).contexts.values()
    total = sum(c.own_bytes for c in every) + next(c.prefix for c in every if c.prefix is not None).nbytes
    some = _kept(tiny_llama, seqs, context_mb=0.8 * total / 2**20)
    assert 0 < len(some.contexts) < len(seqs)
    targets, layers, vectors = _rows(tiny_llama, seqs)
    torch.testing.assert_close(patched_final_residuals(tiny_llama, targets, layers, vectors, contexts=some.contexts),
                               patched_final_residuals(tiny_llama, targets, layers, vectors), rtol=0, atol=1e-5)


def test_a_prompt_twice_in_one_pass_is_kept_and_counted_once(tiny_llama):
    seqs = _prompts(tiny_llama.info.d_vocab)
    every = list(_kept(tiny_llama, seqs).contexts.values())
    total = sum(c.own_bytes for c in every) + next(c.prefix for c in every if c.prefix is not None).nbytes
    # Room for every distinct context exactly: a duplicate charged twice would push the last ones out.
    twice = _kept(tiny_llama, [s for s in seqs for _ in range(2)], context_mb=(total + 0.5) / 2**20)
    assert sorted(twice.contexts) == sorted(tuple(s) for s in seqs)


def test_only_the_declared_targets_keep_a_context(tiny_llama):
    seqs = _prompts(tiny_llama.info.d_vocab)
    runs = CleanRuns(tiny_llama, targets=seqs[1:3])
    dk.trajectories(tiny_llama, [Item(s, [len(s) - 1]) for s in seqs], keep=runs.keep, keep_contexts=runs, progress=False)
    assert sorted(runs.contexts) == sorted(tuple(s) for s in seqs[1:3])


def test_option_ranks_keeping_contexts_change_nothing_and_the_sweep_agrees(tiny_llama):
    from depthkit.analyses.mcq import add_option_ids, option_ranks

    lead = "The cat sat on the mat and the dog lay by the door of the house in Paris, and then "
    prompts = [lead + t for t in ("the bird", "a fish", "the old man")] + ["One two three", "Red and blue", "It was a"]
    f = add_option_ids(tiny_llama, pd.DataFrame({"task": ["a"] * 3 + ["b"] * 3, "example": range(6), "prompt": prompts,
                                                 "options": [[" the", " a"]] * 6, "gold": [0, 1, 0, 1, 0, 1]}))
    runs = CleanRuns(tiny_llama, targets=prompts)
    kept = option_ranks(tiny_llama, f, lens="logit", progress=False, clean=runs)
    pd.testing.assert_frame_equal(kept, option_ranks(tiny_llama, f, lens="logit", progress=False))
    assert len(runs.contexts) == len(prompts)
    opts = list(f["option_ids"].iloc[0])
    sweep = lambda clean: patching_sweep(tiny_llama, prompts[3:], prompts[:3], target_options=opts,  # noqa: E731
                                         source_options=opts, progress=False, clean=clean)
    with_contexts, without = sweep(runs), sweep(None)
    pd.testing.assert_frame_equal(with_contexts.drop(columns=["output_prob", "p_target_options", "p_source_options"]),
                                  without.drop(columns=["output_prob", "p_target_options", "p_source_options"]))
    for col in ("output_prob", "p_target_options", "p_source_options"):
        assert (with_contexts[col] - without[col]).abs().max() < 1e-5


def test_chapter_02_declares_every_paired_prompt_as_a_target(tiny_llama):
    from depthkit.chapters import ch02_mcq_collection_vs_reasoning as ch

    prompts = pd.DataFrame({"task": ["s"] * 3 + ["t"] * 3 + ["c"] * 3 + ["x"] * 2, "prompt": [f"p{i} words" for i in range(11)]})
    p = {"patch_source": "s", "patch_target": "t", "patch_control": "c", "n_pairs": 2}
    runs = ch.clean_runs(tiny_llama, prompts, p)
    want = [f"p{i} words" for i in (0, 1, 3, 4, 6, 7)]
    assert runs.wants_context(dk.encode(tiny_llama, want[0]))
    assert all(runs.wants_context(dk.encode(tiny_llama, w)) for w in want)
    assert not any(runs.wants_context(dk.encode(tiny_llama, f"p{i} words")) for i in (2, 5, 8, 9, 10))
