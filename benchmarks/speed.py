"""The speed issue's figures, measured in one run on this machine.

    python benchmarks/speed.py            # smollm2-135m; about 3 minutes on 2 cores
    python benchmarks/speed.py --lens     # also train the default tuned lens (3-8 more minutes)

Prints, with the load average before and after (other work on the machine slows
every figure; the ratios within one run are what to compare):

1. last-position engine (``dk.trajectories``, logit lens, every layer) against a
   plain batched transformers loop (16 prompts a batch in input order, the issue's
   reference, and sorted by length; ``output_hidden_states``, final norm +
   unembedding of the last position at every layer), against a roofline (forward
   FLOPs plus one unembedding per layer at the measured fp32 matmul rate) and
   against the model's forward pass alone, the ceiling of any engine built on
   it, and against that forward plus the unembeddings with no statistics (the
   least work any engine that decodes every layer must do); 128 prompts of 8-24 words from the analysis split;
2. few-shot MCQ prompts per second with and without the shared-prefix cache;
3. patching pairs per second (every layer): all of a target's patched layers in
   one pass over its context against recomputing the whole target for every
   patched layer, and against passes of copies only, over the contexts the
   targets' unpatched runs kept (chapter 02's way);
4. with ``--lens``: wall time of training the default tuned lens.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if "--lens" in sys.argv:
    # An empty cache, so that the lens and its training residuals are computed now
    # rather than loaded; set before depthkit reads it.
    os.environ["DEPTHKIT_CACHE"] = tempfile.mkdtemp(prefix="depthkit-speed-")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import depthkit as dk  # noqa: E402
from depthkit.analyses import mcq  # noqa: E402
from depthkit.analyses.patching import CleanRuns  # noqa: E402
from depthkit.engine.capture import (  # noqa: E402
    Item,
    batch_tensors,
    packed_batches,
    packed_tensors,
    patched_final_residuals,
    residual_hook_names,
)
from depthkit.lens.trajectories import ONE_POSITION_BATCH  # noqa: E402


def matmul_gflops(n: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _best(fn, repeats: int) -> float:
    fn()  # warm-up: first calls allocate and pick kernels
    return min(_timed(fn) for _ in range(repeats))


def short_prompts(n: int = 128, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    passages = dk.data.wikipedia_passages("analysis")
    return [" ".join(p.split()[: int(rng.integers(8, 25))]) for p in passages[:n]]


def plain_loop(model, items: list[Item], batch_size: int = 16, *, by_length: bool = False) -> None:
    """The reference: transformers alone, ``batch_size`` prompts a batch in the given
    order (``by_length``: sorted by length first), every hidden state, norm + unembed
    at the last position."""
    hf = model.original_model
    norm, head = hf.model.norm, hf.lm_head
    order = sorted(range(len(items)), key=lambda i: len(items[i].tokens)) if by_length else list(range(len(items)))
    for s in range(0, len(order), batch_size):
        tokens, mask, bi, pi = batch_tensors(model, [items[i] for i in order[s : s + batch_size]])
        out = hf(input_ids=tokens, attention_mask=mask, output_hidden_states=True, logits_to_keep=1)
        h = torch.stack([s[bi, pi] for s in out.hidden_states])
        z = head(norm(h))
        z.topk(5, -1)


def engine_batches(model, items: list[Item]):
    """The engine's forward passes over ``items``: its batches, packed into rows."""
    for batch in packed_batches(items, ONE_POSITION_BATCH):
        tokens, position_ids, mask, bi, pi = packed_tensors(model, [items[i] for i in batch])
        yield {"input_ids": tokens, "position_ids": position_ids, "attention_mask": mask}, bi, pi


def forward_only(model, items: list[Item]) -> None:
    """The model's own forward pass (transformers, no hooks, no lens) over the
    engine's batches: the ceiling of any lens engine that runs this model."""
    for inputs, _, _ in engine_batches(model, items):
        model.original_model.model(**inputs)


def forward_and_unembed(model, items: list[Item]) -> None:
    """The model's forward pass plus the final norm and unembedding of the last
    position at every depth, over the engine's batches, into one reused buffer,
    with no statistics at all: what any engine that decodes every layer here must
    at least spend."""
    hf = model.original_model
    norm, w = hf.model.norm, hf.lm_head.weight
    buf = None
    for inputs, bi, pi in engine_batches(model, items):
        out = hf.model(**inputs, output_hidden_states=True)
        h = norm(torch.cat([s[bi, pi] for s in out.hidden_states]))
        if buf is None or buf.shape[0] < h.shape[0]:
            buf = torch.empty(h.shape[0], w.shape[0])
        torch.mm(h, w.T, out=buf[: h.shape[0]])


def roofline_seconds(model, items: list[Item], gflops: float) -> float:
    n_params = sum(p.numel() for n, p in model.original_model.named_parameters() if "embed" not in n)
    n_tokens = sum(len(it.tokens) for it in items)
    L = int(model.cfg.n_layers)
    flops = 2.0 * n_params * n_tokens + 2.0 * model.cfg.d_model * model.cfg.d_vocab * (L + 1) * len(items)
    return flops / (gflops * 1e9)


def uncached_patching(model, sequences, layers, vectors) -> None:
    """The old way: every patched row runs its whole target sequence."""
    names = residual_hook_names(int(model.cfg.n_layers))
    for seq, layer, vec in zip(sequences, layers, vectors):
        def write(x, hook, vec=vec):  # noqa: ARG001
            x = x.clone()
            x[0, -1] = vec
            return x

        model.run_with_hooks(torch.tensor([seq]), fwd_hooks=[(names[layer], write)], logits_to_keep=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lens", action="store_true", help="also time training the default tuned lens")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    load0 = os.getloadavg()
    gflops = matmul_gflops()
    model = dk.load_model(args.model)
    L = int(model.cfg.n_layers)
    print(f"machine: {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, load average {load0[0]:.2f}; "
          f"fp32 matmul {gflops:.0f} GFLOP/s; model {args.model}")

    items = dk.make_items(model, short_prompts())
    eng = _best(lambda: dk.trajectories(model, items, progress=False), args.repeats)
    plain = _best(lambda: plain_loop(model, items), args.repeats)
    plain_sorted = _best(lambda: plain_loop(model, items, by_length=True), args.repeats)
    fwd = _best(lambda: forward_only(model, items), args.repeats)
    floor = _best(lambda: forward_and_unembed(model, items), args.repeats)
    roof = roofline_seconds(model, items, gflops)
    n = len(items)
    print(f"\n1. last position, {n} prompts of 8-24 words ({sum(len(i.tokens) for i in items)} tokens), logit lens at {L + 1} depths")
    print(f"   engine {n / eng:.1f} prompts/s | plain transformers loop {n / plain:.1f} (16 a batch in input order), "
          f"{n / plain_sorted:.1f} (sorted by length) | roofline {n / roof:.1f}")
    print(f"   engine / plain loop = {plain / eng:.2f}x (target >= 1.5x), / sorted plain loop = {plain_sorted / eng:.2f}x; "
          f"engine / roofline = {roof / eng:.2f} (target >= 0.7)")
    print(f"   the model's forward alone (no lens, same batches) {n / fwd:.1f} prompts/s = {roof / fwd:.2f} of the roofline: "
          f"the ceiling of any engine built on it")
    print(f"   forward + final norm + {L + 1} unembeddings, no statistics {n / floor:.1f} prompts/s = {roof / floor:.2f} of the roofline, "
          f"{plain / floor:.2f}x the plain loop: the most any lens engine can reach here; the engine runs at {floor / eng:.2f} of it")

    prompts = list(mcq.build_prompts("sst2", 32, shots=4, seed=0)["prompt"])
    mcq_items = dk.make_items(model, prompts)
    off = _best(lambda: dk.trajectories(model, mcq_items, share_prefix=False, progress=False), 1)
    on = _best(lambda: dk.trajectories(model, mcq_items, share_prefix=True, progress=False), 1)
    print(f"\n2. few-shot MCQ (sst2, 4 shots, {len(prompts)} prompts, mean {np.mean([len(i.tokens) for i in mcq_items]):.0f} tokens)")
    print(f"   shared-prefix cache {len(prompts) / on:.2f} prompts/s | without {len(prompts) / off:.2f} | {off / on:.1f}x")

    n_pairs = 4
    tgt = [it.tokens for it in mcq_items[:n_pairs]]
    seqs = [t for t in tgt for _ in range(L + 1)]
    layers = [lay for _ in tgt for lay in range(L + 1)]
    vecs = torch.randn(len(seqs), int(model.cfg.d_model))
    cached = _best(lambda: patched_final_residuals(model, seqs, layers, vecs), 1)
    full = _timed(lambda: uncached_patching(model, seqs, layers, vecs))
    # Chapter 02's way: the targets' unpatched runs (the option ranks) keep their contexts.
    runs = CleanRuns(model, targets=tgt)
    dk.trajectories(model, mcq_items[:n_pairs], keep=runs.keep, keep_contexts=runs, progress=False)
    kept = _best(lambda: patched_final_residuals(model, seqs, layers, vecs, contexts=runs.contexts), 1)
    print(f"\n3. patching, {n_pairs} targets x {L + 1} layers ({np.mean([len(t) for t in tgt]):.0f} tokens each)")
    print(f"   cached {n_pairs / cached:.2f} pairs/s | whole target per patch {n_pairs / full:.3f} pairs/s | {full / cached:.1f}x")
    print(f"   over the contexts their unpatched runs kept ({len(runs.contexts)} of {n_pairs}), all targets in one pass: "
          f"{n_pairs / kept:.2f} pairs/s, {cached / kept:.1f}x the cached runs")

    if args.lens:
        torch.set_grad_enabled(True)
        t = time.perf_counter()
        dk.lens_for(model, "tuned", budget="default", progress=False)
        print(f"\n4. default tuned lens trained in {(time.perf_counter() - t) / 60:.1f} min (target <= 5)")
    else:
        print("\n4. tuned-lens training: not measured here (pass --lens; benchmarks/tuned_lens.py has the detail)")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
