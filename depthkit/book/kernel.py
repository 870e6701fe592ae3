"""The kernel a chapter runs in: a kernelspec of this very interpreter, registered
for the duration of one run, and what the kernel measured about itself (peak
memory, CPU time, where its time went) once it exited.

The kernel runs under depthkit/tether.py, so it stops when the runner does, and,
with a shares file, under depthkit/time_shares.py; both are run by file path.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from depthkit.book import tether, time_shares
from depthkit.core.files import atomic_write

__all__ = ["KERNEL_NAME"]

KERNEL_NAME = "depthkit-python"


@contextlib.contextmanager
def _kernel_of_this_interpreter(work_dir: Path, peak_file: Path | None = None, shares_file: Path | None = None) -> Iterator[str]:
    """Register, for the duration of the block, a kernelspec that starts
    ``sys.executable``: papermill then runs chapters in this very environment
    whatever kernels the user has installed. The kernel runs under
    depthkit/tether.py, so it stops when the runner does, however the runner is
    stopped; with ``peak_file`` the tether writes the kernel's peak resident memory
    and CPU time there when it exits; with ``shares_file`` depthkit/time_shares.py
    writes there where the kernel's time went."""
    spec_dir = Path(work_dir) / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    launch = [str(time_shares.SCRIPT), "--out", str(shares_file), "ipykernel_launcher"] if shares_file else ["-m", "ipykernel_launcher"]
    spec = {
        # The kernel's own log (e.g. a notice about TCP transport) is noise in a build.
        "argv": [
            sys.executable, str(tether.SCRIPT), *(["--usage", str(peak_file)] if peak_file else []), "--",
            sys.executable, *launch, "-f", "{connection_file}", "--IPKernelApp.log_level=ERROR",
        ],  # fmt: skip
        "display_name": "Python (depthkit)",
        "language": "python",
        "env": {"PYDEVD_DISABLE_FILE_VALIDATION": "1"},
    }
    atomic_write(spec_dir / "kernel.json", json.dumps(spec, indent=1))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(Path(work_dir) / "jupyter"), *([old] if old else [])])
    try:
        yield KERNEL_NAME
    finally:
        if old is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = old



def _kernel_usage(path: Path) -> dict[str, float | None]:
    """The kernel's peak resident memory (MB) and CPU time (s), as
    depthkit/tether.py wrote them when the kernel exited (None where it could
    not: a kernel killed at shutdown)."""
    try:
        usage = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        usage = {}
    finally:
        Path(path).unlink(missing_ok=True)
    return {k: float(usage[k]) if isinstance(usage.get(k), (int, float)) else None for k in ("peak_rss_mb", "cpu_s")}


def _time_shares(path: Path) -> dict[str, float] | None:
    """Seconds of the kernel's busy time per category (depthkit/time_shares.py), or
    None where the sampler wrote nothing."""
    try:
        seconds = json.loads(Path(path).read_text(encoding="utf-8"))["seconds"]
        return {k: float(seconds[k]) for k in time_shares.CATEGORIES}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        Path(path).unlink(missing_ok=True)

