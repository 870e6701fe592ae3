"""The whole book's cost, per chapter, from the stamps of the last build.

    make book && python benchmarks/book.py            # the default model's chapters
    python benchmarks/book.py --root /path/to/clone   # another checkout's build
    python benchmarks/book.py --reference             # also the kept reference and robustness runs

Prints one table: wall time, the kernel's CPU time and peak resident memory, and the
share of the kernel's busy time spent in the model's forward passes, lens readouts,
tuned-lens training, statistics and everything else (depthkit/time_shares.py samples
the kernel's stack every 10 ms while a cell runs; "unsampled" is wall time outside
any cell: kernel start, papermill, writing the page). Then the CPU it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from depthkit.book.reference import cpu_name

CATEGORIES = ("model forward", "lens readout", "lens training", "statistics", "other")
HEAD = ["chapter", "model", "wall", "CPU", "peak RSS", "forward", "readout", "training", "stats", "other", "unsampled"]


def _flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "?"
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    kind = "AMX" if "amx_bf16" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "other"
    return kind + (" + bf16 dot products" if "avx512_bf16" in flags else "")


def _row(stamp: dict, model: str) -> list[str]:
    wall = float(stamp.get("elapsed_s") or 0)
    cpu, rss, shares = stamp.get("cpu_s"), stamp.get("peak_rss_mb"), stamp.get("time_s")
    cells = [stamp.get("chapter", "?"), model, f"{wall:.0f} s", f"{cpu:.0f} s" if cpu else "—", f"{rss / 1000:.1f} GB" if rss else "—"]
    if shares:
        busy = sum(shares.values())
        cells += [f"{100 * shares[c] / wall:.0f} %" for c in CATEGORIES] + [f"{100 * max(wall - busy, 0) / wall:.0f} %"]
    else:
        cells += ["not sampled"] + [""] * len(CATEGORIES)
    return cells


def stamps(root: Path, reference: bool) -> list[tuple[dict, str]]:
    out = []
    for path in sorted((root / "book" / "chapters").glob("*.stamp.json")):
        stamp = json.loads(path.read_text())
        out.append((stamp, stamp.get("params", {}).get("model", "default")))
    if reference:
        for path in sorted((root / "reference").glob("*/*/stamp.json")):
            out.append((json.loads(path.read_text()), path.parent.parent.name + " (reference)"))
        for path in sorted((root / "reference" / "_robustness").glob("*/*/*/stamp.json")):
            out.append((json.loads(path.read_text()), f"{path.parent.parent.name} ({path.parent.parent.parent.name}, reference)"))
    return out


def table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--reference", action="store_true", help="also the reference runs kept in the repository")
    args = parser.parse_args()
    found = stamps(args.root, args.reference)
    if not found:
        raise SystemExit(f"No chapter stamps under {args.root / 'book' / 'chapters'}: build the book first (make book).")
    rows = [_row(s, m) for s, m in found]
    built = [s for s, model in found if not model.endswith("reference)")]
    wall, cpu = sum(float(s.get("elapsed_s") or 0) for s in built), sum(float(s.get("cpu_s") or 0) for s in built)
    rows.append(["all chapters", "", f"{wall / 60:.1f} min", f"{cpu / 60:.1f} min", "", *[""] * 6])
    print(table(rows))
    print(f"\nCPU: {cpu_name()} ({_flags()}), {os.cpu_count()} logical cores; percentages are of each chapter's wall time.")


if __name__ == "__main__":
    main()
