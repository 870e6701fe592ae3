"""Chapter 00's frequency-bias check with its two down-weighted lenses made both ways:
trained from their own weighted ridge start (``--scratch``, the old default) and
continued from the tuned lens (``--finetune``, today's default), on the chapter's
own prompts; prints each set's bias table, verdict and CPU seconds.

    HF_HUB_OFFLINE=1 python benchmarks/bias_lenses.py      # smollm2-135m, default budgets

Lenses are taken from the cache when saved there (chapter 00 saves all of them), else
trained and saved: on two slow AVX2 cores the two from-scratch lenses take over an hour.
"""

from __future__ import annotations

import argparse
import sys
import time

import depthkit as dk
from depthkit.analyses.frequency import token_frequencies
from depthkit.chapters import ch00_lenses as ch
from depthkit.lens import ResidualCache, compare_lenses, get_tuned_lens
from depthkit.lens.base import LogitLens

COLUMNS = ["lens", "early layers", "lo", "hi", "early − output", "diff lo", "diff hi", "drop", "drop lo", "drop hi", "n"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=dk.DEFAULT_MODEL)
    ap.add_argument("--budget", default="default", help="budget of the tuned lens")
    ap.add_argument("--scratch", default="default", help="budget of the from-scratch down-weighted lenses")
    ap.add_argument("--finetune", default="finetune", help="budget of the continued down-weighted lenses")
    ap.add_argument("--n-eval", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    model = dk.load_model(args.model)
    L = model.info.n_blocks
    cache = ResidualCache(model)
    tuned = get_tuned_lens(model, budget=args.budget, seed=args.seed, cache=cache)
    sets = {}
    for name, budget in (("from scratch", args.scratch), ("finetune", args.finetune)):
        sets[name] = [get_tuned_lens(model, budget=budget, seed=args.seed, downweight=d, cache=cache, start=tuned)
                      for d in ("the", "top10")]
    cache.clear()
    top10 = token_frequencies(model.tokenizer).sort_values("rank")["token_id"].head(10).to_list()
    prompts = ch.eval_prompts(args.n_eval, args.seed, [tuned, *sets["from scratch"], *sets["finetune"]])
    for name, (the, t10) in sets.items():
        t0 = time.perf_counter()
        lenses = {"logit": LogitLens(model), "tuned": tuned, ch.THE: the, ch.TOP10: t10}
        _, steps = compare_lenses(model, prompts["prompt"].tolist(), lenses, frequent_ids=top10, on_overflow="truncate")
        bias = ch.bias_table(ch.with_final_frequent(steps, top10), L, seed=args.seed)
        cpu = ", ".join(f"{k} {x.meta['timing']['cpu_s']:.0f} CPU-s ({x.meta['config']['steps']} steps from "
                        f"{x.meta['config']['init']})" for k, x in (("' the'", the), ("Top-10", t10)))
        print(f"\n=== down-weighted lenses {name}: {cpu}; compared in {time.perf_counter() - t0:.0f} s")
        print(bias[COLUMNS].round(3).to_string(index=False))
        print(ch.bias_verdict(bias, ch.early_layers(steps["layer"].unique(), L)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
