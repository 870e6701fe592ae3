from __future__ import annotations

import pytest
import torch

import depthkit as dk
from depthkit.engine.models import ModelLoadError, _build_tiny


def test_unknown_name_lists_embedded_models_and_hints_hub_ids():
    with pytest.raises(ModelLoadError) as err:
        dk.load_model("smollm-135m")
    msg = str(err.value)
    assert "smollm2-135m" in msg and "gemma3-270m" in msg
    assert "hub id" in msg
    assert "Did you mean 'smollm2-135m'" in msg


def test_offline_hub_id_fails_with_how_to_fix():
    with pytest.raises(ModelLoadError) as err:
        dk.load_model("EleutherAI/pythia-6.9b-deduped")
    assert "HF_HUB_OFFLINE" in str(err.value)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "neox", "gemma3"])
def test_tiny_models_describe_themselves(tiny_models, arch):
    info = dk.model_info(tiny_models[arch])
    assert info.source == "tiny" and info.quantisation == "none"
    assert info.n_blocks == 4 and info.d_model == 64
    assert info.d_vocab == len(tiny_models[arch].tokenizer)


def test_tiny_models_are_deterministic_under_seed():
    a = dk.load_model("tiny-llama", seed=3)
    b = dk.load_model("tiny-llama", seed=3)
    c = dk.load_model("tiny-llama", seed=4)
    assert dk.model_info(a).fingerprint == dk.model_info(b).fingerprint
    assert dk.model_info(a).fingerprint != dk.model_info(c).fingerprint


def test_local_directory_goes_through_the_ordinary_transformers_path(tmp_path, tiny_llama):
    """The hub path users take for gpt2-xl or Pythia, exercised on a saved tiny model."""
    # A fresh copy: the bridge wraps the modules of the model it boots, which then no
    # longer saves cleanly.
    hf, tok = _build_tiny("llama", seed=0, n_layers=4)
    hf.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = dk.load_model(str(tmp_path))
    info = dk.model_info(loaded)
    assert info.source == "local"
    assert info.fingerprint == dk.model_info(tiny_llama).fingerprint
    ids = torch.tensor([dk.encode(loaded, "The cat sat on the mat")])
    with torch.no_grad():
        assert torch.allclose(loaded(ids), tiny_llama(ids), atol=1e-5)


def test_trust_remote_code_is_off_by_default(tiny_llama):
    assert tiny_llama.cfg.trust_remote_code is False


@pytest.mark.integration
def test_smollm2_loads_offline_and_continues_capital_of_france(smollm2):
    info = dk.model_info(smollm2)
    assert (info.n_blocks, info.d_model, info.d_vocab) == (30, 576, 49152)
    assert info.source == "embedded" and "4-bit" in info.quantisation
    ids = torch.tensor([dk.encode(smollm2, "The capital of France is")])
    with torch.no_grad():
        top = smollm2(ids)[0, -1].argmax().item()
    assert smollm2.tokenizer.decode([top]) == " Paris"


# --------------------------------------------------------------------------- precision and placement


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_tiny_model_in_half_precision_on_cpu(dtype):
    import torch

    import depthkit as dk
    from depthkit.lens.base import LogitLens

    try:
        m = dk.load_model("tiny-llama", dtype=dtype, device="cpu")
    except dk.ModelLoadError as err:
        if "not safe on this CPU" not in str(err):
            raise
        pytest.skip(str(err))  # refused with a clear message, which is the point there
    assert {p.dtype for p in m.parameters()} == {getattr(torch, dtype)}
    traj = dk.trajectories(m, ["The capital of France is", "The cat sat on"], progress=False)
    assert traj.steps["kl_to_final"].notna().all()
    # The final layer's lens readout is the model's own logits, in the model's precision.
    tokens = m.to_tokens("The cat sat on")
    logits, cache = m.run_with_cache(tokens)
    final = cache[f"blocks.{m.cfg.n_layers - 1}.hook_resid_post"][0, -1].float()
    lens_logits = LogitLens(m).readout(final)
    assert lens_logits.dtype == torch.float32
    assert torch.allclose(lens_logits, logits[0, -1].float(), atol=0.05, rtol=0.02)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(dtype="float64"), "choose one of float32, bfloat16, float16"),
        (dict(device="cuda:7"), "not available"),
        (dict(device="gpu"), "not a device name"),
        (dict(device_map="auto"), "is for hub models"),
    ],
)
def test_bad_precision_or_placement_is_refused_clearly(kwargs, words):
    import depthkit as dk

    with pytest.raises(dk.ModelLoadError, match=words):
        dk.load_model("tiny-llama", **kwargs)


def test_chapter_parameters_reach_load_model(tmp_path):
    import depthkit as dk
    from depthkit.book.runner import chapter_params
    from depthkit.chapters import chapter

    p = chapter_params(chapter("01"), "tiny-gpt2", tmp_path, extra={"dtype": "float16", "device": "cpu"})
    m = dk.load_model(p["model"], **dk.model_options(p))
    assert next(m.parameters()).dtype.is_floating_point and str(next(m.parameters()).dtype) == "torch.float16"


def test_the_model_handle_carries_the_bridge_its_info_and_its_tokenizer():
    from depthkit.engine.handle import Model

    model = dk.load_model("tiny-gpt2")
    assert isinstance(model, Model) and type(model.bridge).__name__ == "TransformerBridge"
    assert not [a for a in vars(model.bridge) if a.startswith("depthkit")]  # nothing patched onto the bridge
    assert dk.model_info(model) is model.info and model.info.n_blocks == model.bridge.cfg.n_layers
    # depthkit encodes with the family's own tokenizer, not the bridge's BOS-prepending copy.
    assert model.tokenizer is not model.bridge.tokenizer
    # TransformerLens habits work on the handle: attributes and calls go to the bridge.
    tokens = model.bridge.to_tokens("Paris")
    assert model.cfg is model.bridge.cfg and torch.equal(model(tokens), model.bridge(tokens))
    with pytest.raises(AttributeError):
        _ = model.no_such_attribute
    assert "tiny-gpt2" in repr(model)
    for not_a_model in (torch.nn.Linear(2, 2), "smollm2-135m", model.bridge):
        with pytest.raises(TypeError, match="dk.load_model"):
            dk.model_info(not_a_model)


def test_embedded_model_loads_from_its_converted_copy_and_rebuilds_a_broken_one(tmp_path, monkeypatch):
    import copy
    import warnings

    from depthkit.engine import converted

    monkeypatch.setenv("DEPTHKIT_CACHE", str(tmp_path))
    real, parsed, calls = converted._load_gguf, [], []

    def gguf_once(name):
        # Parsing the GGUF file takes ~30 s here; the rebuild below reuses the first parse.
        calls.append(name)
        if not parsed:
            parsed.append(real(name))
        model, tok = parsed[0]
        return copy.deepcopy(model), tok

    monkeypatch.setattr(converted, "_load_gguf", gguf_once)
    text = "The capital of France is Paris.\n\nQuestion: 2+2?\nAnswer:"
    stale = tmp_path / "models" / "smollm2-135m-000000000000"  # from an older transformers, say
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"old")
    first = dk.load_model("smollm2-135m")
    folder = converted.converted_dir("smollm2-135m")
    assert calls == ["smollm2-135m"] and (folder / converted._COMPLETE).is_file()
    assert folder.parent == tmp_path / "models" and not list(folder.parent.glob(".*.tmp"))
    assert not stale.exists()  # only the copy that can still be read is kept

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reading a sound copy says nothing
        second = dk.load_model("smollm2-135m")
    assert calls == ["smollm2-135m"]  # read from the copy, not from the GGUF file
    assert dk.model_info(second) == dk.model_info(first)
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert first.tokenizer(text)["input_ids"] == second.tokenizer(text)["input_ids"]
    ids = first.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(first(ids), second(ids))

    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.warns(UserWarning, match="could not be read.*converting the GGUF file again"):
        third = dk.load_model("smollm2-135m")
    assert len(calls) == 2 and dk.model_info(third) == dk.model_info(first)
    dk.load_model("smollm2-135m")
    assert len(calls) == 2  # the rebuilt copy is read again


def test_a_copy_that_cannot_be_written_leaves_nothing_behind(tmp_path, monkeypatch, tiny_llama):
    import safetensors.torch

    from depthkit.engine import converted

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_model", full_disk)
    target = tmp_path / "models" / "copy"
    with pytest.warns(UserWarning, match="Could not keep a converted copy.*No space left"):
        converted._save_converted(tiny_llama.bridge.original_model, tiny_llama.tokenizer, target)
    assert not target.exists() and not list(target.parent.iterdir())
