from __future__ import annotations

import pytest
import torch

import depthkit as dk
from depthkit.models import ModelLoadError, _build_tiny, tokenizer_of


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
    assert info.d_vocab == len(tokenizer_of(tiny_models[arch]))


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
    assert tokenizer_of(smollm2).decode([top]) == " Paris"
