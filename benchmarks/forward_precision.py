"""Is a bfloat16 model forward an equivalent, faster schedule for chapter 02's option ranks?

    python benchmarks/forward_precision.py                         # 100 mmlu prompts, smollm2-135m
    python benchmarks/forward_precision.py --task sst2 --n 200 --model gemma3-270m

Runs the same few-shot prompts through the model loaded in float32 (the chapters' default)
and in bfloat16, reads every option's rank and probability at every layer with the logit
lens (so no tuned lens enters the comparison), and prints the time of each after a
warm-up, the share of (prompt, layer, option) ranks that agree, and how often the
option with the highest probability (chapter 02's choice) agrees at the middle, the
third-last and the output layer, with each precision's accuracy. A schedule that changes
the model's own answer on some prompts is not equivalent, whatever it saves. ``load_model(dtype="bfloat16")`` refuses on a CPU whose bfloat16
kernels the precision probe finds crashing or wrong.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="mmlu")
    ap.add_argument("--n", type=int, default=100, help="prompts")
    ap.add_argument("--shots", type=int, default=4)
    args = ap.parse_args()

    import torch

    import depthkit as dk
    from depthkit.analyses import mcq
    from depthkit.analyses.mcq_layers import accuracy, per_item
    from depthkit.analyses.mcq_prompts import build_prompts

    prompts = build_prompts(args.task, args.n, shots=args.shots, seed=0)
    ranks, seconds = {}, {}
    for dtype in ("float32", "bfloat16"):
        model = dk.load_model(args.model, dtype=dtype)
        mcq.option_ranks(model, prompts.head(8), lens="logit", progress=False)  # warm-up: kernels, caches
        start = time.perf_counter()
        ranks[dtype] = mcq.option_ranks(model, prompts, lens="logit", progress=False)
        seconds[dtype] = time.perf_counter() - start
        del model
    key = ["item", "layer", "option"]
    f32, bf16 = (ranks[d].sort_values(key).reset_index(drop=True) for d in ("float32", "bfloat16"))
    last = int(f32["layer"].max())
    print(f"{args.model}, {len(prompts)} {args.task} prompts, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}")
    print(f"option ranks: float32 {seconds['float32']:.1f} s, bfloat16 {seconds['bfloat16']:.1f} s "
          f"({seconds['float32'] / seconds['bfloat16']:.2f}x)")
    print(f"ranks equal: {(f32['rank'] == bf16['rank']).mean():.1%} of (prompt, layer, option); "
          f"largest probability difference {(f32['prob'] - bf16['prob']).abs().max():.3g}")
    print(f"accuracy: float32 {accuracy(f32)['accuracy'].iloc[0]:.0%}, bfloat16 {accuracy(bf16)['accuracy'].iloc[0]:.0%}")
    choices = per_item(f32).merge(per_item(bf16), on=["item", "layer"], suffixes=("_f32", "_bf16"))
    for layer in (last // 2, last - 2, last):
        at = choices[choices["layer"] == layer]
        same = (at["choice_f32"] == at["choice_bf16"]).mean()
        print(f"layer {layer}{' (output)' if layer == last else ''}: the most probable option agrees on {same:.0%} of prompts")


if __name__ == "__main__":
    main()
