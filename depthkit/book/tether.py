"""Run a command as a child that cannot outlive the process that started it:
``python tether.py [--usage OUT.json] -- COMMAND...``.

The book runner starts every long-lived child through this script: each chapter's
kernel (as the kernelspec's command line) and ``jupyter-book build``. A runner
stopped by a signal, including one it cannot catch (SIGKILL), must leave nothing
behind: without a tether a kernel whose runner died was reparented to init and went
on computing at full CPU, because ipykernel only exits by itself when its parent
goes, and its parent was a wrapper that stayed alive waiting for it.

What it does:

* the command runs in a session (and process group) of its own, so the tether can
  stop everything the command started, grandchildren included, with one signal;
* SIGINT, SIGTERM and SIGHUP sent to the tether are passed on to that group
  (jupyter_client interrupts a kernel by signalling the tether's group);
* every :data:`POLL_S` seconds it checks whether the process that started it is
  still its parent; when not, it stops the group (SIGTERM, then SIGKILL after
  :data:`GRACE_S` seconds) and exits;
* the child is told the tether's pid as ``JPY_PARENT_PID``, so an ipykernel also
  exits by itself if the tether is killed outright;
* with ``--usage``, when the command exits it writes the command's peak resident
  memory and CPU time (``ru_maxrss`` and user + system time from ``wait4``: the
  child's own high-water mark, which a sampling monitor could miss) to OUT.json.

Run by file path, not ``-m depthkit...``: importing the package would load torch in
this small process for nothing. Standard library only, so the runner can also
import :func:`run` from it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

SCRIPT = Path(__file__).resolve()
POLL_S = 0.2
GRACE_S = 3.0
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def peak_mb(maxrss: int, platform: str = sys.platform) -> float:
    """``ru_maxrss`` in MB (10^6 bytes): Linux reports kilobytes, macOS bytes."""
    return round(maxrss / 1e6 if platform == "darwin" else maxrss * 1024 / 1e6, 1)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(pid: int, timeout: float) -> tuple[int, object] | None:
    """(wait status, rusage) of ``pid`` once it exits, or None after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(POLL_S, max(deadline - time.monotonic(), 0.0)))


def _stop_group(pid: int) -> tuple[int, object]:
    """SIGTERM the child's group, SIGKILL what is left after the grace period."""
    _signal_group(pid, signal.SIGTERM)
    reaped = _reap(pid, GRACE_S)
    _signal_group(pid, signal.SIGKILL)
    return reaped if reaped is not None else os.wait4(pid, 0)[1:]


def _write_usage(out: Path, usage: object) -> None:
    record = {
        "peak_rss_mb": peak_mb(usage.ru_maxrss),  # type: ignore[attr-defined]
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),  # type: ignore[attr-defined]
    }
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(record), encoding="utf-8")
    tmp.replace(out)


def tether(command: Sequence[str], usage_file: Path | None = None) -> int:
    """Run ``command`` tethered to this process's parent; returns its exit code
    (128 + N for a command killed by signal N)."""
    parent = os.getppid()
    env = {**os.environ, "JPY_PARENT_PID": str(os.getpid())}
    child = subprocess.Popen(list(command), env=env, start_new_session=True)
    for signum in FORWARDED:
        signal.signal(signum, lambda s, _: _signal_group(child.pid, s))
    while True:
        reaped = _reap(child.pid, POLL_S)
        if reaped is not None:
            break
        if os.getppid() != parent:
            reaped = _stop_group(child.pid)
            break
    status, usage = reaped
    # Whatever the command left running in its group goes with it.
    _signal_group(child.pid, signal.SIGKILL)
    if usage_file is not None:
        _write_usage(usage_file, usage)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def run(command: Sequence[str], *, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, capture_output=True, text=True)`` through a tether:
    the command stops when this process is stopped, by any signal, even SIGKILL."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--", *command],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate()
    except BaseException:
        # Interrupted (Ctrl-C, or a stop signal the CLI turned into an exception):
        # the tether passes SIGTERM on to the command's group and waits for it.
        proc.terminate()
        try:
            proc.wait(timeout=GRACE_S + 2)
        except subprocess.TimeoutExpired:
            proc.kill()  # the command then sees its parent gone and is stopped too
            proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def main(argv: list[str]) -> int:
    usage_file = None
    if len(argv) >= 2 and argv[0] == "--usage":
        usage_file, argv = Path(argv[1]), argv[2:]
    if len(argv) < 2 or argv[0] != "--":
        print("usage: tether.py [--usage OUT.json] -- COMMAND...", file=sys.stderr)
        return 2
    return tether(argv[1:], usage_file)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
