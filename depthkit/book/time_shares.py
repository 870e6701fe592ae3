"""Where a chapter's kernel spends its time: model forward, lens readout, lens
training, statistics, or everything else. ``python time_shares.py --out OUT.json
MODULE [ARGS...]`` runs MODULE (the book runner passes ``ipykernel_launcher``) as
``__main__`` in this process, with a thread that looks at the main thread's stack
every :data:`INTERVAL_S` seconds and adds the time since its last look to the
stack's category. Only stacks inside a notebook cell count, so a kernel waiting
for its next cell adds nothing.

Sampling instead of timing calls, because the categories nest (a lens readout runs
inside a forward hook, a bootstrap calls a chapter's statistic) and because
instrumenting depthkit would change the code every result depends on. The cost is
one stack walk every 10 ms (well under 1 % of a core); the shares are estimates
with a resolution of about one interval per sample.

Standard library only, run by file path (like depthkit/tether.py): the runner
starts it without importing depthkit.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

SCRIPT = Path(__file__).resolve()
INTERVAL_S = 0.01
WRITE_EVERY_S = 2.0
CATEGORIES = ("model forward", "lens readout", "lens training", "statistics", "other")

_PACKAGE = f"{os.sep}depthkit{os.sep}"
# Libraries whose frames, inside depthkit's innermost frame, mean the model is running.
_MODEL_LIBS = tuple(f"{os.sep}{p}{os.sep}" for p in ("transformer_lens", "transformers", os.path.join("torch", "nn")))
# The lens package reads residuals out, except where it trains a lens, caches
# training residuals (a model forward), runs the model for trajectories or turns
# their prompts into token ids.
_TRAINING = {"lens.training", "lens.training_steps", "lens.training_metrics"}
_NOT_READOUT = _TRAINING | {"lens.training_data", "lens.trajectories", "lens.prompts"}
_READOUT_FUNCTIONS = {"decode_residuals"}


def _module(filename: str) -> str | None:
    """``lens.base`` for ``.../depthkit/lens/base.py``; None outside depthkit."""
    cut = filename.rfind(_PACKAGE)
    return None if cut < 0 else Path(filename[cut + len(_PACKAGE):]).with_suffix("").as_posix().replace("/", ".")


def _is_readout(module: str) -> bool:
    return (module == "lens" or module.startswith("lens.")) and module not in _NOT_READOUT


def _in_cell(filename: str) -> bool:
    # IPython compiles each cell to a file named like /tmp/ipykernel_<pid>/<hash>.py.
    return "ipykernel_" in filename and filename.endswith(".py") and _PACKAGE not in filename


def classify(stack: Sequence[tuple[str, str]]) -> str | None:
    """The category of one stack, given as ``(filename, function)`` pairs from the
    innermost frame out; None when no notebook cell is running."""
    if not any(_in_cell(f) for f, _ in stack):
        return None
    if any(f.startswith("<frozen importlib") for f, _ in stack):
        return "other"  # importing a module runs its top level, whatever the module's subject
    modules = [(_module(f), fn) for f, fn in stack]
    inside = [(m, fn) for m, fn in modules if m is not None]
    names = {m for m, _ in inside}
    if names & _TRAINING:
        return "lens training"
    if any(m == "stats" or m.startswith("stats.") for m in names):
        return "statistics"
    if not inside:
        return "other"
    first = next(i for i, (m, _) in enumerate(modules) if m is not None)
    module, function = inside[0]
    if _is_readout(module) or function in _READOUT_FUNCTIONS:
        return "lens readout"
    if any(any(lib in f for lib in _MODEL_LIBS) for f, _ in stack[:first]):
        return "model forward"
    return "other"


def _stack(frame) -> list[tuple[str, str]]:
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_code.co_name))
        frame = frame.f_back
    return out


class Sampler(threading.Thread):
    """Adds the wall time between looks to the category of the main thread's stack."""

    def __init__(self, out: Path, interval: float = INTERVAL_S) -> None:
        super().__init__(name="depthkit-time-shares", daemon=True)
        self.out, self.interval = Path(out), interval
        self.seconds = dict.fromkeys(CATEGORIES, 0.0)
        self.samples = 0
        self._main = threading.main_thread().ident
        self._stop = threading.Event()

    def run(self) -> None:
        last = written = time.perf_counter()
        while not self._stop.wait(self.interval):
            now = time.perf_counter()
            frame = sys._current_frames().get(self._main)
            category = classify(_stack(frame)) if frame is not None else None
            if category is not None:
                self.seconds[category] += now - last
                self.samples += 1
            last = now
            if now - written > WRITE_EVERY_S:
                self.write()
                written = now

    def write(self) -> None:
        record = {"interval_s": self.interval, "samples": self.samples, "seconds": {k: round(v, 2) for k, v in self.seconds.items()}}
        fd, tmp = tempfile.mkstemp(dir=self.out.parent, prefix=f".{self.out.name}.")
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, self.out)

    def stop(self) -> None:
        self._stop.set()
        self.write()


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[0] != "--out":
        raise SystemExit("usage: time_shares.py --out OUT.json MODULE [ARGS...]")
    out, module, rest = Path(args[1]), args[2], args[3:]
    # As under `python -m MODULE`: the working directory first on the path, not this
    # script's folder (whose module names, such as stats, would shadow others).
    sys.path[0] = os.getcwd()
    sampler = Sampler(out)
    sampler.start()
    atexit.register(sampler.stop)
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
