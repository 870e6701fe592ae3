"""Shared-prefix runs equal the uncached ones: residuals, lens logits and ranks, and
patched outputs, on a tiny model of every family and on the embedded model."""

from __future__ import annotations

import pytest
import torch
from conftest import hooked_patch

import depthkit as dk
from depthkit.engine.capture import Item, collect_residuals, patched_final_residuals, shared_prefix_groups
from depthkit.engine.prefix import common_prefix_length, encode_prefix

ARCHS = ("llama", "gpt2", "neox", "gemma3")


def _prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    # Two families sharing 40 and 24 leading tokens (longer than the tiny Gemma's
    # 32-token sliding window), and one prompt that shares nothing.
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randint(5, vocab, (40,), generator=g).tolist(), torch.randint(5, vocab, (24,), generator=g).tolist()
    tail = lambda n: torch.randint(5, vocab, (n,), generator=g).tolist()
    return [a + tail(7), a + tail(3), a + tail(12), b + tail(5), b + tail(9), tail(15)]


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[1, 2], [3]]) == 0
    assert common_prefix_length([[5, 6]]) == 2


def test_groups_cover_every_item_once_and_keep_read_positions():
    seqs = _prompts(1000)
    items = [Item(s, [len(s) - 1]) for s in seqs] + [Item(seqs[0], [3, len(seqs[0]) - 1])]
    groups = shared_prefix_groups(items, min_shared=16)
    assert sorted(i for g in groups for i in g.indices) == list(range(len(items)))
    by_len = sorted(len(g.prefix) for g in groups)
    assert by_len == [0, 24, 40]  # the loner and the item reading position 3 share no prefix
    for g in groups:
        for i, it in zip(g.indices, g.items):
            assert g.prefix + it.tokens == items[i].tokens
            assert [p + len(g.prefix) for p in it.positions] == items[i].positions


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_residuals_equal_the_full_run(tiny_models, arch):
    model = tiny_models[arch]
    seqs = _prompts(int(model.cfg.d_vocab))[:3]
    n = common_prefix_length(seqs)
    full = collect_residuals(model, [Item(s, list(range(n, len(s)))) for s in seqs])
    cached = collect_residuals(model, [Item(s[n:], list(range(len(s) - n))) for s in seqs], prefix=encode_prefix(model, seqs[0][:n]))
    assert (full - cached).abs().max().item() < 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_trajectories_with_and_without_shared_prefix(tiny_models, arch):
    model = tiny_models[arch]
    seqs = _prompts(int(model.cfg.d_vocab))
    items = [Item(s, [len(s) - 1], {"gold": [7]}) for s in seqs]
    a = dk.trajectories(model, items, share_prefix=False, progress=False)
    b = dk.trajectories(model, items, share_prefix=True, progress=False)
    assert (a.targets["logit"] - b.targets["logit"]).abs().max() < 1e-4
    assert (a.targets["rank"] == b.targets["rank"]).all()
    assert (a.steps["top1_id"] == b.steps["top1_id"]).all()


def _check_patched_against_uncached(model, seqs: list[list[int]], layer_list: list[int], batch_size: int, scale: float = 1.0,
                                    relative: bool = False) -> None:
    """Every (sequence, layer) patched by patched_final_residuals equals a plain
    hooked run of the whole sequence with the same vector written in: to 1e-4, or
    with ``relative`` to 1e-4 of the residual's largest entry (a real model's final
    residual has entries in the hundreds, where float32 keeps about 1e-5)."""
    d = int(model.cfg.d_model)
    g = torch.Generator().manual_seed(1)
    rows = [(t, layer) for t in range(len(seqs)) for layer in layer_list]
    vecs = scale * torch.randn(len(rows), d, generator=g)
    got = patched_final_residuals(model, [seqs[t] for t, _ in rows], [lay for _, lay in rows], vecs, batch_size=batch_size)
    for r, (t, layer) in enumerate(rows):
        want = hooked_patch(model, seqs[t], layer, vecs[r])
        tol = 1e-4 * (want.abs().max().item() if relative else 1.0)
        assert (got[r] - want).abs().max().item() < tol, (t, layer)


@pytest.mark.parametrize("arch", ARCHS)
def test_patched_runs_equal_an_uncached_hooked_run(tiny_models, arch):
    model = tiny_models[arch]
    _check_patched_against_uncached(model, _prompts(int(model.cfg.d_vocab))[:4], list(range(int(model.cfg.n_layers) + 1)), batch_size=3)


def test_embedded_model_patched_mcq_prompts_equal_uncached(smollm2):
    from depthkit.analyses import mcq

    # Two few-shot prompts sharing their demonstrations: the shared prefix, the
    # per-target context and the copies of the last token all take part.
    seqs = [dk.encode(smollm2, p) for p in mcq.build_prompts("sst2", 2, shots=2, seed=0)["prompt"]]
    L = int(smollm2.cfg.n_layers)
    _check_patched_against_uncached(smollm2, seqs, [0, 1, L // 2, L - 1, L], batch_size=4, scale=3.0, relative=True)


def test_embedded_model_mcq_prompts_cached_equal_uncached(smollm2):
    from depthkit.analyses import mcq

    prompts = mcq.build_prompts("sst2", 6, shots=2, seed=0)
    items = dk.make_items(smollm2, list(prompts["prompt"]))
    assert len(shared_prefix_groups(items)[0].prefix) >= 16  # the demonstrations are shared
    ids = [[int(i) for i in o] for o in mcq.add_option_ids(smollm2, prompts)["option_ids"]]
    targets = {"opt0": [o[0] for o in ids], "opt1": [o[1] for o in ids]}
    a = dk.trajectories(smollm2, list(prompts["prompt"]), targets=targets, share_prefix=False, progress=False)
    b = dk.trajectories(smollm2, list(prompts["prompt"]), targets=targets, share_prefix=True, progress=False)
    assert (a.targets["logit"] - b.targets["logit"]).abs().max() < 1e-4
    # Logits equal to 1e-4 can still swap two near-tied tokens deep in the vocabulary.
    diff = (a.targets["rank"] - b.targets["rank"]).abs()
    assert diff.max() <= 1 and (diff > 0).mean() <= 0.01
