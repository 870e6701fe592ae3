"""Whether the model's float32 forward would run faster laid out differently on this CPU.

    HF_HUB_OFFLINE=1 python benchmarks/cpu_parallelism.py            # smollm2-135m, ~2 min on 2 cores
    HF_HUB_OFFLINE=1 python benchmarks/cpu_parallelism.py --model gemma3-270m

Two questions, each answered with the engine's own forward (the bridge, fused
attention) on batches shaped like chapter 02's (one long prompt, several short ones):

* **Workers**: the same passes as one process using every core, and as one process
  per core with one thread each, run at the same time. Prints the throughput of each
  and whether the one-thread outputs equal the many-thread ones bit for bit (the
  engine's results must not change with the machine's layout).
* **Pre-packed weights**: ``F.linear`` against MKL's packed-weight product
  (``torch.ops.mkl._mkl_linear``, what a frozen graph would use), at the model's
  weight shapes and the row counts its passes have.

Figures move with other load on the machine: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BATCHES = [(1, 300), (4, 128), (8, 100), (2, 512)]  # (rows, tokens): one long prompt, several short ones
REPEATS = 2


def _passes(model_name: str, threads: int, start_at: float, out: Path) -> None:
    """Worker: the passes of :data:`BATCHES`, ``REPEATS`` times, on ``threads`` threads,
    starting at wall-clock ``start_at``; writes the seconds and the outputs to ``out``."""
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    import depthkit as dk
    from depthkit.engine.attention import run_attention

    bridge = dk.load_model(model_name).backend.bridge
    gen = torch.Generator().manual_seed(0)
    tokens = [torch.randint(100, 20000, shape, generator=gen) for shape in BATCHES]

    def run() -> list[torch.Tensor]:
        with run_attention(bridge):
            return [bridge.run_with_hooks(t, attention_mask=torch.ones_like(t), fwd_hooks=[], logits_to_keep=1) for t in tokens]

    run()  # warm-up: first-call allocations and kernel choices
    time.sleep(max(0.0, start_at - time.time()))
    t = time.perf_counter()
    for _ in range(REPEATS):
        logits = run()
    torch.save({"seconds": time.perf_counter() - t, "logits": logits}, out)


def workers(model_name: str) -> None:
    cores = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:

        def launch(threads: int, n: int) -> list[dict]:
            start_at = time.time() + 40  # every worker loaded and warmed up by then
            outs = [Path(tmp) / f"{threads}-{i}.pt" for i in range(n)]
            procs = [subprocess.Popen([sys.executable, __file__, "--worker", model_name, str(threads), str(start_at), str(o)]) for o in outs]
            if any(p.wait() for p in procs):
                raise SystemExit("a worker failed")
            return [torch.load(o) for o in outs]

        (whole,) = launch(cores, 1)
        split = launch(1, cores)
    passes = REPEATS * len(BATCHES)
    one = passes / whole["seconds"]
    many = sum(passes / s["seconds"] for s in split)
    same = all(torch.equal(a, b) for s in split for a, b in zip(whole["logits"], s["logits"]))
    worst = max(float((a - b).abs().max()) for s in split for a, b in zip(whole["logits"], s["logits"]))
    print(f"workers: one process x {cores} threads {one:.2f} passes/s; {cores} processes x 1 thread {many:.2f} passes/s "
          f"together ({many / one:.2f} times); outputs bit-identical: {same} (largest logit difference {worst:.2e})")  # fmt: skip


def packed_weights(model_name: str) -> None:
    import depthkit as dk

    hf = dk.load_model(model_name).backend.bridge.original_model
    shapes = sorted({tuple(m.weight.shape) for m in hf.model.modules() if isinstance(m, torch.nn.Linear)})

    def best(f, n: int = 20) -> float:
        f()
        out = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(n):
                f()
            out = min(out, (time.perf_counter() - t) / n)
        return out

    print("| weight | rows | F.linear GFLOP/s | MKL packed GFLOP/s | equal |\n|---|---|---|---|---|")
    for shape in shapes:
        w = torch.randn(*shape)
        for rows in (128, 512, 2048):
            x = torch.randn(rows, shape[1])
            packed = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
            flops = 2.0 * rows * shape[0] * shape[1]
            plain = flops / best(lambda: F.linear(x, w)) / 1e9  # noqa: B023
            mkl = flops / best(lambda: torch.ops.mkl._mkl_linear(x, packed, w, None, rows)) / 1e9  # noqa: B023
            equal = torch.equal(F.linear(x, w), torch.ops.mkl._mkl_linear(x, packed, w, None, rows))
            print(f"| {shape[1]}->{shape[0]} | {rows} | {plain:.0f} | {mkl:.0f} | {equal} |")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _passes(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), Path(sys.argv[5]))
        return
    import depthkit as dk

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=dk.DEFAULT_MODEL)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}; {torch.get_num_threads()} threads")
    workers(args.model)
    if torch.backends.mkl.is_available():
        packed_weights(args.model)
    else:
        print("pre-packed weights: this torch build has no MKL")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
