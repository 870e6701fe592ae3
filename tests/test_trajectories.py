"""The trajectory engine against independent computations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import depthkit as dk
from depthkit.engine.capture import Item, collect_residuals
from depthkit.lens.base import LogitLens, layer_plan
from depthkit.lens.trajectories import decode_residuals

PROMPTS = [
    "The cat sat on the mat",
    "Water boils at",
    "In 1905 Albert Einstein wrote four papers and the dog lay by the door",
    "A quick",
    "The capital of France is Paris. The",
]


def _final_norm(hf):
    """The HF model's own final norm module (unwrapped from the bridge if needed)."""
    for path in ("model.norm", "transformer.ln_f", "gpt_neox.final_layer_norm"):
        mod = hf
        try:
            for part in path.split("."):
                mod = getattr(mod, part)
        except AttributeError:
            continue
        return getattr(mod, "_original_component", mod)
    raise AssertionError("no final norm found")


def independent_logit_lens(model, ids: torch.Tensor) -> torch.Tensor:
    """Logit lens from Hugging Face hidden states with the norm written out by hand:
    [layer 0..L-1, seq, vocab]."""
    hf = model.original_model
    with torch.no_grad():
        hidden = hf(ids, output_hidden_states=True).hidden_states
    norm = _final_norm(hf)
    w_u = hf.get_output_embeddings().weight
    b_u = getattr(hf.get_output_embeddings(), "bias", None)
    family = hf.config.model_type
    out = []
    torch.set_grad_enabled(False)
    for h in hidden[: model.cfg.n_layers]:
        h = h[0].double()
        if family in ("gpt2", "gpt_neox"):
            mu = h.mean(-1, keepdim=True)
            var = ((h - mu) ** 2).mean(-1, keepdim=True)
            x = (h - mu) / torch.sqrt(var + norm.eps) * norm.weight.double() + norm.bias.double()
        else:
            eps = getattr(norm, "variance_epsilon", None) or norm.eps
            x = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + eps)
            scale = norm.weight.double()
            x = x * (1.0 + scale if family.startswith("gemma") else scale)
        z = x @ w_u.double().T
        if b_u is not None:
            z = z + b_u.double()
        out.append(z)
    torch.set_grad_enabled(True)
    return torch.stack(out)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "neox", "gemma3"])
def test_final_layer_lens_equals_model_logits(tiny_models, arch):
    model = tiny_models[arch]
    items = dk.make_items(model, PROMPTS, positions="all")
    resid = collect_residuals(model, items)
    lens = LogitLens(model)
    width = max(len(i.tokens) for i in items)
    for b, it in enumerate(items):
        ids = torch.tensor([it.tokens])
        with torch.no_grad():
            logits = model(ids)[0]
        start = sum(len(x.positions) for x in items[:b])
        mine = lens(resid[-1, start : start + len(it.positions)], None)
        assert (mine - logits).abs().max().item() <= 1e-4
    assert width > 3


@pytest.mark.parametrize("arch", ["llama", "gpt2", "neox", "gemma3"])
def test_logit_lens_matches_hand_computation_from_hf_hidden_states(tiny_models, arch):
    model = tiny_models[arch]
    text = PROMPTS[2]
    ids = torch.tensor([dk.encode(model, text)])
    expected = independent_logit_lens(model, ids)  # [L, seq, vocab]
    traj = dk.trajectories(model, [text], positions="all", top_k=3, progress=False)
    steps = traj.steps
    for layer in range(model.cfg.n_layers):
        z = expected[layer]
        p = torch.softmax(z, -1)
        got = steps[steps.layer == layer].sort_values("position")
        np.testing.assert_allclose(got.top1_prob.to_numpy(), p.max(-1).values.numpy(), atol=1e-5)
        np.testing.assert_array_equal(got.top1_id.to_numpy(), z.argmax(-1).numpy())
        ent = -(p * torch.log(p)).sum(-1).numpy()
        np.testing.assert_allclose(got.entropy.to_numpy(), ent, atol=1e-4)


def test_ranks_kl_and_targets_match_brute_force(tiny_llama):
    model = tiny_llama
    text, gold = PROMPTS[1], [17]
    traj = dk.trajectories(model, [text], targets={"gold": gold}, progress=False)
    ids = torch.tensor([dk.encode(model, text)])
    z_all = independent_logit_lens(model, ids)[:, -1]  # [L, vocab]
    with torch.no_grad():
        z_final = model(ids)[0, -1].double()
    z_all = torch.cat([z_all, z_final[None]])
    logp_final = torch.log_softmax(z_final, -1)
    final_top1 = int(z_final.argmax())
    for layer in range(model.cfg.n_layers + 1):
        z = z_all[layer]
        logq = torch.log_softmax(z, -1)
        kl = float((logp_final.exp() * (logp_final - logq)).sum())
        row = traj.steps[traj.steps.layer == layer].iloc[0]
        assert row.kl_to_final == pytest.approx(kl, abs=1e-4)
        for name, tid in (("final", final_top1), ("gold", gold[0])):
            t = traj.targets[(traj.targets.layer == layer) & (traj.targets.target == name)].iloc[0]
            assert t.token_id == tid
            # float32 engine vs float64 reference: allow logits within 1e-5 to order either way
            assert 1 + int((z > z[tid] + 1e-5).sum()) <= t["rank"] <= 1 + int((z > z[tid] - 1e-5).sum())
            assert t.prob == pytest.approx(float(logq[tid].exp()), abs=1e-6)
    last = traj.targets[(traj.targets.layer == model.cfg.n_layers) & (traj.targets.target == "final")].iloc[0]
    assert last["rank"] == 1
    assert traj.steps[traj.steps.layer == model.cfg.n_layers].kl_to_final.abs().max() < 1e-4


def _comparable(traj) -> pd.DataFrame:
    return traj.steps.drop(columns=["top1_token"])


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_batched_equals_one_by_one_and_padding_changes_nothing(tiny_models, arch):
    model = tiny_models[arch]
    batched = dk.trajectories(model, PROMPTS, positions="all", batch_size=len(PROMPTS), progress=False)
    single = [dk.trajectories(model, [p], positions="all", batch_size=1, progress=False) for p in PROMPTS]
    for i, one in enumerate(single):
        a = batched.steps[batched.steps.item == i].drop(columns=["item", "top1_token"]).reset_index(drop=True)
        b = one.steps.drop(columns=["item", "top1_token"]).reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b, atol=1e-4, check_exact=False)


def test_chunking_budget_does_not_change_results(tiny_llama):
    big = dk.trajectories(tiny_llama, PROMPTS, positions="all", budget_mb=512, progress=False)
    small = dk.trajectories(tiny_llama, PROMPTS, positions="all", budget_mb=0.01, progress=False)
    pd.testing.assert_frame_equal(_comparable(big), _comparable(small), atol=1e-5, check_exact=False)
    pd.testing.assert_frame_equal(big.targets, small.targets, atol=1e-5, check_exact=False)


def test_authors_convention_is_canonical_without_layer_zero_for_the_logit_lens(tiny_llama):
    can = dk.trajectories(tiny_llama, PROMPTS, progress=False)
    aut = dk.trajectories(tiny_llama, PROMPTS, convention="authors", progress=False)
    assert aut.layers == list(range(1, tiny_llama.cfg.n_layers + 1))
    assert can.layers == list(range(0, tiny_llama.cfg.n_layers + 1))
    a = _comparable(aut).reset_index(drop=True)
    c = _comparable(can)[can.steps.layer > 0].reset_index(drop=True)
    pd.testing.assert_frame_equal(a, c, atol=1e-6, check_exact=False)


def test_layer_plan_conventions():
    assert [(s.layer, s.translator) for s in layer_plan(3, "canonical")] == [(0, 0), (1, 1), (2, 2), (3, None)]
    # the paper's axis: row j is block j's output through translator j - 1; row L the model's output
    assert [(s.layer, s.translator) for s in layer_plan(3, "authors")] == [(1, 0), (2, 1), (3, None)]
    with pytest.raises(ValueError, match="canonical"):
        layer_plan(3, "paper")


def test_decode_uses_the_translator_the_plan_names(tiny_llama):
    """A lens whose translator k adds k to every coordinate reveals which one was used."""

    class Marking(LogitLens):
        name = "marking"

        def translate(self, h, translator):
            return h if translator is None else h + 10.0 * (translator + 1)

    lens = Marking(tiny_llama)
    items = dk.make_items(tiny_llama, PROMPTS[:2])
    resid = collect_residuals(tiny_llama, items)
    plan = layer_plan(tiny_llama.cfg.n_layers, "authors")
    dec = decode_residuals(lens, plan, resid, None, top_k=2)
    for row, step in enumerate(plan):
        expected = lens(resid[step.layer] , step.translator)
        got_top = expected.topk(2, -1).indices
        assert torch.equal(dec.top_ids[row], got_top)


def test_bad_inputs_are_refused_clearly(tiny_llama):
    with pytest.raises(ValueError, match="empty"):
        dk.trajectories(tiny_llama, [])
    with pytest.raises(ValueError, match="Empty prompt"):
        dk.trajectories(tiny_llama, ["fine", "   "])
    with pytest.raises(ValueError, match="top_k"):
        dk.trajectories(tiny_llama, ["fine"], top_k=0)
    with pytest.raises(ValueError, match="one per position"):
        Item([1, 2, 3], [2], {"gold": [1, 2]})


def test_over_long_prompt_is_refused_or_truncated_from_the_left(tiny_llama):
    n_ctx = dk.model_info(tiny_llama).n_ctx
    long = "the cat sat " * n_ctx
    with pytest.raises(dk.trajectories.__globals__["PromptTooLongError"], match="on_overflow='truncate'"):
        dk.trajectories(tiny_llama, [long])
    with pytest.warns(UserWarning, match="keeping its last"):
        traj = dk.trajectories(tiny_llama, [long], on_overflow="truncate", progress=False)
    assert traj.steps.position.max() == n_ctx - 1


@pytest.mark.integration
def test_smollm2_lens_and_model_agree(smollm2):
    text = "The capital of France is"
    ids = torch.tensor([dk.encode(smollm2, text)])
    traj = dk.trajectories(smollm2, [text], positions="all", progress=False)
    with torch.no_grad():
        logits = smollm2(ids)[0]
    items = dk.make_items(smollm2, [text], positions="all")
    resid = collect_residuals(smollm2, items)
    assert (LogitLens(smollm2)(resid[-1], None) - logits).abs().max().item() <= 1e-4
    expected = independent_logit_lens(smollm2, ids)
    for layer in (0, 1, 10, 20, 29):
        got = traj.steps[traj.steps.layer == layer].sort_values("position").top1_id.to_numpy()
        np.testing.assert_array_equal(got, expected[layer].argmax(-1).numpy())
    assert traj.top1_table().top1_token.iloc[-1] == " Paris"


@pytest.mark.parametrize("arch", ["llama", "gpt2", "neox", "gemma3"])
def test_readout_into_a_buffer_is_the_unembedding_modules_product(tiny_models, arch):
    """The engine writes logits into a reused buffer with the unembedding's own
    weight; that must be what the module itself returns."""
    model = tiny_models[arch]
    lens = LogitLens(model)
    assert lens._readout.W is not None and not lens._readout.own_copy  # the buffer path is the one under test
    h = torch.randn(3, 4, int(model.cfg.d_model)) * 5
    buf = torch.full((20 * int(model.cfg.d_vocab),), float("nan"))
    with torch.no_grad():
        into = lens.readout(h, out=buf)
        assert into.data_ptr() == buf.data_ptr()
        torch.testing.assert_close(into, lens.readout(h), rtol=1e-6, atol=1e-5)



def test_a_reused_workspace_leaves_earlier_results_alone(tiny_llama):
    """Decoding reuses one buffer across batches: results must not depend on what it
    held before, nor change when it is written again."""
    from depthkit.lens.trajectories import Workspace

    lens = LogitLens(tiny_llama)
    plan = layer_plan(tiny_llama.cfg.n_layers)
    first_resid = collect_residuals(tiny_llama, dk.make_items(tiny_llama, PROMPTS[:2]))
    second_resid = collect_residuals(tiny_llama, dk.make_items(tiny_llama, PROMPTS[2:4]))
    fresh = decode_residuals(lens, plan, first_resid, None, top_k=3)
    ws = Workspace()
    # stale contents, in a buffer as large as the decode needs (logits and scratch)
    ws.get(2 * len(plan) * first_resid.shape[1] * lens.d_vocab, first_resid.device).fill_(float("nan"))
    stale = ws.buf
    first = decode_residuals(lens, plan, first_resid, None, top_k=3, workspace=ws)
    decode_residuals(lens, plan, second_resid, None, top_k=3, workspace=ws)
    assert ws.buf is stale  # really reused, twice
    for name in ("top_ids", "top_probs", "target_logit", "target_prob", "target_rank", "entropy", "kl", "final_top1"):
        assert torch.equal(getattr(first, name), getattr(fresh, name)), name


def test_statistics_taken_in_cache_sized_blocks_equal_one_pass(tiny_llama, monkeypatch):
    """Top-k, ranks, entropy and KL come out the same whatever the block of rows
    their passes work on (one row, some rows, the whole chunk)."""
    from depthkit.lens import decode as lens_decode  # where decode_residuals reads the block size

    items = dk.make_items(tiny_llama, PROMPTS, positions="all")
    resid = collect_residuals(tiny_llama, items)
    plan = layer_plan(tiny_llama.cfg.n_layers)
    extra = torch.randint(0, int(tiny_llama.cfg.d_vocab), (resid.shape[1], 2))
    lens = LogitLens(tiny_llama)
    runs = []
    for rows in (1, 3, 10**6):
        monkeypatch.setattr(lens_decode, "STAT_BLOCK_BYTES", rows * lens.d_vocab * 4)
        runs.append(decode_residuals(lens, plan, resid, extra, top_k=4))
    for other in runs[1:]:
        for name in ("top_ids", "target_rank", "final_top1"):
            assert torch.equal(getattr(runs[0], name), getattr(other, name)), name
        for name in ("top_probs", "target_prob", "target_logit", "entropy", "kl"):
            torch.testing.assert_close(getattr(runs[0], name), getattr(other, name), rtol=1e-5, atol=1e-6)
