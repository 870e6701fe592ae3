"""Speed of the nnsight backend against the TransformerLens bridge, on the work the
chapters give the engine.

    python benchmarks/backends.py                      # smollm2-135m on this machine's device
    python benchmarks/backends.py --model gemma3-270m --device cuda --batch-size 64

Workloads, each run on both backends in one process (same weights, same inputs),
best of ``--repeats`` after a warm-up, with the largest difference of their outputs:

  (a) residuals: every depth at the last position of 200 Wikipedia-prefix prompts
      (chapter 01's reads; ``residual_rows``, batches of ``--batch-size``);
  (b) all positions of 8 passages of 256 tokens (chapter 04/05's reads; packed rows);
  (c) patching: 50 targets each patched at every depth (chapter 02's sweep);
  (d) truncated passes: 40 prompts stopped at 4 depths (chapter 06's early exits).

Figures vary run to run and with other load: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def workloads(model, batch_size: int) -> dict:
    import torch
    from trajectories import _texts_256 as passages  # the sibling benchmark's Wikipedia passages, cut to a length

    from depthkit.engine.capture import Item, patched_final_residuals, residual_rows, truncated_residuals

    n_blocks, d = model.info.n_blocks, model.info.d_model
    last = [Item(ids, [len(ids) - 1]) for ids in passages(model, 200, 24)]
    full = [Item(ids, list(range(len(ids)))) for ids in passages(model, 8, 256)]
    targets = passages(model, 50, 32)
    layers = [l for _ in targets for l in range(n_blocks + 1)]
    seqs = [t for t in targets for _ in range(n_blocks + 1)]
    vectors = torch.randn(len(seqs), d, generator=torch.Generator().manual_seed(0))
    short = [torch.tensor([ids]) for ids in passages(model, 40, 24)]
    return {
        "(a) last position, 200 prompts": lambda: residual_rows(model, last, batch_size=batch_size),
        "(b) all positions, 8 x 256 tokens": lambda: residual_rows(model, full, batch_size=batch_size),
        "(c) patching, 50 targets x every depth": lambda: patched_final_residuals(model, seqs, layers, vectors),
        "(d) truncated, 40 prompts x 4 depths": lambda: torch.cat(
            [truncated_residuals(model, t, depth)[0, -1:] for t in short for depth in (1, n_blocks // 3, 2 * n_blocks // 3, n_blocks)]
        ),
    }


def best_of(fn, repeats: int) -> tuple[float, object]:
    out = fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default=None)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch

    import depthkit as dk

    models = {b: dk.load_model(args.model, device=args.device, backend=b) for b in ("bridge", "nnsight")}
    work = {b: workloads(m, args.batch_size) for b, m in models.items()}
    print(f"model {args.model}, device {models['bridge'].backend.device}, batch size {args.batch_size}, "
          f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"{'workload':42s} {'bridge s':>9s} {'nnsight s':>10s} {'ratio':>6s} {'max |diff|':>11s}")
    for name in work["bridge"]:
        tb, ob = best_of(work["bridge"][name], args.repeats)
        tn, on = best_of(work["nnsight"][name], args.repeats)
        diff = float((ob.float().cpu() - on.float().cpu()).abs().max())
        print(f"{name:42s} {tb:9.3f} {tn:10.3f} {tn / tb:6.2f} {diff:11.2e}")


if __name__ == "__main__":
    main()
