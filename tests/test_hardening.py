"""Bad input gets a clear error, loses nothing, and nothing unsafe is ever loaded.

One table of cases: each feeds one kind of bad input and checks that the error
says what is wrong and how to fix it. Chapter-level cases (parameters of every
chapter, interrupted runs, byte-identical reruns) are in test_chapters.py.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pandas as pd
import pytest
import torch

import depthkit as dk
from depthkit.core.params import Param, ParameterError, check_params
from depthkit.core.results import ResultsError, RunRecorder, load_run
from depthkit.data.embedded import DataError, load_records
from depthkit.engine.models import ModelLoadError
from depthkit.lens import LensFileError, TunedLens, load_lens, save_lens
from depthkit.lens.trajectories import BYTES_PER_VOCAB_ENTRY, PromptTooLongError, answer_token_ids, decode_residuals


class Pickled:
    """Anything at all: its pickle is what an attacker's file would contain."""


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _saved_lens(model, tmp_path: Path) -> Path:
    lens = TunedLens(model)
    with torch.no_grad():
        lens.A.normal_(0, 0.01)
    return save_lens(lens, tmp_path / "lens.safetensors")


def _complete_run(tmp_path: Path, model) -> Path:
    rec = RunRecorder("01_guess_then_refine", dk.model_info(model), {"n": 1}, 0, root=tmp_path)
    rec.table("shares", pd.DataFrame({"layer": [0, 1], "share": [0.5, 0.25]}))
    return rec.finish()


# Each case: (id, function of (tmp_path, tiny model) that must raise, exception type,
# words the message must contain: what is wrong ... how to fix it).
CASES = [
    ("unknown model name", lambda t, m: dk.load_model("pythia-7b"), ModelLoadError, ["Unknown model", "smollm2-135m", "hub id"]),
    ("hub id while offline", lambda t, m: dk.load_model("meta-llama/Llama-2-7b-hf"), ModelLoadError, ["HF_HUB_OFFLINE", "network"]),
    ("parameter of the wrong type", lambda t, m: check_params({"n_prompts": "many"}, n_prompts=Param(int, min=1)), ParameterError, ["n_prompts", "integer", "many"]),
    ("parameter out of range", lambda t, m: check_params({"n_prompts": -3}, n_prompts=Param(int, min=1)), ParameterError, ["n_prompts", "-3", "-p n_prompts"]),
    ("parameter with a typo", lambda t, m: check_params({"n_promts": 3}, n_prompts=Param(int, min=1)), ParameterError, ["n_promts"]),
    ("bad choice", lambda t, m: check_params({"lens": "tunned"}, lens=Param(str, choices=("tuned", "logit"))), ParameterError, ["lens", "tuned"]),
    ("empty dataset (no prompts)", lambda t, m: dk.trajectories(m, []), ValueError, ["empty"]),
    ("empty dataset file", lambda t, m: load_records(_write(t / "e.jsonl", "")), DataError, ["empty"]),
    ("malformed JSONL line", lambda t, m: load_records(_write(t / "b.jsonl", '{"prompt": "a", "answer": "b"}\n{"prompt": "c", "answer": \n')), DataError, ["line 2"]),
    ("record with an empty prompt", lambda t, m: load_records(_write(t / "p.jsonl", '{"prompt": "", "answer": "b"}\n')), DataError, ["prompt"]),
    ("record without an answer", lambda t, m: load_records(_write(t / "a.jsonl", '{"prompt": "x"}\n')), DataError, ["answer"]),
    ("answer that tokenizes to nothing", lambda t, m: answer_token_ids(m, "The cat", ""), ValueError, ["tokenizes to nothing"]),
    ("empty prompt among good ones", lambda t, m: dk.trajectories(m, ["fine", ""]), ValueError, ["Empty prompt"]),
    ("prompt longer than the context", lambda t, m: dk.trajectories(m, ["cat " * 5000]), PromptTooLongError, ["exceeds", "on_overflow='truncate'"]),
    ("lens file for another model", lambda t, m: load_lens(dk.load_model("tiny-llama", seed=1), _saved_lens(m, t)), LensFileError, ["is a tuned lens for model", "trained for this model"]),
    ("lens file with wrong shapes", lambda t, m: _wrong_shapes(t, m), LensFileError, ["has tensors", "this model needs", "Delete"]),
    ("truncated lens file", lambda t, m: _truncate_and_load(t, m), LensFileError, ["Delete"]),
    ("lens file that is a pickle", lambda t, m: _pickle_as_lens(t, m), LensFileError, ["Delete"]),
    ("results folder without a manifest", lambda t, m: _drop_manifest(t, m), ResultsError, ["depthkit run"]),
    ("results folder with a damaged manifest", lambda t, m: _damage_manifest(t, m), ResultsError, ["manifest"]),
    ("results table replaced by a pickle", lambda t, m: _pickle_as_table(t, m), ResultsError, ["01_guess_then_refine"]),
]


def _truncate_and_load(tmp_path: Path, model):
    path = _saved_lens(model, tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return load_lens(model, path)


def _wrong_shapes(tmp_path: Path, model):
    """A self-consistent file (sidecar hash matches) whose tensors have the wrong shape."""
    import hashlib

    from safetensors.torch import save

    path = _saved_lens(model, tmp_path)
    data = save({"A": torch.zeros(2, 3, 3), "b": torch.zeros(2, 3)})
    path.write_bytes(data)
    sidecar = path.with_suffix(".json")
    meta = json.loads(sidecar.read_text())
    meta["weights_sha256"] = hashlib.sha256(data).hexdigest()
    sidecar.write_text(json.dumps(meta))
    return load_lens(model, path)


def _pickle_as_lens(tmp_path: Path, model):
    path = _saved_lens(model, tmp_path)
    path.write_bytes(pickle.dumps(Pickled()))
    return load_lens(model, path)


def _drop_manifest(tmp_path: Path, model):
    folder = _complete_run(tmp_path, model)
    (folder / "manifest.json").unlink()
    return load_run(dk.model_info(model).name, "01_guess_then_refine", root=tmp_path)


def _damage_manifest(tmp_path: Path, model):
    folder = _complete_run(tmp_path, model)
    (folder / "manifest.json").write_text('{"chapter": "01_guess', encoding="utf-8")
    return load_run(dk.model_info(model).name, "01_guess_then_refine", root=tmp_path)


def _pickle_as_table(tmp_path: Path, model):
    folder = _complete_run(tmp_path, model)
    (folder / "shares.parquet").write_bytes(pickle.dumps(Pickled()))
    return load_run(dk.model_info(model).name, "01_guess_then_refine", root=tmp_path)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_a_clear_error(case, tmp_path, tiny_llama):
    _, trigger, exc, words = case
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(exc) as err:
        trigger(tmp_path, tiny_llama)
    message = str(err.value)
    for word in words:
        assert word in message, f"{word!r} missing from: {message}"
    # no side effects beyond the files the case itself wrote before failing
    if not any(k in case[0] for k in ("lens", "results", "file", "JSONL", "record")):
        assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_the_table_covers_every_kind_of_bad_input_of_the_issue():
    kinds = " | ".join(c[0] for c in CASES)
    for needed in ("unknown model", "offline", "wrong type", "out of range", "empty dataset", "malformed JSONL",
                   "empty prompt", "tokenizes to nothing", "longer than the context", "another model",
                   "wrong shapes", "truncated", "without a manifest", "damaged manifest", "pickle"):
        assert needed in kinds, needed


def test_over_long_prompt_can_be_truncated_from_the_left_with_a_warning(tiny_llama):
    with pytest.warns(UserWarning, match="keeping its last"):
        ids = dk.encode(tiny_llama, "cat " * 5000, on_overflow="truncate")
    assert len(ids) == dk.model_info(tiny_llama).n_ctx


def test_vocabulary_sized_work_is_chunked_to_the_memory_budget(tiny_llama):
    """The decoder never materialises more than its budget of vocabulary-sized rows."""
    lens = dk.LogitLens(tiny_llama)
    seen: list[int] = []
    readout = lens.readout

    def spy(h, out=None):
        seen.append(h.reshape(-1, h.shape[-1]).shape[0])
        return readout(h, out)

    lens.readout = spy  # type: ignore[method-assign]
    items = dk.make_items(tiny_llama, ["The cat sat on the mat and the dog lay by the door"] * 6, positions="all")
    resid = dk.trajectories.__globals__["collect_residuals"](tiny_llama, items)
    plan = dk.layer_plan(tiny_llama.cfg.n_layers)
    budget_mb = 0.2
    decode_residuals(lens, plan, resid, None, budget_mb=budget_mb)
    per_row_bytes = lens.d_vocab * BYTES_PER_VOCAB_ENTRY
    assert max(seen) * per_row_bytes <= budget_mb * 2**20 + len(plan) * per_row_bytes
    assert len(seen) > 2  # it really was split


def test_no_pickle_loading_anywhere_in_depthkit():
    """Safe loading: nothing in the library unpickles (torch.load, pickle, joblib)."""
    root = Path(dk.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for bad in ("torch.load(", "pickle.load", "joblib.load", "np.load(", "allow_pickle=True"):
            assert bad not in text, f"{path.name} uses {bad}"


def test_trust_remote_code_is_off_unless_asked(monkeypatch):
    import depthkit.engine.models as models

    seen = {}

    def fake(name, dtype, trust_remote_code, device_map):
        seen["trust"] = trust_remote_code
        raise ModelLoadError("stop here")

    monkeypatch.setattr(models, "_load_pretrained", fake)
    with pytest.raises(ModelLoadError):
        dk.load_model("someone/some-model")
    assert seen["trust"] is False
    with pytest.raises(ModelLoadError):
        dk.load_model("someone/some-model", trust_remote_code=True)
    assert seen["trust"] is True


def test_a_crash_before_finish_leaves_the_previous_run_intact(tmp_path, tiny_llama):
    folder = _complete_run(tmp_path, tiny_llama)
    before = (folder / "shares.parquet").read_bytes()
    rec = RunRecorder("01_guess_then_refine", dk.model_info(tiny_llama), {"n": 2}, 0, root=tmp_path)
    rec.table("shares", pd.DataFrame({"layer": [0], "share": [1.0]}))
    del rec  # the process "dies" here: no finish()
    run = load_run(dk.model_info(tiny_llama).name, "01_guess_then_refine", root=tmp_path)
    assert (folder / "shares.parquet").read_bytes() == before
    assert run.params == {"n": 1}
    assert json.loads((folder / "manifest.json").read_text())["status"] == "complete"
