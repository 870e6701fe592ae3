"""Residual statistics and transition estimates against known answers and an
independent computation from Hugging Face hidden states."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from depthkit.analyses.residual import passage_items, skip_block_effects, split_estimator, update_stats
from depthkit.lens.base import LogitLens
from depthkit.stats import curve_estimate as bootstrap_layer
from depthkit.stats import knee, settling_layer, two_segment_fit

TEXTS = [
    "The cat sat on the mat, and the dog lay by the door.",
    "In 1905 Albert Einstein wrote four papers. Water boils at 100 degrees.",
    "A quick brown fox jumps over the lazy dog; she said that it was good.",
]


def hinge(x, k, a=1.0, b=0.5, c=-2.0):
    return a + b * x + c * np.maximum(x - k, 0)


@pytest.mark.parametrize("k", [5, 12, 20])
def test_hinge_fit_finds_known_break(k):
    x = np.arange(31)
    fit = two_segment_fit(x, hinge(x, k))
    assert fit.split == k
    assert fit.sse == pytest.approx(0.0, abs=1e-18)
    assert fit.slope_left == pytest.approx(0.5)
    assert fit.slope_right == pytest.approx(-1.5)


def test_hinge_fit_with_noise_and_broken_fit_with_jump():
    rng = np.random.default_rng(1)
    x = np.arange(31)
    assert two_segment_fit(x, hinge(x, 12) + rng.normal(0, 0.05, 31)).split == 12
    y = np.where(x < 7, 0.1 * x, 5.0 + 0.1 * x)  # a jump, slopes equal
    fit = two_segment_fit(x, y, kind="broken")
    assert fit.split == 7 and fit.sse == pytest.approx(0.0, abs=1e-18)


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError, match="equal length"):
        two_segment_fit([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="kind"):
        two_segment_fit(np.arange(10), np.arange(10), kind="cubic")
    with pytest.raises(ValueError, match="at least"):
        two_segment_fit([0, 1], [0, 1])


def test_knee_of_flat_then_falling_curve():
    x = np.arange(21)
    y = np.where(x <= 14, 10.0, 10.0 - 1.5 * (x - 14))
    assert knee(x, y) == 14
    y2 = np.where(x <= 4, 10.0 - 2.0 * x, 2.0 - 0.01 * (x - 4))  # falls fast, then flat
    assert knee(x, y2) == 4


def test_settling_layer():
    x = np.arange(8)
    y = np.array([0.9, 0.2, 0.5, 0.32, 0.28, 0.4, 0.31, 0.30])
    assert settling_layer(x, y, tol=0.05) == 6  # 0.4 at layer 5 is the last one off by more than 0.05
    assert settling_layer(x, y, tol=0.15) == 3  # 0.5 at layer 2 is the last one off by more than 0.15
    assert settling_layer(x, np.full(8, 0.3)) == 0


def test_bootstrap_interval_covers_break_and_collapses_without_noise():
    x = np.arange(25)
    rng = np.random.default_rng(0)
    rows = [
        {"item": i, "layer": int(l), "v": float(hinge(l, 15) + rng.normal(0, 0.3))} for i in range(20) for l in x
    ]
    est = bootstrap_layer(pd.DataFrame(rows), "v", split_estimator(), n_boot=100, seed=0)
    assert est.lo <= 15 <= est.hi and est.estimate == pytest.approx(15, abs=1)
    same = pd.DataFrame([{"item": i, "layer": int(l), "v": float(hinge(l, 9))} for i in range(5) for l in x])
    est = bootstrap_layer(same, "v", split_estimator(), n_boot=20, min_n=1)
    assert (est.estimate, est.lo, est.hi) == (9, 9, 9)


def test_passage_items(tiny_llama):
    items = passage_items(tiny_llama, TEXTS, max_tokens=12, min_tokens=4)
    assert len(items) == 3
    for it in items:
        assert len(it.tokens) <= 12 and it.positions[0] == 1 and it.positions[-1] == len(it.tokens) - 2
        assert it.targets["next"] == [it.tokens[p + 1] for p in it.positions]
    with pytest.raises(ValueError, match="shorter than min_tokens"):
        passage_items(tiny_llama, ["Hi"], min_tokens=16)


def _independent_llama_stats(model, ids: list[int], positions: list[int]) -> dict[str, np.ndarray]:
    """Update sizes from HF hidden states, with the attention output taken from the
    HF attention modules themselves: [block, position]."""
    hf = model.original_model
    attn_out: dict[int, torch.Tensor] = {}
    handles = [
        layer.self_attn.register_forward_hook(lambda mod, args, out, i=i: attn_out.__setitem__(i, out[0].detach()))
        for i, layer in enumerate(hf.model.layers)
    ]
    try:
        with torch.no_grad():
            hs = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
    finally:
        for h in handles:
            h.remove()
    n = len(hf.model.layers)
    attn_rel, block_rel, infl = [], [], []
    for b in range(n - 1):  # HF's last hidden state is after the final norm
        h, h2, a = hs[b][0, positions].double(), hs[b + 1][0, positions].double(), attn_out[b][0, positions].double()
        attn_rel.append((a.norm(dim=-1) / h.norm(dim=-1)).numpy())
        block_rel.append(((h2 - h).norm(dim=-1) / h.norm(dim=-1)).numpy())
        infl.append((1 - torch.nn.functional.cosine_similarity(h, h2, dim=-1)).numpy())
    return {"attn_rel": np.array(attn_rel), "block_rel": np.array(block_rel), "block_influence": np.array(infl)}


def test_update_norms_match_hf_hidden_states(tiny_llama):
    items = passage_items(tiny_llama, TEXTS, max_tokens=20, min_tokens=4)
    stats = update_stats(tiny_llama, items, batch_size=2, progress=False)
    n_blocks = tiny_llama.cfg.n_layers
    assert len(stats) == len(items) * n_blocks
    for i, it in enumerate(items):
        ref = _independent_llama_stats(tiny_llama, it.tokens, it.positions)
        got = stats[stats["item"] == i].set_index("block")
        for key, arr in ref.items():
            np.testing.assert_allclose(got[key].to_numpy()[: n_blocks - 1], arr.mean(1), rtol=1e-4, atol=1e-6)
    parts = stats[["attn_rel", "mlp_rel", "block_rel", "block_influence"]].to_numpy()
    assert np.isfinite(parts).all() and (parts > 0).all()


def test_skipping_last_block_gives_logit_lens_of_previous_layer(tiny_llama):
    from depthkit.engine.capture import collect_residuals

    items = passage_items(tiny_llama, TEXTS, max_tokens=20, min_tokens=4)
    n = tiny_llama.cfg.n_layers
    later, out = skip_block_effects(tiny_llama, items, batch_size=2, progress=False)
    assert sorted(out["skipped"]) == list(range(n))
    assert len(later) == sum(n - b for b in range(n))
    lens = LogitLens(tiny_llama)
    kls, agree, rel_first = [], [], []
    for it in items:
        r = collect_residuals(tiny_llama, [it])  # [depth, pos, d]
        with torch.no_grad():
            lp_full = torch.log_softmax(lens.readout(r[n]).double(), -1)
            lp_skip = torch.log_softmax(lens.readout(r[n - 1]).double(), -1)
        kls.append((lp_full.exp() * (lp_full - lp_skip)).sum(-1))
        agree.append(lp_full.argmax(-1) == lp_skip.argmax(-1))
        # skipping block 0 leaves h_1 = h_0
        rel_first.append((r[1] - r[0]).double().norm(dim=-1) / r[1].double().norm(dim=-1))
    last = out.set_index("skipped").loc[n - 1]
    assert last["kl"] == pytest.approx(torch.cat(kls).mean().item(), rel=1e-4)
    assert last["top1_agreement"] == pytest.approx(torch.cat(agree).double().mean().item())
    first = later[(later["skipped"] == 0) & (later["layer"] == 1)]["rel_change"].item()
    assert first == pytest.approx(torch.cat(rel_first).mean().item(), rel=1e-4)
    # a skipped block's effect can only show at later layers
    assert later.groupby("skipped")["layer"].min().tolist() == [b + 1 for b in range(n)]


def test_phase_change_ignores_edge_blocks_and_fits_log_rate():
    from depthkit.analyses.residual import phase_change

    blocks = np.arange(20)
    rows = []
    for i in range(6):
        curve = np.exp(hinge(blocks, 11, a=-1.0, b=-0.02, c=0.2))
        curve[0], curve[-1] = 50.0, 40.0  # embedding block and last block: outliers the fit must not see
        rows += [{"item": i, "block": int(b), "block_rel": float(v)} for b, v in zip(blocks, curve)]
    est = phase_change(pd.DataFrame(rows), "block_rel", n_boot=10, min_n=1)
    assert (est.estimate, est.lo, est.hi) == (11, 11, 11)


def test_sample_passages():
    from depthkit.analyses.residual import sample_passages

    texts = ["x" * 500 + str(i) for i in range(10)] + ["short"] + ["x" * 500 + "0"]
    got = sample_passages(texts, 5, seed=1)
    assert len(set(got)) == 5 and "short" not in got
    assert got == sample_passages(texts, 5, seed=1)
    with pytest.raises(ValueError, match="distinct passages"):
        sample_passages(texts, 11)
