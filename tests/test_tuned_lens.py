"""Tuned lens: training, identity start, saved files and their refusals (tiny models)."""

from __future__ import annotations

import json
import pickle
import warnings

import pandas as pd
import pytest
import torch

import depthkit as dk
from depthkit.lens import (
    LensFileError,
    ResidualCache,
    TunedLens,
    get_tuned_lens,
    heldout_metrics,
    lens_for,
    lens_path,
    load_lens,
    resolve_config,
    resolve_lens,
    save_lens,
    train_tuned_lens,
)
from depthkit.lens.base import LogitLens, Readout
from depthkit.lens.trajectories import trajectories

TEXT = [
    "The river flows through the old town and past the church, where the market is held on Sundays. "
    "In the summer the streets fill with visitors who come to see the bridge and the castle above it.",
    "A library is a collection of books and other materials kept for reading and study. Many cities "
    "have a public library, and most universities keep one for their students and staff.",
    "The cat sat on the mat, and the dog lay by the door. She said that it was good, and he agreed "
    "that the day had been long. Water boils at one hundred degrees at sea level.",
    "In 1905 Albert Einstein wrote four papers on the photoelectric effect, on Brownian motion, on "
    "special relativity and on the equivalence of mass and energy, which changed physics.",
] * 6
CFG = {"train_tokens": 768, "heldout_tokens": 256, "seq_len": 64, "steps": 30, "batch_positions": 64, "lr": 3e-3}


@pytest.fixture(scope="module")
def model():
    return dk.load_model("tiny-llama", seed=0, n_layers=4)


@pytest.fixture(scope="module")
def other_model():
    return dk.load_model("tiny-llama", seed=1, n_layers=4)


@pytest.fixture(scope="module")
def trained(model):
    return train_tuned_lens(model, TEXT, CFG, seed=0, progress=False)


def _kl(lens):
    return lens.heldout().pivot(index="layer", columns="lens", values="kl")


def test_lens_does_not_own_the_model(model):
    lens = TunedLens(model)
    assert set(lens.state_dict()) == {"A", "b"}
    assert all(p is lens.A or p is lens.b for p in lens.parameters())
    assert lens.A.shape == (model.cfg.n_layers, model.cfg.d_model, model.cfg.d_model)


def test_untrained_lens_is_the_logit_lens(model):
    lens, logit = TunedLens(model), LogitLens(model)
    h = torch.randn(3, 7, model.cfg.d_model)
    for t in range(model.cfg.n_layers):
        assert torch.equal(lens(h, t), logit(h, t))
    assert torch.equal(lens(h, None), logit(h, None))
    with pytest.raises(ValueError, match="translators 0..3"):
        lens.translate(h, model.cfg.n_layers)


def test_fast_readout_matches_lens_readout(model):
    lens = TunedLens(model)
    h = torch.randn(5, model.cfg.d_model) * 3
    torch.testing.assert_close(Readout(model, torch.float32)(h), lens.readout(h), rtol=1e-5, atol=1e-5)


def test_low_precision_readout_reuses_its_scratch_and_gives_the_plain_products(model):
    readout = Readout(model, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, model.cfg.d_model, generator=g)
    buf = torch.empty(6 * model.cfg.d_vocab)
    z = readout.project(x, out=buf)
    want = (x.to(torch.bfloat16) @ readout.W).float()
    if readout.b is not None:
        want += readout.b
    assert torch.equal(z, want)
    spare = readout.scratch.buf.data_ptr()
    grad = torch.randn(6, model.cfg.d_vocab, generator=g)
    assert torch.equal(readout.project_back(grad), (grad.to(torch.bfloat16) @ readout.W.T).float())
    readout.project(x[:3], out=buf)
    assert readout.scratch.buf.data_ptr() == spare  # no fresh vocabulary-sized allocation


def test_heldout_kl_matches_direct_computation(model):
    lens = TunedLens(model)
    with torch.no_grad():
        lens.A.normal_(0, 0.05)
        lens.b.normal_(0, 0.05)
    resid = torch.randn(model.cfg.n_layers + 1, 9, model.cfg.d_model)
    got = heldout_metrics(lens, resid, chunk=4).set_index(["lens", "layer"])
    with torch.no_grad():
        p = torch.softmax(lens.readout(resid[-1]), -1).double()
        for l in range(model.cfg.n_layers):
            for name, h in (("logit", resid[l]), ("tuned", lens.translate(resid[l], l))):
                q = torch.softmax(lens.readout(h), -1).double()
                want = (p * (p.log() - q.log())).sum(-1).mean()
                assert got.loc[(name, l), "kl"] == pytest.approx(float(want), rel=1e-4, abs=1e-6)
                agree = (q.argmax(-1) == p.argmax(-1)).double().mean()
                assert got.loc[(name, l), "top1_agreement"] == pytest.approx(float(agree))


def test_training_beats_the_logit_lens_on_heldout_text(trained):
    kl = _kl(trained)
    assert (kl["tuned"] < kl["logit"]).all(), kl
    assert (kl["tuned"].mean() < 0.8 * kl["logit"].mean()), kl
    loss = trained.meta["train_loss"]
    assert len(loss) == CFG["steps"] and all(map(torch.isfinite, torch.tensor(loss)))
    assert trained.meta["n_train_positions"] == CFG["train_tokens"]
    assert trained.meta["n_heldout_positions"] == CFG["heldout_tokens"]


def test_adam_improves_on_the_zero_start(model):
    base = dict(CFG, init="zero")
    untrained = train_tuned_lens(model, TEXT, dict(base, steps=0), progress=False)
    kl0 = _kl(untrained)
    assert torch.allclose(torch.tensor(kl0["tuned"].values), torch.tensor(kl0["logit"].values))
    adam = _kl(train_tuned_lens(model, TEXT, base, progress=False))
    assert (adam["tuned"] < adam["logit"]).all(), adam


def test_training_is_deterministic_under_a_seed(model, trained):
    again = train_tuned_lens(model, TEXT, CFG, seed=0, progress=False)
    assert torch.equal(again.A, trained.A) and torch.equal(again.b, trained.b)
    other = train_tuned_lens(model, TEXT, CFG, seed=1, progress=False)
    assert not torch.equal(other.A, trained.A)


def test_save_load_round_trip_is_exact(model, trained, tmp_path):
    path = save_lens(trained, tmp_path / "lens.safetensors")
    loaded = load_lens(model, path)
    assert torch.equal(loaded.A, trained.A) and torch.equal(loaded.b, trained.b)
    h = torch.randn(4, model.cfg.d_model)
    assert torch.equal(loaded(h, 2), trained(h, 2))
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["model"]["fingerprint"] == dk.model_info(model).fingerprint
    assert meta["shapes"] == {"A": list(trained.A.shape), "b": list(trained.b.shape)}
    assert {"kl", "top1_agreement", "lens", "layer"} <= set(meta["heldout"][0])
    # the held-out table reads back as it was written, columns in their order too
    pd.testing.assert_frame_equal(loaded.heldout(), trained.heldout())
    assert list(loaded.heldout().columns) == ["layer", "lens", "kl", "top1_agreement"]
    assert meta["timing"]["total_s"] > 0
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave nothing behind


def test_tampered_file_is_refused(model, trained, tmp_path):
    path = save_lens(trained, tmp_path / "lens.safetensors")
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(LensFileError, match="does not match its sidecar.*Delete"):
        load_lens(model, path)


def test_truncated_file_is_refused(model, trained, tmp_path):
    path = save_lens(trained, tmp_path / "lens.safetensors")
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(LensFileError, match="cut short"):
        load_lens(model, path)


def test_sidecar_that_does_not_match_is_refused(model, trained, tmp_path):
    path = save_lens(trained, tmp_path / "lens.safetensors")
    meta = json.loads(path.with_suffix(".json").read_text())
    meta["shapes"]["A"] = [1, 2, 3]
    path.with_suffix(".json").write_text(json.dumps(meta))
    with pytest.raises(LensFileError, match="this model needs"):
        load_lens(model, path)
    path.with_suffix(".json").write_text("{not json")
    with pytest.raises(LensFileError, match="not valid JSON"):
        load_lens(model, path)
    path.with_suffix(".json").unlink()
    with pytest.raises(LensFileError, match="sidecar .* is missing"):
        load_lens(model, path)


def test_pickle_renamed_safetensors_is_refused(model, tmp_path):
    path = tmp_path / "evil.safetensors"
    path.write_bytes(pickle.dumps({"A": [1.0]}))
    with pytest.raises(LensFileError, match="pickle"):
        load_lens(model, path)
    # torch.save's zip container, too (written by hand: no torch.save in this project).
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    with pytest.raises(LensFileError, match="pickle"):
        load_lens(model, path)


def test_lens_for_another_model_is_refused(other_model, trained, tmp_path):
    path = save_lens(trained, tmp_path / "lens.safetensors")
    with pytest.raises(LensFileError, match="for model 'tiny-llama'.*fingerprint"):
        load_lens(other_model, path)
    gpt2 = dk.load_model("tiny-gpt2", seed=0, n_layers=2)
    with pytest.raises(LensFileError, match="not for 'tiny-gpt2'"):
        load_lens(gpt2, path)


def test_missing_file_says_how_to_train(model, tmp_path):
    with pytest.raises(LensFileError, match="get_tuned_lens"):
        load_lens(model, tmp_path / "nothing.safetensors")


def test_get_tuned_lens_trains_once_then_reuses(model, tmp_path):
    lens = get_tuned_lens(model, budget="smoke", text=TEXT, cache_dir=tmp_path, progress=False)
    path = lens_path(model, resolve_config("smoke"), TEXT, tmp_path)
    assert lens.path == path and path.is_file() and path.with_suffix(".json").is_file()
    assert path.parent.name == "tiny-llama"
    mtime = path.stat().st_mtime_ns
    again = get_tuned_lens(model, budget="smoke", text=TEXT, cache_dir=tmp_path, progress=False)
    assert path.stat().st_mtime_ns == mtime
    assert torch.equal(again.A, lens.A)
    other = get_tuned_lens(model, budget="smoke", text=TEXT, cache_dir=tmp_path, progress=False, seed=1)
    assert other.path != path
    # A seed written in the budget (the form `-p lens_budget=...` takes) is that lens,
    # not overwritten by the keyword's default.
    budget = "train_tokens=384,heldout_tokens=64,seq_len=64,steps=3,batch_positions=16,seed=1"
    assert get_tuned_lens(model, budget=budget, text=TEXT, cache_dir=tmp_path, progress=False).path == other.path
    assert resolve_config("seed=2,downweight=the").seed == 2 and resolve_config("downweight=the").downweight == "the"


def test_downweighting_the(model, tmp_path):
    lens = get_tuned_lens(model, budget="smoke", text=TEXT, cache_dir=tmp_path, progress=False, downweight="the")
    assert lens.meta["config"]["downweight"] == "the"
    the = model.tokenizer(" the", add_special_tokens=False)["input_ids"]
    assert lens.meta["downweighted_token_ids"] == the
    plain = get_tuned_lens(model, budget="smoke", text=TEXT, cache_dir=tmp_path, progress=False)
    assert plain.path != lens.path


def test_downweighted_lenses_on_shared_positions_read_the_same_top1(model):
    # The second lens reuses the first one's top-1 of the training positions; its
    # weights must be what a lens with its own residual cache computes.
    cache = ResidualCache(model)
    train_tuned_lens(model, TEXT, "smoke", progress=False, downweight="the", cache=cache)
    shared = train_tuned_lens(model, TEXT, "smoke", progress=False, downweight="top10", cache=cache)
    alone = train_tuned_lens(model, TEXT, "smoke", progress=False, downweight="top10", cache=ResidualCache(model))
    assert shared.meta["downweighted_share"] == alone.meta["downweighted_share"] > 0
    assert torch.equal(shared.A, alone.A)
    data = cache.get(model, TEXT, resolve_config("smoke", downweight="top10"), False)
    own = LogitLens(model).readout(data.resid[-1]).argmax(-1)  # the model's output row, read directly
    assert torch.equal(data.final_top1, own)


def test_finetune_continues_from_the_start_lens(model, tmp_path):
    start = get_tuned_lens(model, budget=CFG, text=TEXT, cache_dir=tmp_path, progress=False)
    # No Adam step: the continued lens is its start, weight for weight.
    same = get_tuned_lens(model, budget={**CFG, "init": "lens", "steps": 0}, text=TEXT, cache_dir=tmp_path,
                          progress=False, downweight="the", start=start)
    assert torch.equal(same.A, start.A) and torch.equal(same.b, start.b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same positions as its start: nothing to warn about
        tuned = get_tuned_lens(model, budget={**CFG, "init": "lens", "steps": 5}, text=TEXT, cache_dir=tmp_path,
                               progress=False, downweight="the", start=start)
    assert not torch.equal(tuned.A, start.A)
    assert tuned.meta["config"]["start"] == start.meta["config_hash"] and tuned.meta["heldout_after_init"] is None
    # The front door finds the saved lens again from the same budget and start, without training.
    again = dk.get_lens(model, "tuned", budget={**CFG, "init": "lens", "steps": 5}, text=TEXT, cache_dir=tmp_path,
                        downweight="the", start=start)
    assert again.path == tuned.path and torch.equal(again.A, tuned.A)
    # The start is part of the lens's identity: another start, another file.
    other_start = get_tuned_lens(model, budget={**CFG, "seed": 1}, text=TEXT, cache_dir=tmp_path, progress=False)
    with pytest.warns(UserWarning, match="seed 1 there, 0 here"):
        other = get_tuned_lens(model, budget={**CFG, "init": "lens", "steps": 5}, text=TEXT, cache_dir=tmp_path,
                               progress=False, downweight="the", start=other_start)
    assert other.path != tuned.path and not torch.equal(other.A, tuned.A)
    with pytest.raises(ValueError, match="pass that lens as start="):
        get_tuned_lens(model, budget="finetune", text=TEXT, cache_dir=tmp_path, progress=False, downweight="the")
    # Budgets that start from their own ridge fit ignore a start lens.
    assert get_tuned_lens(model, budget=CFG, text=TEXT, cache_dir=tmp_path, progress=False, start=other_start).path == start.path


def test_lenses_without_a_start_keep_their_file_names():
    import dataclasses
    import hashlib

    from depthkit.lens.training_data import FORMAT_VERSION, config_hash

    info = dk.load_model("tiny-llama").info
    cfg = resolve_config("default")
    # The fields added since default to values left out of the hash.
    old = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("start", "backward_samples")}
    key = {"format": FORMAT_VERSION, "config": old, "fingerprint": info.fingerprint, "texts": "wikipedia_passages:lens"}
    assert config_hash(cfg, info, None) == hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    with pytest.raises(ValueError, match="only read with init='lens'"):
        resolve_config({"start": "abc"})


def test_bad_budgets_are_refused():
    with pytest.raises(ValueError, match="Unknown tuned-lens budget 'huge'"):
        resolve_config("huge")
    with pytest.raises(ValueError, match="Unknown tuned-lens config keys \\['stepz'\\]"):
        resolve_config({"stepz": 3})
    with pytest.raises(ValueError, match="steps=-1"):
        resolve_config({"steps": -1})
    with pytest.raises(ValueError, match="backward_samples=-2"):
        resolve_config({"backward_samples": -2})
    with pytest.raises(ValueError, match="downweight='a'"):
        resolve_config("default", downweight="a")


def test_trajectory_engine_accepts_the_lens(model, trained, tmp_path, monkeypatch):
    prompts = ["The cat sat on the", "In 1905 Albert Einstein"]
    tr = trajectories(model, prompts, lens=trained, progress=False)
    assert tr.lens == "tuned"
    lo = trajectories(model, prompts, lens="logit", progress=False)
    last = model.cfg.n_layers
    a = tr.steps[tr.steps.layer == last].kl_to_final.to_numpy()
    assert (abs(a) < 1e-5).all()
    # The translators change the early layers' readings.
    assert not (tr.steps[tr.steps.layer == 0].kl_to_final.values == lo.steps[lo.steps.layer == 0].kl_to_final.values).all()
    monkeypatch.setenv("DEPTHKIT_CACHE", str(tmp_path))
    by_name = lens_for(model, "tuned", budget="smoke", text=TEXT, progress=False)
    assert isinstance(by_name, TunedLens)
    assert by_name.path.is_relative_to(tmp_path)
    auth = trajectories(model, prompts, lens=by_name, convention="authors", progress=False)
    assert sorted(auth.steps.layer.unique()) == list(range(1, last + 1))
    # row L is the model's own output in both conventions; below it, authors row j reads
    # canonical layer j's residual through translator j - 1
    assert (auth.steps[auth.steps.layer == last].kl_to_final.abs() < 1e-5).all()
    can = trajectories(model, prompts, lens=by_name, progress=False)
    assert (auth.steps[auth.steps.layer == last].top1_id.to_numpy() == can.steps[can.steps.layer == last].top1_id.to_numpy()).all()


def test_bfloat16_metrics_stay_close_to_float32(model, trained):
    from depthkit.engine.precision import bf16_verdict

    # bfloat16 products only after the probe has seen them run on this CPU: a bad
    # kernel would kill the test process, not fail the test.
    verdict = bf16_verdict(model.cfg.d_model, model.cfg.d_vocab, "cpu", rows=(64,))
    if verdict.max_rel_error is None:
        pytest.skip(f"bfloat16 products do not run on this CPU: {verdict.reason}")
    resid = torch.randn(model.cfg.n_layers + 1, 64, model.cfg.d_model)
    a = heldout_metrics(trained, resid, dtype=torch.bfloat16)
    b = heldout_metrics(trained, resid)
    assert (a["kl"] - b["kl"]).abs().max() < 0.02
    # Training ran its metrics in bfloat16 only where the probe also found it faster;
    # then it recorded the float32 cross-check, else there is nothing to cross-check.
    check = trained.meta["eval_dtype_check"]
    if trained.meta["dtypes_used"]["eval"] == "bfloat16":
        assert check["positions"] > 0 and check["max_abs_kl_diff"] < 0.02
    else:
        assert check is None and trained.meta["bf16_probe"]["use_bf16"] is False


def test_gemma_family_trains_too():
    gemma = dk.load_model("tiny-gemma3", seed=0, n_layers=2)
    lens = train_tuned_lens(gemma, TEXT, dict(CFG, steps=5), progress=False)
    kl = _kl(lens)
    assert (kl["tuned"] < kl["logit"]).all(), kl


def test_compare_lenses(model, trained):
    from depthkit.lens.compare import compare_lenses

    prompts = ["The cat sat on the", "In 1905 Albert Einstein", "Water boils at"]
    the = model.tokenizer(" the", add_special_tokens=False)["input_ids"]
    per_layer, steps = compare_lenses(
        model, prompts, {"logit": LogitLens(model), "tuned": trained}, frequent_ids=the, progress=False
    )
    assert set(per_layer["lens"]) == {"logit", "tuned"} and (per_layer["n"] == len(prompts)).all()
    last = per_layer[per_layer["layer"] == model.cfg.n_layers]
    assert (last["top1_agreement"] == 1.0).all() and (last["kl"].abs() < 1e-5).all()
    row = steps[(steps["lens"] == "tuned") & (steps["layer"] == 1)]
    want = float((row["top1_id"].isin(the)).mean())
    assert per_layer.set_index(["lens", "layer"]).loc[("tuned", 1), "frequent_share"] == pytest.approx(want)
    with pytest.raises(ValueError, match="at least one lens"):
        compare_lenses(model, prompts, {})


def test_adam_after_the_ridge_start_does_not_undo_it(model, trained):
    init = {r["layer"]: r["kl"] for r in trained.meta["heldout_after_init"]}
    after = _kl(trained)["tuned"]
    assert after.mean() <= 1.02 * (sum(init.values()) / len(init)), (init, after)
    loss = trained.meta["train_loss"]
    assert sum(loss[-5:]) / 5 <= loss[0] * 1.02, loss


def test_compare_lenses_matches_the_trajectory_engine(model, trained):
    from depthkit.lens.compare import compare_lenses

    prompts = ["The cat sat on the", "In 1905 Albert Einstein wrote four", "Water"]
    per_layer, steps = compare_lenses(model, prompts, {"tuned": trained}, batch_size=2, progress=False)
    tr = trajectories(model, prompts, lens=trained, progress=False)
    got = steps.sort_values(["item", "layer"]).reset_index(drop=True)
    assert got["top1_id"].tolist() == tr.steps["top1_id"].tolist()
    assert got["kl_to_final"].to_numpy() == pytest.approx(tr.steps["kl_to_final"].to_numpy(), abs=1e-5)


def test_residual_cache_computes_residuals_once(model, monkeypatch):
    from depthkit.lens import ResidualCache
    from depthkit.lens import training_data as lens_data

    builds = []
    real = lens_data.LensTrainingData.build.__func__

    def counting(cls, *args, **kwargs):
        builds.append(args[2].seed)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(lens_data.LensTrainingData, "build", classmethod(counting))
    cache = ResidualCache(model)
    cfg = dict(CFG, steps=2)
    plain = train_tuned_lens(model, TEXT, cfg, progress=False, cache=cache)
    other = train_tuned_lens(model, TEXT, dict(cfg, ridge=0.5), progress=False, downweight="the", cache=cache)
    assert builds == [0]  # another penalty and down-weighting: the very same positions
    assert cache.data is not None and cache.data.resid.shape[1] == CFG["train_tokens"]
    # The same lens as without a cache (deterministic under the seed).
    alone = train_tuned_lens(model, TEXT, cfg, progress=False)
    assert torch.equal(alone.A, plain.A) and not torch.equal(other.A, plain.A)
    assert builds == [0, 0]  # no cache given: computed for that call only
    train_tuned_lens(model, TEXT, cfg, seed=1, progress=False, cache=cache)
    assert builds == [0, 0, 1]  # other positions: recomputed, and only the latest kept
    assert cache.data.key[-1] == 1
    cache.clear()
    assert cache.data is None


def test_residual_cache_belongs_to_one_model(model, other_model, tmp_path):
    cache = ResidualCache(model)
    with pytest.raises(ValueError, match="another model"):
        get_tuned_lens(other_model, budget="smoke", text=TEXT, cache_dir=tmp_path, progress=False, cache=cache)


def test_no_module_global_residual_cache():
    import depthkit.lens
    import depthkit.lens.training
    import depthkit.lens.training_data

    for mod in (depthkit.lens, depthkit.lens.training_data, depthkit.lens.training):
        assert not hasattr(mod, "_RESIDUALS") and not hasattr(mod, "clear_residual_cache")


def test_engine_calls_never_train_a_lens(model, tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHKIT_CACHE", str(tmp_path))
    with pytest.raises(LensFileError, match=r"depthkit\.lens\.get_tuned_lens\(model\)"):
        resolve_lens(model, "tuned")
    with pytest.raises(LensFileError, match="never train"):
        trajectories(model, ["The cat sat on the"], lens="tuned", progress=False)
    assert not list(tmp_path.rglob("*.safetensors"))
    lens = lens_for(model, "tuned", budget="smoke", text=TEXT, progress=False)  # trains: asked for explicitly
    loaded = resolve_lens(model, "tuned", budget="smoke", text=TEXT)
    assert loaded.path == lens.path and torch.equal(loaded.A, lens.A)
    assert isinstance(lens_for(model, "logit"), LogitLens) and lens_for(model, lens) is lens


def test_one_default_lens_everywhere():
    import inspect

    from depthkit.analyses import early_exit, facts, mcq
    from depthkit.lens.base import DEFAULT_LENS

    assert DEFAULT_LENS == "logit"
    for fn in (trajectories, mcq.option_ranks, facts.answer_ranks, early_exit.exit_logits, resolve_lens, lens_for):
        assert inspect.signature(fn).parameters["lens"].default == DEFAULT_LENS, fn.__name__


def test_budget_fields_from_text_and_a_lens_from_its_file(model, tmp_path):
    from depthkit.lens.training_data import parse_budget

    assert parse_budget("steps=200, lr=1e-4,downweight=the") == {"steps": 200, "lr": 1e-4, "downweight": "the"}
    assert resolve_config("steps=7").steps == 7 and resolve_config("steps=7").train_tokens == resolve_config("default").train_tokens
    with pytest.raises(ValueError, match="key=value"):
        parse_budget("steps")
    lens = lens_for(model, "tuned", budget="steps=1,train_tokens=64,heldout_tokens=16,seq_len=16", text=TEXT,
                    cache_dir=tmp_path, progress=False)
    again = lens_for(model, str(lens.path))
    assert isinstance(again, TunedLens) and torch.equal(again.A, lens.A) and again.meta["config"]["steps"] == 1


@pytest.mark.parametrize("softcap", [0.0, 7.0])
def test_kl_gradient_by_hand_matches_autograd(model, softcap):
    from depthkit.lens.training_steps import kl_gradient_

    readout = Readout(model, torch.float32)
    readout.softcap = softcap
    g = torch.Generator().manual_seed(0)
    z0 = torch.randn(3, 5, model.cfg.d_vocab, generator=g) * 4
    p = torch.softmax(torch.randn(5, model.cfg.d_vocab, generator=g) * 3, -1)
    w = torch.rand(5, generator=g)
    u = z0.clone().requires_grad_()
    capped = torch.tanh(u / softcap) * softcap if softcap else u
    want_kl = (p * (p.log() - torch.log_softmax(capped, -1))).sum(-1)
    (want_grad,) = torch.autograd.grad((want_kl * w).sum(), u)
    z = z0.clone()
    kl = kl_gradient_(readout, z, p, (p * p.log()).sum(-1), w)
    torch.testing.assert_close(kl, want_kl.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(z, want_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("budget_mb", [None, 1e-6])
def test_training_gradients_match_autograd_through_the_lens(model, monkeypatch, budget_mb):
    """The hand-written gradient of one training step, with all layers in one
    unembedding product (default budget) or one layer per product (tiny budget),
    against autograd through the lens's own readout and log-softmax."""
    from depthkit.lens import training_metrics, training_steps

    if budget_mb is not None:
        monkeypatch.setattr(training_metrics, "LOGIT_BUDGET_MB", budget_mb)
    L, d, n = model.cfg.n_layers, model.cfg.d_model, 11
    want_groups = 1 if budget_mb is None else L
    assert len(training_metrics.layer_groups(L, n, model.cfg.d_vocab)) == want_groups
    g = torch.Generator().manual_seed(0)
    lens = TunedLens(model)
    with torch.no_grad():
        lens.A.normal_(0, 0.05, generator=g)
        lens.b.normal_(0, 0.05, generator=g)
    resid = torch.randn(L + 1, 40, d, generator=g) * 2
    idx = torch.randint(0, 40, (n,), generator=g)
    w = torch.rand(n, generator=g)
    w = w / w.sum()
    mu, sigma = torch.randn(L, d, generator=g), torch.rand(L, d, generator=g) + 0.5
    dA = (torch.randn(L, d, d, generator=g) * 0.02).requires_grad_()
    db = (torch.randn(L, d, generator=g) * 0.02).requires_grad_()
    gA, gb, total = training_steps.kl_gradients(lens, Readout(model, torch.float32), resid, idx, w, (mu, sigma), (dA, db))

    p = torch.softmax(lens.readout(resid[-1, idx]), -1).detach()
    loss = torch.zeros(())
    for l in range(L):
        h = resid[l, idx]
        z = lens.readout(lens.translate(h, l).detach() + ((h - mu[l]) / sigma[l]) @ dA[l].T + db[l])
        loss = loss + (w * (p * (p.log() - torch.log_softmax(z, -1))).sum(-1)).sum()
    want_A, want_b = torch.autograd.grad(loss / L, (dA, db))
    assert total == pytest.approx(float(loss.detach()), rel=1e-5)
    torch.testing.assert_close(gA, want_A, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(gb, want_b, rtol=1e-4, atol=1e-7)


def test_sampled_back_projection_is_unbiased(model):
    """The sampled gradient through the unembedding: exact where a row has fewer
    large entries than draws, and on average equal to the exact product otherwise.
    Its sparse matrices hold valid CSR (a heavy entry drawn repeatedly is one entry)."""
    readout = Readout(model, torch.float32)
    g = torch.Generator().manual_seed(0)
    V = model.cfg.d_vocab
    sparse = torch.zeros(6, V)
    sparse[torch.arange(6), torch.randint(0, V, (6,), generator=g)] = torch.randn(6, generator=g)
    with torch.sparse.check_sparse_tensor_invariants():
        torch.testing.assert_close(readout.project_back_sampled(sparse, 8, g), readout.project_back(sparse))
    dense = torch.softmax(torch.randn(2, 3, V, generator=g) * 2, -1) - torch.softmax(torch.randn(3, V, generator=g), -1)
    exact = readout.project_back(dense)
    draws = torch.stack([readout.project_back_sampled(dense, 16, g, chunk=4) for _ in range(400)])
    one = float((draws[0] - exact).norm() / exact.norm())
    mean = float((draws.mean(0) - exact).norm() / exact.norm())
    assert one > 0.05 and mean < one / 5, (one, mean)


def test_sampled_gradients_train_a_lens_as_good(model):
    """Sampled gradients are an opt-in schedule with its own file name; on the tiny
    model they reach the exact schedule's held-out KL to within a few per cent."""
    cfg = {**CFG, "backward_samples": 32}
    lens = train_tuned_lens(model, TEXT, cfg, seed=0, progress=False)
    exact = train_tuned_lens(model, TEXT, CFG, seed=0, progress=False)
    assert lens.meta["config_hash"] != exact.meta["config_hash"]
    kl, ref = _kl(lens), _kl(exact)
    assert (kl["tuned"] < kl["logit"]).iloc[:-1].all()
    assert float(kl["tuned"].mean()) <= 1.05 * float(ref["tuned"].mean())
