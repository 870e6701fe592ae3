"""depthkit.engine.capture: padded batches, residual capture, block maps and patched runs
(tiny models of all four families)."""

from __future__ import annotations

import pytest
import torch
from conftest import hooked_patch

import depthkit as dk
from depthkit.engine.capture import (
    Item,
    batch_tensors,
    collect_residuals,
    length_batches,
    map_blocks,
    pack_rows,
    packed_attention_mask,
    packed_batches,
    patched_final_residuals,
    residual_rows,
)
from depthkit.engine.contexts import CACHE
from depthkit.engine.work import ForwardWork, depth_site
from depthkit.lens.base import LogitLens

ARCHS = ["llama", "gpt2", "neox", "gemma3"]
TEXTS = [
    "The capital of France is",
    "In 1905 Albert Einstein wrote four papers on physics that changed the field",
    "Water",
    "She poured the milk into the cup and then",
]


def _items(model) -> list[Item]:
    out = []
    for k, t in enumerate(TEXTS):
        ids = dk.encode(model, t)
        pos = [len(ids) - 1] if k % 2 == 0 else list(range(len(ids)))
        out.append(Item(ids, pos))
    return out


def test_length_batches_sort_by_length():
    seqs = [[1] * 5, [1] * 2, [1] * 9, [1] * 1, [1] * 4]
    assert length_batches(seqs, 2) == [[3, 1], [4, 0], [2]]
    items = [Item(s, [0]) for s in seqs]
    assert length_batches(items, 10) == [[3, 1, 4, 0, 2]]
    with pytest.raises(ValueError, match="batch_size"):
        length_batches(seqs, 0)


def test_batch_tensors_pad_on_the_right(tiny_llama):
    items = _items(tiny_llama)
    tokens, mask, bi, pi = batch_tensors(tiny_llama, items)
    assert tokens.shape == mask.shape == (len(items), max(len(it.tokens) for it in items))
    for b, it in enumerate(items):
        n = len(it.tokens)
        assert tokens[b, :n].tolist() == it.tokens and mask[b, :n].all() and not mask[b, n:].any()
    assert bi.tolist() == [b for b, it in enumerate(items) for _ in it.positions]
    assert pi.tolist() == [p for it in items for p in it.positions]


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_batch_equals_unpadded_runs(tiny_models, arch):
    model = tiny_models[arch]
    items = _items(model)
    batched = collect_residuals(model, items)
    alone = torch.cat([collect_residuals(model, [it]) for it in items], 1)
    assert batched.shape == (model.cfg.n_layers + 1, sum(len(it.positions) for it in items), model.cfg.d_model)
    torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-4)
    # The final residual read out is the model's own logits, unpadded.
    last = collect_residuals(model, [items[0]], [model.cfg.n_layers])[0]
    with torch.no_grad():
        logits = model(torch.tensor([items[0].tokens]))[0, -1]
    assert (LogitLens(model).readout(last)[0] - logits).abs().max().item() <= 1e-4


def test_pack_rows_first_fit_longest_first():
    lengths = [5, 9, 3, 4, 2, 7]
    rows = pack_rows(lengths, 10)
    assert rows == [[1], [5, 2], [0, 3], [4]]  # 9 | 7+3 | 5+4 | 2: no row has room for the 2 left
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= 10 for r in rows)
    with pytest.raises(ValueError, match="does not fit"):
        pack_rows([11], 10)
    items = [Item([1] * n, [0]) for n in (5, 2, 9, 1)]
    assert packed_batches(items, 3) == [[3, 1, 0], [2]]


def test_packed_mask_sees_own_segment_causally():
    segment = torch.tensor([[0, 0, 0, 1, 1, 9]])  # two items, then a pad (its own segment)
    position = torch.tensor([[0, 1, 2, 0, 1, 0]])
    m = packed_attention_mask(segment, position)[0, 0].int().tolist()
    assert m == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    w = packed_attention_mask(segment, position, window=2)[0, 0].int().tolist()
    assert w[2] == [0, 1, 1, 0, 0, 0]  # a window of 2 drops the key two positions back


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_rows_equal_unpadded_runs(tiny_models, arch):
    """Items laid end to end in shared rows give each item's own residuals: every
    position, prompts of mixed lengths, some longer than the tiny Gemma 3's
    sliding window (32) in rows wider than it."""
    model = tiny_models[arch]
    g = torch.Generator().manual_seed(1)
    items = []
    for n in (3, 40, 7, 12, 1, 55, 20, 9, 33):
        ids = torch.randint(5, int(model.cfg.d_vocab), (n,), generator=g).tolist()
        items.append(Item(ids, sorted({0, n // 2, n - 1})))
    packed = collect_residuals(model, items, pack=True)
    alone = torch.cat([collect_residuals(model, [it]) for it in items], 1)
    # Relative to the largest residual entry: summation order varies run to run with
    # the rows' shapes, and deep residuals of random weights grow large.
    torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-4 * max(1.0, alone.abs().max().item()))
    with pytest.raises(ValueError, match="prefix"):
        collect_residuals(model, items, pack=True, prefix=object())


@pytest.mark.parametrize("arch", ARCHS)
def test_residual_rows_and_map_blocks_agree_with_collect(tiny_models, arch):
    model = tiny_models[arch]
    items = _items(model)
    L = model.cfg.n_layers
    full = collect_residuals(model, items)
    rows = residual_rows(model, items, [0, L], batch_size=3)
    torch.testing.assert_close(rows, full[[0, L]], rtol=1e-4, atol=1e-4)
    # Items sharing leading tokens run them once; rows still come item by item.
    shared = [Item(items[0].tokens + it.tokens, [len(items[0].tokens) + p for p in it.positions]) for it in items]
    alone = residual_rows(model, shared, [1, L], batch_size=2)
    torch.testing.assert_close(residual_rows(model, shared, [1, L], batch_size=2, share_prefix=True), alone, rtol=1e-4, atol=1e-4)
    if arch == "neox":
        return  # parallel attention and MLP: no residual between them (no hook_resid_mid)
    blocks = map_blocks(model, items, lambda b, pre, mid, post: (pre, mid, post))
    assert len(blocks) == L
    for b, (pre, mid, post) in enumerate(blocks):
        torch.testing.assert_close(pre, full[b], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(post, full[b + 1], rtol=1e-5, atol=1e-5)
        assert mid.shape == pre.shape


def test_skip_block_removes_exactly_that_update(tiny_llama):
    items = _items(tiny_llama)
    base = collect_residuals(tiny_llama, items)
    skipped = collect_residuals(tiny_llama, items, skip_block=1)
    torch.testing.assert_close(skipped[:2], base[:2])  # before the skipped block: unchanged
    torch.testing.assert_close(skipped[2], base[1])  # its output is its input
    assert (skipped[-1] - base[-1]).abs().max() > 1e-3  # later blocks see the change


@pytest.mark.parametrize("arch", ARCHS)
def test_a_pass_ends_at_its_last_site(tiny_models, arch):
    """A pass runs no block after its last read, nor the final norm and unembedding
    (the model's own logits are never read), with the same residuals; a pass that
    keeps its cache runs every block. The model is whole again afterwards."""
    model = tiny_models[arch]
    bridge, items, L = model.backend.bridge, _items(model), model.cfg.n_layers
    ran: list[str] = []
    handles = [bridge.unembed.register_forward_pre_hook(lambda *a: ran.append("unembed"))]
    handles += [blk.register_forward_pre_hook(lambda *a, b=b: ran.append(f"block {b}")) for b, blk in enumerate(bridge.blocks)]
    try:
        full = collect_residuals(model, items)
        assert ran == [f"block {b}" for b in range(L)]  # every block, no unembedding
        ran.clear()
        early = collect_residuals(model, items, [0, 1])
        assert ran == ["block 0", "block 1"]  # block 1's input is the last site
        torch.testing.assert_close(early, full[[0, 1]])
        ran.clear()
        work = ForwardWork(keep_cache=True).read("h", depth_site(1, L), torch.tensor([0]), torch.tensor([0]))
        got = model.backend.execute(torch.tensor([items[0].tokens]), torch.ones(1, len(items[0].tokens), dtype=torch.long), work)
        assert ran == [f"block {b}" for b in range(L)] + ["unembed"] and len(got[CACHE].layers) == L
    finally:
        for h in handles:
            h.remove()
    ids = torch.tensor([items[0].tokens])
    logits = bridge(ids)
    assert logits.shape == (1, len(items[0].tokens), model.cfg.d_vocab)
    assert not any(hp.fwd_hooks for hp in bridge.hook_dict.values())  # the stopped passes left no hook behind


@pytest.mark.parametrize("arch", ARCHS)
def test_patched_run_equals_manual_computation(tiny_models, arch):
    """Writing h_ℓ of a source into a target at ℓ: at ℓ = L the output is the vector
    itself; writing the target's own h_ℓ changes nothing; any row equals the same
    row run alone (batches mix layers and lengths)."""
    model = tiny_models[arch]
    L = model.cfg.n_layers
    targets = [dk.encode(model, t) for t in TEXTS]
    own = collect_residuals(model, [Item(t, [len(t) - 1]) for t in targets])  # [depth, target, d]
    vec = torch.randn(len(targets), model.cfg.d_model) * own[L].norm(dim=-1, keepdim=True) / model.cfg.d_model**0.5
    at_l = patched_final_residuals(model, targets, [L] * len(targets), vec)
    torch.testing.assert_close(at_l, vec.float())
    layers = [l % (L + 1) for l in range(len(targets))]
    same = patched_final_residuals(model, targets, layers, own[layers, range(len(targets))], batch_size=3)
    torch.testing.assert_close(same, own[L], rtol=1e-4, atol=1e-4)
    mixed = patched_final_residuals(model, targets, layers, vec, batch_size=4)
    for r in range(len(targets)):
        alone = patched_final_residuals(model, [targets[r]], [layers[r]], vec[r : r + 1])
        torch.testing.assert_close(mixed[r : r + 1], alone, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="outside 0"):
        patched_final_residuals(model, targets[:1], [L + 1], vec[:1])


def test_patched_run_matches_a_hand_written_hook(tiny_llama):
    """The same patch written by hand with TransformerLens' own hook API."""
    model = tiny_llama
    ids = dk.encode(model, TEXTS[1])
    v = torch.randn(model.cfg.d_model)
    layer = 2
    got = patched_final_residuals(model, [ids], [layer], v[None])[0]
    torch.testing.assert_close(got, hooked_patch(model, ids, layer, v), rtol=1e-5, atol=1e-5)
