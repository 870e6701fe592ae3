"""Latency of dk.explore on the embedded model: what a user waits for.

    python benchmarks/explorer.py              # smollm2-135m, logit lens
    python benchmarks/explorer.py --threads 2  # as on the book's 2-core reference machine

Times the widget's own path (typing a prompt into the text box: the model runs once
at every depth, every layer is decoded, the grid and the top-k view are drawn as
HTML) per prompt, as the median over several prompts after one warm-up prompt;
then the interactions that must not rerun the model (position, target, convention).
Figures vary with other load on the machine: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPTS = [
    "The capital of France is",
    "The Eiffel Tower is located in the city of",
    "Water boils at a temperature of one hundred degrees",
    "Albert Einstein was born in the country of",
    "The largest planet in the solar system is",
    "To be or not to be, that is the",
    "Monday, Tuesday, Wednesday, Thursday,",
]


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    args = ap.parse_args()

    import torch

    import depthkit as dk

    if args.threads:
        torch.set_num_threads(args.threads)
    model = dk.load_model(args.model)
    w = dk.explore(model, lens="logit")
    ex = w.explorer

    def type_prompt(text: str) -> None:
        w.prompt_box.value = text
        if "⚠" in w.status.value:
            raise RuntimeError(w.status.value)

    timed(lambda: type_prompt("A warm-up prompt, not timed."))
    per_prompt, n_tokens = [], []
    for p in PROMPTS:
        per_prompt.append(timed(lambda: type_prompt(p)))
        n_tokens.append(len(ex.ids))
    runs = ex.forward_passes
    position = [timed(lambda: setattr(w.position_menu, "value", i)) for i in range(len(ex.ids))]
    target = [timed(lambda: setattr(w.target_box, "value", t)) for t in (" Monday", " Friday", " day")]
    convention = [timed(lambda: setattr(w.convention_buttons, "value", c)) for c in ("authors", "canonical")]
    assert ex.forward_passes == runs, "position/target/convention changes must not rerun the model"

    ms = lambda xs: f"{1000 * statistics.median(xs):.0f} ms"  # noqa: E731
    print(f"model {args.model}, logit lens, {model.cfg.n_layers} blocks, vocabulary {model.cfg.d_vocab}")
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    print(f"prompts of {min(n_tokens)}-{max(n_tokens)} tokens ({len(PROMPTS)} prompts after a warm-up)")
    print(f"latency per prompt (median): {ms(per_prompt)}   [min {min(per_prompt) * 1000:.0f}, max {max(per_prompt) * 1000:.0f}]")
    print(f"change position: {ms(position)};  change target (re-decode, no model run): {ms(target)};  "
          f"switch convention: {ms(convention)}")


if __name__ == "__main__":
    main()
