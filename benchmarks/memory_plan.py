"""Memory each chapter needs on the paper's models: an estimate from their configs.

    python benchmarks/memory_plan.py            # markdown table, bfloat16 weights
    python benchmarks/memory_plan.py --dtype float32

No GPU was available where this book is built, so these are estimates, not
measurements: the weights (parameters x bytes per parameter, exact) plus the
largest buffer depthkit itself allocates in each chapter at the chapter's default
sizes, computed from the model's depth L, width d and vocabulary V. Activations of
one forward pass (a few hundred MB at these batch sizes), the CUDA context (~0.5
GB) and allocator slack come on top. The one buffer that is not on the GPU is
chapter 00's cache of training residuals, held in host memory.

The configs are the public ones of each hub id (number of parameters, blocks,
width, vocabulary), written here so that the script needs no network.
"""

from __future__ import annotations

import argparse

# hub id: (parameters, blocks L, width d, vocabulary V)
MODELS = {
    "gpt2-xl": (1_557_611_200, 48, 1600, 50257),
    "EleutherAI/pythia-6.9b-deduped": (6_857_302_016, 32, 4096, 50432),
    "meta-llama/Llama-2-7b-hf": (6_738_415_616, 32, 4096, 32000),
    "meta-llama/Meta-Llama-3-8B": (8_030_261_248, 32, 4096, 128256),
    "meta-llama/Llama-3.1-70B": (70_553_706_496, 80, 8192, 128256),
}
GB = 1e9
F32 = 4


def buffers(L: int, d: int, V: int) -> dict[str, tuple[float, str]]:
    """Per chapter: the largest depthkit buffer in bytes and what it is (default sizes)."""
    depths = L + 1
    train, held = 16384, 2048  # TrainConfig.train_tokens / heldout_tokens
    return {
        "00": (4 * L * d * d * F32 + V * d * 2 + 128 * V * F32 * 3,
               "tuned-lens translators with gradients and Adam moments, a bfloat16 unembedding copy, logits of a step"),
        "00 host": ((train + held) * depths * d * F32, "training residuals, in host memory"),
        "01": (512e6 + 64 * depths * d * F32, "decode budget (budget_mb=512) and one batch of 64 prompts at every depth"),
        "02": (5 * 200 * depths * d * F32, "last-position residuals of 5 tasks x 200 prompts at every depth"),
        "03": (512e6 + 342 * 3 * depths * d * F32, "decode budget and 342 prompts x 3 answer tokens at every depth"),
        "04": (512e6 + 64 * depths * d * F32, "decode budget and one batch of 64 prompts at every depth"),
        "05": (8 * 96 * 3 * L * d * F32, "three residuals of every block for 8 texts x 96 tokens (map_blocks)"),
        "06": (24 * 96 * depths * d * F32, "24 texts x 96 tokens at every depth"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    args = ap.parse_args()
    per = 2 if args.dtype == "bfloat16" else 4
    chapters = ["00", "01", "02", "03", "04", "05", "06"]
    print(f"| model | weights ({args.dtype}) | " + " | ".join(f"ch {c}" for c in chapters) + " | ch 00 host RAM |")
    print("|---|---|" + "---|" * len(chapters) + "---|")
    for name, (n, L, d, V) in MODELS.items():
        weights = n * per
        b = buffers(L, d, V)
        cells = [f"{(weights + b[c][0]) / GB:.1f}" for c in chapters]
        print(f"| `{name}` | {weights / GB:.1f} | " + " | ".join(cells) + f" | {b['00 host'][0] / GB:.1f} |")
    print("\nGB of device memory: weights plus the chapter's largest buffer (see --help). What the buffers are:")
    for c, (_, what) in buffers(32, 4096, 128256).items():
        print(f"- {c}: {what}")


if __name__ == "__main__":
    main()
