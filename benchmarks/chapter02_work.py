"""Where chapter 02's time goes, in the work its forward passes do.

    HF_HUB_OFFLINE=1 python benchmarks/chapter02_work.py                 # smollm2-135m, today's sizes (~6 min)
    HF_HUB_OFFLINE=1 python benchmarks/chapter02_work.py --examples 40   # a fifth of the prompts
    HF_HUB_OFFLINE=1 python benchmarks/chapter02_work.py --model gemma3-270m

Runs the chapter's three model-heavy stages with its own parameters (the option
ranks of the task prompts, the label controls, the patching sweeps; the lens is
read from the cache, or trained first) and counts, for each, every matrix product
of the model's linear layers and every fused attention call: their FLOPs and time,
and the tokens they ran (padding included). It then times the same linear products
alone, at the model's weight shapes with 1,024 rows, before and after the stages: the
rate this CPU reaches on them (the better of the two), so ``linear FLOPs / that rate``
is what the stage's products cost at best. "rest" is
the stage's wall time outside both (norms, rotary embeddings, activations, the lens
readout, the statistics, Python).

Figures move with other load on the machine: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from contextlib import contextmanager

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import depthkit as dk  # noqa: E402
from depthkit.analyses import mcq  # noqa: E402
from depthkit.chapters import ch02_mcq_collection_vs_reasoning as ch  # noqa: E402
from depthkit.chapters.specs import chapter, notebook_defaults  # noqa: E402


class Work:
    """FLOPs and seconds of the linear products (by weight shape) and of attention."""

    def __init__(self) -> None:
        self.linear: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0, 0.0])  # shape -> [flops, s]
        self.attention = [0.0, 0.0]
        self.query_tokens = 0

    def linear_flops(self) -> float:
        return sum(f for f, _ in self.linear.values())

    def linear_seconds(self) -> float:
        return sum(s for _, s in self.linear.values())


@contextmanager
def counted(work: Work, n_layers: int):
    """Count every ``F.linear`` and ``F.scaled_dot_product_attention`` call into ``work``."""
    linear, sdpa = F.linear, F.scaled_dot_product_attention

    def lin(x, w, b=None):
        t = time.perf_counter()
        out = linear(x, w, b)
        rows = x.numel() // x.shape[-1]
        acc = work.linear[tuple(w.shape)]
        acc[0] += 2.0 * rows * w.shape[0] * w.shape[1]
        acc[1] += time.perf_counter() - t
        return out

    def att(q, k, v, *args, **kwargs):
        t = time.perf_counter()
        out = sdpa(q, k, v, *args, **kwargs)
        batch, heads, n_q, d_head = q.shape
        work.attention[0] += 4.0 * batch * heads * n_q * k.shape[-2] * d_head
        work.attention[1] += time.perf_counter() - t
        work.query_tokens += batch * n_q / n_layers
        return out

    F.linear, F.scaled_dot_product_attention = lin, att
    try:
        yield work
    finally:
        F.linear, F.scaled_dot_product_attention = linear, sdpa


def ceiling_gflops(shape: tuple[int, int], rows: int = 1024, repeats: int = 5) -> float:
    """This CPU's rate on ``F.linear`` with a weight of ``shape`` and ``rows`` input rows."""
    x, w = torch.randn(rows, shape[1]), torch.randn(*shape)
    F.linear(x, w)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        F.linear(x, w)
        best = min(best, time.perf_counter() - t)
    return 2.0 * rows * shape[0] * shape[1] / best / 1e9


def chapter_params(model: str, examples: int | None) -> dict:
    ns = notebook_defaults(chapter("02"))  # the notebook's own defaults
    ns["model"] = model
    if examples is not None:
        ns["n_examples"] = examples
    return dk.check_chapter_params("02", ns)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=dk.DEFAULT_MODEL)
    ap.add_argument("--examples", type=int, default=None, help="prompts per task (default: the chapter's)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    print(f"load average before: {os.getloadavg()[0]:.2f}; {torch.get_num_threads()} threads")
    p = chapter_params(args.model, args.examples)
    m = dk.load_model(p["model"])
    L = dk.model_info(m).n_blocks
    lens = dk.lens_for(m, p["lens"], budget=p["lens_budget"])
    prompts = ch.all_prompts(m, p)
    stages: dict[str, tuple[float, Work]] = {}

    def stage(name, fn):
        work = Work()
        t = time.perf_counter()
        with counted(work, L):
            out = fn()
        stages[name] = (time.perf_counter() - t, work)
        return out

    shapes = sorted({tuple(mod.weight.shape) for mod in m.original_model.modules() if isinstance(mod, torch.nn.Linear)})
    before = {s: ceiling_gflops(s) for s in shapes}
    clean = ch.clean_runs(m, prompts, p)
    ranks = stage("option ranks", lambda: mcq.option_ranks(m, prompts, lens=lens, convention=p["convention"], clean=clean, progress=False))
    stage("controls", lambda: ch.controls(m, prompts, ranks, lens, p))
    stage("patching", lambda: ch.patching_sweeps(m, prompts, p, L, clean=clean))
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")

    after = {s: ceiling_gflops(s) for s in shapes}
    # The better of the two: other load on the machine slows one or the other.
    ceiling = {s: max(before[s], after[s]) for s in shapes}
    head = ["stage", "wall s", "tokens", "linear TFLOP", "linear s", "GFLOP/s", "at ceiling s", "attention TFLOP", "attention s",
            "GFLOP/s", "rest s"]  # fmt: skip
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    total = [0.0, 0.0, 0.0]
    for name, (wall, w) in stages.items():
        lin_s, att_s = w.linear_seconds(), w.attention[1]
        best = sum(f / (ceiling.get(s) or ceiling_gflops(s)) / 1e9 for s, (f, _) in w.linear.items())
        cells = [name, f"{wall:.0f}", f"{w.query_tokens / 1e3:.1f}k", f"{w.linear_flops() / 1e12:.1f}", f"{lin_s:.0f}",
                 f"{w.linear_flops() / max(lin_s, 1e-9) / 1e9:.0f}", f"{best:.0f}", f"{w.attention[0] / 1e12:.2f}", f"{att_s:.0f}",
                 f"{w.attention[0] / max(att_s, 1e-9) / 1e9:.0f}", f"{wall - lin_s - att_s:.0f}"]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
        total = [total[0] + wall, total[1] + best, total[2] + att_s]
    rates = ", ".join(f"{s[1]}->{s[0]} {before[s]:.0f} / {after[s]:.0f}" for s in shapes)
    print(f"\nlinear products alone, 1,024 rows, GFLOP/s before / after the stages: {rates}")
    vocab = (dk.model_info(m).d_vocab, dk.model_info(m).d_model)
    spent = ", ".join(f"{name} {w.linear[vocab][1]:.1f} s" for name, (_, w) in stages.items() if vocab in w.linear)
    print(f"of which through F.linear with the {vocab[0]:,}-token unembedding (the model's own last-position logits, "
          f"which the engine reads past, and any lens readout that calls it): {spent or 'none'}")
    print(f"three stages: {total[0]:.0f} s; their linear products at that rate {total[1]:.0f} s, attention as measured {total[2]:.0f} s")


if __name__ == "__main__":
    main()
