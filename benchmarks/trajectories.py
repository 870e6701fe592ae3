"""Throughput and memory of the trajectory engine, against a naive reference.

    python benchmarks/trajectories.py                 # smollm2-135m, both workloads
    python benchmarks/trajectories.py --gemma         # also peak RSS of gemma3-270m on (b)

Workloads (issue 2):
  (a) last-position: 1,000 Wikipedia-prefix prompts, one prediction each;
  (b) all positions of 8 texts of 256 tokens.
The naive reference runs one prompt at a time, asks Hugging Face for every hidden
state and computes full logits for every layer at every position; it is timed on a
subset (it is slow) and reported per prompt / per token.

Each measurement runs in its own subprocess so that peak RSS belongs to it alone.
Figures vary run to run and with other load on the machine: the script prints the
load average next to them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def matmul_rate(n: int = 4096, repeats: int = 3) -> float:
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def _texts_256(model, n: int = 8, length: int = 256) -> list[list[int]]:
    from depthkit.data.embedded import wikipedia_passages

    tok = model.tokenizer
    out = []
    for text in wikipedia_passages():
        ids = tok(text, add_special_tokens=True)["input_ids"]
        if len(ids) >= length:
            out.append(list(ids[:length]))
        if len(out) == n:
            return out
    raise RuntimeError("not enough long passages")


def _forward_flops(model, n_tokens: int) -> float:
    # 2 FLOPs per weight per token for the blocks (attention over <=256 tokens is small
    # next to the projections at these widths); the embedding lookup is free.
    n_params = sum(p.numel() for n, p in model.original_model.named_parameters() if "embed" not in n)
    return 2.0 * n_params * n_tokens


def _lens_flops(model, n_rows: int) -> float:
    return 2.0 * model.cfg.d_model * model.cfg.d_vocab * n_rows


def run_one(kind: str, model_name: str, n_prompts: int) -> dict:
    import torch

    import depthkit as dk
    from depthkit.data.embedded import wikipedia_prefixes
    from depthkit.lens.trajectories import Item

    torch.set_grad_enabled(False)
    model = dk.load_model(model_name)
    L = model.cfg.n_layers
    if kind.endswith("a"):
        prompts = wikipedia_prefixes(n_prompts, seed=0)["prompt"].tolist()
        items = dk.make_items(model, prompts)
    else:
        items = [Item(ids, list(range(len(ids)))) for ids in _texts_256(model)][:n_prompts]
    n_tokens = sum(len(i.tokens) for i in items)
    n_positions = sum(len(i.positions) for i in items)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t = time.perf_counter()
    if kind.startswith("engine"):
        dk.trajectories(model, items, batch_size=32 if kind.endswith("a") else 8, progress=False)
    else:
        _naive(model, items)
    seconds = time.perf_counter() - t
    flops = _forward_flops(model, n_tokens)
    lens_rows = (L + 1) * (n_tokens if kind.startswith("naive") else n_positions)
    flops += _lens_flops(model, lens_rows)
    return {
        "kind": kind,
        "model": model_name,
        "items": len(items),
        "tokens": n_tokens,
        "positions": n_positions,
        "seconds": seconds,
        "items_per_s": len(items) / seconds,
        "positions_per_s": n_positions / seconds,
        "gflops": flops / seconds / 1e9,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_after_load_mb": rss_before,
    }


def _naive(model, items) -> None:
    """One prompt at a time: every hidden state from HF, full logits for every layer
    and position, then the same statistics as the engine at the positions asked for."""
    import torch

    from depthkit.lens.base import LogitLens

    lens = LogitLens(model)
    hf = model.original_model
    for it in items:
        ids = torch.tensor([it.tokens])
        out = hf(ids, output_hidden_states=True)
        hidden = list(out.hidden_states[: model.cfg.n_layers])
        logits = [lens.readout(h[0]) for h in hidden] + [out.logits[0]]
        final = torch.log_softmax(logits[-1][it.positions], -1)
        for z in logits:
            z = z[it.positions]
            logq = torch.log_softmax(z, -1)
            z.topk(5, -1)
            (logq.exp() * logq).sum(-1)
            (final.exp() * (final - logq)).sum(-1)
            (z > z.gather(-1, final.argmax(-1, keepdim=True))).sum(-1)


def _sub(kind: str, model: str, n: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--one", kind, "--model", model, "--n", str(n)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{kind} on {model} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--prompts", type=int, default=1000, help="prompts in workload (a)")
    ap.add_argument("--naive-prompts", type=int, default=100, help="prompts of (a) timed through the naive path")
    ap.add_argument("--gemma", action="store_true", help="also measure gemma3-270m on workload (b)")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.model, args.n)))
        return

    rate = matmul_rate()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; fp32 matmul 4096^3: {rate:.0f} GFLOP/s")
    rows = [
        _sub("engine-a", args.model, args.prompts),
        _sub("naive-a", args.model, args.naive_prompts),
        _sub("engine-b", args.model, 8),
        _sub("naive-b", args.model, 2),
    ]
    if args.gemma:
        rows.append(_sub("engine-b", "gemma3-270m", 8))
    print(f"\n{'workload':<10} {'model':<14} {'items':>6} {'positions':>9} {'seconds':>8} {'items/s':>8} "
          f"{'pos/s':>8} {'GFLOP/s':>8} {'% matmul':>8} {'peak RSS MB':>11}")
    for r in rows:
        print(f"{r['kind']:<10} {r['model']:<14} {r['items']:>6} {r['positions']:>9} {r['seconds']:>8.1f} "
              f"{r['items_per_s']:>8.2f} {r['positions_per_s']:>8.1f} {r['gflops']:>8.1f} "
              f"{100 * r['gflops'] / rate:>7.0f}% {r['peak_rss_mb']:>11.0f}")
    by = {(r["kind"], r["model"]): r for r in rows}
    a = by[("engine-a", args.model)]["items_per_s"] / by[("naive-a", args.model)]["items_per_s"]
    b_pct = 100 * by[("engine-b", args.model)]["gflops"] / rate
    print(f"\n(a) engine vs naive, prompts per second: {a:.1f}x (target >= 4x)")
    print(f"(b) engine at {b_pct:.0f}% of the measured matmul rate (target >= 50%)")
    if args.gemma:
        print(f"(b) gemma3-270m peak RSS: {by[('engine-b', 'gemma3-270m')]['peak_rss_mb']:.0f} MB (target < 4096 MB)")


if __name__ == "__main__":
    main()
