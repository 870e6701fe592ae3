"""Start a Jupyter kernel as a child process and, when it exits, write its peak
resident memory and CPU time to a file: ``python kernel_peak.py OUT.json -- <kernel argv>``.

The book runner (:mod:`depthkit.book`) puts this script in front of the kernel's
command line, so a chapter's peak memory is measured for exactly the process that
executed its cells. The number is the kernel's own high-water mark (``ru_maxrss``
from ``wait4``, the VmHWM the kernel reached before exiting), which a sampling
monitor could miss and which ``getrusage(RUSAGE_CHILDREN)`` in the runner would mix
up across chapters (that one is the maximum over every child ever waited for).
The CPU time (user + system, all threads) is what the run cost whatever else the
machine was doing, where the wall time also counts the waits for a busy CPU.

Run by file path, not ``-m depthkit...``: importing the package would load torch in
this small parent process for nothing. Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path


def peak_mb(maxrss: int, platform: str = sys.platform) -> float:
    """``ru_maxrss`` in MB (10^6 bytes): Linux reports kilobytes, macOS bytes."""
    return round(maxrss / 1e6 if platform == "darwin" else maxrss * 1024 / 1e6, 1)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: kernel_peak.py OUT.json -- KERNEL_COMMAND...", file=sys.stderr)
        return 2
    out, command = Path(argv[0]), argv[2:]
    child = subprocess.Popen(command)
    # jupyter_client signals the kernel's whole process group (this process and the
    # kernel): an interrupt is the kernel's to handle, this process only waits.
    # A terminate is passed on in case it reached this process alone.
    signal.signal(signal.SIGINT, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda signum, _: child.send_signal(signum))
    while True:
        try:
            _, status, usage = os.wait4(child.pid, 0)
            break
        except InterruptedError:  # pragma: no cover - retried by Python itself since 3.5
            continue
    child.returncode = os.waitstatus_to_exitcode(status)
    tmp = out.with_name(out.name + ".tmp")
    cpu_s = round(usage.ru_utime + usage.ru_stime, 1)
    tmp.write_text(json.dumps({"peak_rss_mb": peak_mb(usage.ru_maxrss), "cpu_s": cpu_s}), encoding="utf-8")
    tmp.replace(out)
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
