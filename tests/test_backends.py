"""The nnsight backend gives what the TransformerLens bridge gives, through every
function of the capture layer, on every tiny family; its remote path (rehearsed
here with nnsight's serverless simulation) keeps answers, resumes and refuses
clearly."""

from __future__ import annotations

import pytest
import torch

import depthkit as dk
from depthkit.engine.backends.remote import RemoteRunError
from depthkit.engine.capture import (
    Item,
    collect_residuals,
    map_blocks,
    model_logits,
    patched_final_residuals,
    residual_rows,
    truncated_residuals,
)
from depthkit.engine.models import ModelLoadError

ARCHS = ("llama", "gpt2", "neox", "gemma3")
ATOL = 2e-5  # float32 rounding of two orderings of the same arithmetic


@pytest.fixture(scope="module")
def pairs():
    return {a: (dk.load_model(f"tiny-{a}", seed=0), dk.load_model(f"tiny-{a}", seed=0, backend="nnsight")) for a in ARCHS}


def _items(n_tokens=(7, 12, 40), seed=0) -> list[Item]:
    g = torch.Generator().manual_seed(seed)
    return [Item(torch.randint(5, 300, (n,), generator=g).tolist(), list(range(n))) for n in n_tokens]


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("options", [{}, {"skip_block": 1}, {"pack": True}, {"layers": [0, 4]}])
def test_residuals_equal_the_bridges(pairs, arch, options):
    bridge, nn = pairs[arch]
    _close(collect_residuals(bridge, _items(), **options), collect_residuals(nn, _items(), **options))


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_prefix_patching_and_truncation_equal_the_bridges(pairs, arch):
    bridge, nn = pairs[arch]
    shared = [1, *range(20, 60)]
    items = [Item(shared + [7, 8], [41, 42]), Item(shared + [9], [41])]
    _close(residual_rows(bridge, items, share_prefix=True), residual_rows(nn, items, share_prefix=True))
    vectors = torch.randn(3, bridge.info.d_model, generator=torch.Generator().manual_seed(1))
    seqs, depths = [shared + [7, 8], shared + [9], shared + [7, 8]], [1, 2, bridge.info.n_blocks]
    patched = patched_final_residuals(nn, seqs, depths, vectors)
    _close(patched_final_residuals(bridge, seqs, depths, vectors), patched)
    _close(patched[2], vectors[2])  # a patch at depth L is what comes out
    tokens = torch.tensor([items[0].tokens])
    for depth in (0, 2, bridge.info.n_blocks):
        _close(truncated_residuals(bridge, tokens, depth), truncated_residuals(nn, tokens, depth))
    _close(model_logits(bridge, tokens), model_logits(nn, tokens))


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3"])
def test_block_map_equals_the_bridges(pairs, arch):
    bridge, nn = pairs[arch]

    def stack(b, pre, mid, post):
        return torch.stack([pre, mid, post])

    for a, b in zip(map_blocks(bridge, _items(), stack), map_blocks(nn, _items(), stack)):
        _close(a, b)


def test_parallel_blocks_have_no_middle_residual(pairs):
    with pytest.raises(ValueError, match="in parallel"):
        map_blocks(pairs["neox"][1], _items(), lambda *a: None)


def test_sliding_window_masks_reach_the_model(pairs):
    """tiny-gemma3's window is 32 tokens: longer prompts take one mask per layer type,
    which nnsight cannot batch, so the backend hands them to the model inside the trace."""
    bridge, nn = pairs["gemma3"]
    assert bridge.backend.config.sliding_window == 32
    items = _items((70, 50, 9, 12), seed=3)
    _close(collect_residuals(bridge, items, pack=True), collect_residuals(nn, items, pack=True))
    seqs, vectors = [items[0].tokens], torch.randn(1, bridge.info.d_model)
    _close(patched_final_residuals(bridge, seqs, [2], vectors), patched_final_residuals(nn, seqs, [2], vectors))


@pytest.mark.parametrize("arch", ARCHS)
def test_lens_readout_is_the_models_own(pairs, arch):
    bridge, nn = pairs[arch]
    h = collect_residuals(bridge, _items(), [bridge.info.n_blocks])[0]
    n = bridge.info.n_blocks
    _close(dk.resolve_lens(bridge, "logit")(h, n), dk.resolve_lens(nn, "logit")(h, n))
    tokens = torch.tensor([_items()[2].tokens])
    _close(dk.resolve_lens(nn, "logit")(truncated_residuals(nn, tokens, n)[0], n), model_logits(nn, tokens)[0])


def test_model_info_names_the_backend(pairs):
    bridge, nn = pairs["llama"]
    assert (bridge.info.backend, nn.info.backend) == ("bridge", "nnsight")
    assert bridge.info.fingerprint == nn.info.fingerprint  # the same weights, so the same cached lenses
    assert {k: v for k, v in bridge.info.as_dict().items() if k != "backend"} == {
        k: v for k, v in nn.info.as_dict().items() if k != "backend"
    }
    assert hasattr(nn, "trace")  # the network's own verbs stay reachable
    with pytest.raises(AttributeError, match="backend='bridge'"):
        nn.bridge  # noqa: B018


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"backend": "vllm"}, "not one of"),
        ({"remote": True}, "backend='nnsight'"),
        ({"backend": "nnsight", "remote": "yes"}, "true, false or 'local'"),
        ({"backend": "nnsight", "remote": True}, "not on NDIF"),
    ],
)
def test_bad_backend_requests_are_refused_with_the_fix(kwargs, match):
    with pytest.raises(ModelLoadError, match=match):
        dk.load_model("tiny-llama", **kwargs)


def test_chapter_parameters_take_the_backend():
    from depthkit.chapters import chapter, notebook_defaults

    ns = {**notebook_defaults(chapter("03")), "model": "tiny-llama", "backend": "nnsight", "remote": True}
    p = dk.check_chapter_params("03", ns)
    assert dk.model_options(p)["backend"] == "nnsight" and dk.model_options(p)["remote"] is True
    with pytest.raises(dk.ParameterError, match="backend=nnsight"):
        dk.check_chapter_params("03", {**ns, "backend": "bridge"})
    with pytest.raises(dk.ParameterError, match="backend"):
        dk.check_chapter_params("03", {**ns, "backend": "jax"})


# ---------------------------------------------------------------- the remote path


@pytest.fixture
def rehearsal(tmp_path, monkeypatch):
    """tiny-llama through nnsight's rehearsal of a remote run (serialised, run with
    depthkit's modules hidden), its answers kept in a fresh folder."""
    from depthkit.engine.backends.remote import RequestStore

    model = dk.load_model("tiny-llama", seed=0, backend="nnsight", remote="local")
    model.backend.store = RequestStore("tiny-llama-test", tmp_path / "answers")
    return model


def test_remote_rehearsal_equals_local_and_ships_no_depthkit_code(pairs, rehearsal):
    assert rehearsal.info.backend == "nnsight-remote" and not rehearsal.backend.supports_prefix
    items = _items()
    _close(collect_residuals(pairs["llama"][0], items, skip_block=2), collect_residuals(rehearsal, items, skip_block=2))
    shared = [1, *range(20, 60)]
    seqs, vectors = [shared + [7], shared + [8, 9]], torch.randn(2, 64)
    _close(patched_final_residuals(pairs["llama"][0], seqs, [1, 4], vectors), patched_final_residuals(rehearsal, seqs, [1, 4], vectors))


def test_a_chapters_passes_go_a_few_dozen_to_a_request(rehearsal):
    items = [Item([1, *range(10 + i, 20 + i)], [10]) for i in range(40)]
    local = residual_rows(dk.load_model("tiny-llama", seed=0), items, batch_size=1)
    _close(residual_rows(rehearsal, items, batch_size=1), local)
    assert rehearsal.backend.store.sent == 2  # 40 passes, 32 to a request
    assert len(list(rehearsal.backend.store.folder.glob("*.safetensors"))) == 40  # each kept on its own
    import json

    log = [json.loads(line) for line in (rehearsal.backend.store.folder / "requests.log").read_text().splitlines()]
    assert [r["passes"] for r in log] == [32, 8] and all(r["answer_bytes"] == r["passes"] * 5 * 64 * 4 for r in log)  # 5 depths x d_model floats


def test_remote_answers_are_kept_and_an_interrupted_run_resumes(rehearsal, monkeypatch):
    backend = rehearsal.backend
    backend.calls_per_request = 1  # one pass per request, so that the third request can fail alone
    items = [Item([1, *range(10 + i, 20 + i)], [10]) for i in range(6)]
    real_session, calls = backend._session, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise ConnectionError("connection reset by peer")
        return real_session(*args, **kwargs)

    monkeypatch.setattr(backend, "_session", flaky)
    with pytest.raises(RemoteRunError, match="sends only the rest") as err:
        residual_rows(rehearsal, items, batch_size=2)
    assert str(backend.store.folder) in str(err.value) and backend.store.sent == 2
    monkeypatch.setattr(backend, "_session", real_session)
    before = backend.store.sent
    resumed = residual_rows(rehearsal, items, batch_size=2)
    assert backend.store.sent - before == 1 and backend.store.reused == 2  # only the batch that failed went out
    again = residual_rows(rehearsal, items, batch_size=2)
    assert backend.store.sent - before == 1 and backend.store.reused == 5
    _close(resumed, again)


def test_a_damaged_answer_is_sent_again(rehearsal):
    items = _items((9,))
    first = collect_residuals(rehearsal, items)
    (path,) = list(rehearsal.backend.store.folder.glob("*.safetensors"))
    path.write_bytes(b"not a safetensors file")
    _close(collect_residuals(rehearsal, items), first)
    assert rehearsal.backend.store.sent == 2


def test_the_api_key_is_required_and_never_kept(rehearsal, monkeypatch):
    from nnsight import CONFIG

    from depthkit.engine.backends.remote import require_api_key

    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    monkeypatch.setattr(CONFIG.API, "APIKEY", None)
    with pytest.raises(RemoteRunError, match="NDIF_API_KEY"):
        require_api_key()
    with pytest.raises(RemoteRunError, match="NDIF_API_KEY"):
        dk.load_model("meta-llama/Llama-3.1-70B", backend="nnsight", remote=True)
    secret = "sk-depthkit-test-0123456789"
    monkeypatch.setenv("NDIF_API_KEY", secret)
    require_api_key()
    collect_residuals(rehearsal, _items((11,)))
    for f in rehearsal.backend.store.folder.rglob("*"):
        assert secret.encode() not in f.read_bytes()


def test_a_refused_request_says_what_to_do(rehearsal, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("401 Unauthorized: invalid api key")

    monkeypatch.setattr(rehearsal.backend, "_session", refuse)
    with pytest.raises(RemoteRunError, match="refused the request.*NDIF_API_KEY"):
        collect_residuals(rehearsal, _items((5,)))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_readout_from_checkpoint_files_alone(pairs, tmp_path, arch):
    """A remote model's readout is built from its config on the meta device and two
    tensors of its safetensors shards (gemma3's head is tied to its embedding)."""
    from depthkit.engine.backends.head import readout_from_checkpoint
    from depthkit.engine.backends.layout import find_layout
    from depthkit.engine.tiny import _build_tiny

    hf, _ = _build_tiny(arch, seed=0, n_layers=4)
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    with torch.device("meta"):
        meta = type(hf)(hf.config)
    parts = readout_from_checkpoint(str(tmp_path), meta, find_layout(meta), torch.float32)
    own = pairs[arch][1].backend.readout_parts()
    h = torch.randn(5, own.W_U.shape[0])
    _close(parts.unembed(parts.norm(h)), own.unembed(own.norm(h)))


@pytest.mark.integration
def test_smollm2_trajectories_and_patching_agree_across_backends(smollm2):
    """The embedded model's lens trajectories (ranks of chapter 03's kind of targets,
    top-1 at every layer) and a patching sweep agree between the two backends."""
    import numpy as np

    from depthkit.data.embedded import wikipedia_passages

    nn = dk.load_model("smollm2-135m", backend="nnsight")
    prompts = [" ".join(t.split()[:12]) for t in wikipedia_passages()[:24]]
    shots = "Q: What is the capital of Italy?\nA: Rome\n\nQ: What is the capital of Spain?\nA: Madrid\n\n"
    prompts += [f"{shots}Q: What is the capital of {c}?\nA:" for c in ("France", "Germany", "Japan", "Egypt")]
    targets = {"Paris": [" Paris"] * len(prompts), "the": [" the"] * len(prompts)}
    a = dk.trajectories(smollm2, prompts, lens="logit", targets=targets, progress=False)
    b = dk.trajectories(nn, prompts, lens="logit", targets=targets, progress=False)
    np.testing.assert_array_equal(a.steps.top1_id.to_numpy(), b.steps.top1_id.to_numpy())
    np.testing.assert_array_equal(a.targets["rank"].to_numpy(), b.targets["rank"].to_numpy())
    np.testing.assert_allclose(a.targets["prob"].to_numpy(), b.targets["prob"].to_numpy(), atol=1e-5)
    ids = [dk.encode(smollm2, p) for p in prompts[-4:]]
    n = smollm2.info.n_blocks
    seqs = [s for s in ids for _ in range(n + 1)]
    layers = [l for _ in ids for l in range(n + 1)]
    # Each question's residuals at every depth, written into another question.
    donors = residual_rows(smollm2, [Item(s, [len(s) - 1]) for s in ids[::-1]], batch_size=4)  # [depth, prompt, d]
    vectors = donors.permute(1, 0, 2).reshape(-1, smollm2.info.d_model)
    torch.testing.assert_close(
        patched_final_residuals(smollm2, seqs, layers, vectors), patched_final_residuals(nn, seqs, layers, vectors), atol=2e-4, rtol=1e-5
    )


@pytest.mark.parametrize("backend", ["bridge", "nnsight"])
def test_forward_passes_never_record_gradients(pairs, backend):
    """Every pass runs without autograd whatever the caller's mode: a pass that records
    one keeps every block's activations alive (a chapter of 400 prompts grew past 6 GB)."""
    model = pairs["llama"][0 if backend == "bridge" else 1]
    block = model.bridge.blocks[0] if backend == "bridge" else model.backend.hf_model.model.layers[0]
    seen: list[bool] = []
    handle = block.register_forward_pre_hook(lambda module, args: seen.append(torch.is_grad_enabled()))
    try:
        with torch.enable_grad():
            dk.trajectories(model, ["The cat sat on the", "A dog"], lens="logit", progress=False)
            residual_rows(model, _items(), batch_size=2)
            patched_final_residuals(model, [_items()[0].tokens], [2], torch.zeros(1, 64))
    finally:
        handle.remove()
    assert seen and not any(seen)


def test_device_map_runs_on_both_backends(pairs, tmp_path):
    """A local folder loaded with a device_map (accelerate's dispatch hooks on every
    module; here all on the CPU, the one device this machine has) reads the same
    residuals and logits on both backends as the model loaded plainly."""
    from depthkit.engine.tiny import _build_tiny

    hf, tok = _build_tiny("llama", seed=0, n_layers=4)
    hf.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    plain = pairs["llama"][0]
    items = _items()
    want = collect_residuals(plain, items)
    tokens = torch.tensor([items[1].tokens])
    for backend in ("bridge", "nnsight"):
        mapped = dk.load_model(str(tmp_path), backend=backend, device_map="auto")
        _close(collect_residuals(mapped, items), want)
        _close(model_logits(mapped, tokens), model_logits(plain, tokens))
