"""What the runner adds to the book's pages from its own measurements: the box at
the top of each executed chapter (what the chapter asks, the wall time and peak
memory of the run that produced the page, its key parameters) and the table of
every chapter's run that the teaching page includes.

Both are written from the chapter's stamp (:mod:`depthkit.book.runner`), which the runner
fills right after the kernel exits: the box goes into the executed notebook itself,
so a warm rebuild, which reuses the notebook, shows the numbers of the run that made
it; the table is rewritten at every build from the stamps of the chapters in it.
Neither names a path of this machine or its load.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from depthkit.core.files import atomic_write

BOX_TAG = "depthkit-run-box"
# Relative to book/: teaching.md includes it with {include} _generated/chapter_runs.md.
RUN_TABLE = Path("_generated") / "chapter_runs.md"


def machine() -> dict[str, Any]:
    """What the stamp records about the machine: its CPU count only (no host name,
    no paths, no load)."""
    return {"cpus": os.cpu_count()}


def memory(mb: float | None) -> str:
    if mb is None:
        return "not recorded"
    return f"{mb / 1000:.1f} GB" if mb >= 1000 else f"{mb:.0f} MB"


def duration(seconds: float) -> str:
    """Seconds as the runner prints them: "12.3 s" below two minutes, else "4 min 5 s"."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60} s"


def _duration(seconds: float | None) -> str:
    return "not recorded" if seconds is None else duration(float(seconds))


def _cpu(stamp: Mapping[str, Any]) -> str:
    cpu = stamp.get("cpu_s")
    return "" if cpu is None else f" ({_duration(cpu)} of CPU time)"


def _value(v: Any) -> str:
    # As a notebook's parameters cell writes it: strings and lists in JSON, None as None.
    return "None" if v is None else json.dumps(v, ensure_ascii=False) if isinstance(v, (str, list)) else str(v)


def _defaults(chapter: Any) -> dict[str, Any]:
    from depthkit.chapters import notebook_defaults

    try:
        return notebook_defaults(chapter)
    except (OSError, ValueError, SyntaxError):
        return {}


def key_parameters(chapter: Any, params: Mapping[str, Any]) -> list[tuple[str, Any, bool]]:
    """(name, value it ran with, whether that differs from the notebook's default) of
    the chapter's key parameters (all of its set parameters if it names none)."""
    defaults = _defaults(chapter)
    names = list(getattr(chapter, "key_params", ()) or [k for k in params if k != "results_root"])
    out = []
    for name in names:
        value = params.get(name, defaults.get(name))
        out.append((name, value, name in params and name in defaults and params[name] != defaults[name]))
    return out


def run_box(chapter: Any, stamp: Mapping[str, Any]) -> str:
    """The MyST admonition at the top of a chapter's page, from its stamp."""
    params = stamp.get("params", {})
    keys = key_parameters(chapter, params)
    shown = ", ".join(f"`{k} = {_value(v)}`" + ("\\*" if changed else "") for k, v, changed in keys)
    changed = any(c for _, _, c in keys)
    where = f"`{params['model']}`" if params.get("model") else "the saved results of the other chapters"
    cpus = stamp.get("cpus")
    lines = [
        ":::{admonition} This chapter at a glance",
        ":class: note",
        "",
    ]
    asks = getattr(chapter, "asks", "")
    if asks:
        lines += [f"**It asks:** {asks}", ""]
    lines += [
        f"**This page** is the output of one run on {where}: {_duration(stamp.get('elapsed_s'))} of wall "
        f"time{_cpu(stamp)}, peak memory {memory(stamp.get('peak_rss_mb'))} (the resident memory of the kernel that executed "
        f"the notebook){f', on a machine with {cpus} CPU cores' if cpus else ''}; finished "
        f"{str(stamp.get('finished', ''))[:10]}.",
        "",
        f"**Key parameters:** {shown}."
        + (" \\* differs from the notebook's default (for example in a smoke build)." if changed else "")
        + f" Change them in the notebook's parameters cell, or e.g. `depthkit run {chapter.id} {_hint(keys)}`."
        if keys
        else "",
        ":::",
    ]
    return "\n".join(lines)


def _hint(keys: Sequence[tuple[str, Any, bool]]) -> str:
    name = next((k for k, _, _ in keys if k != "model"), None)
    return f"-p {name}=..." if name else "--model NAME"


def insert_run_box(nb: Any, text: str) -> Any:
    """Put ``text`` in its own markdown cell right under the page title (splitting the
    title line off the first markdown cell), replacing an earlier box."""
    import nbformat

    nb.cells = [c for c in nb.cells if BOX_TAG not in c.get("metadata", {}).get("tags", [])]
    box = nbformat.v4.new_markdown_cell(text, metadata={"tags": [BOX_TAG]})
    first = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"), None)
    if first is None:
        nb.cells.insert(0, box)
        return nb
    title, _, rest = nb.cells[first].source.partition("\n")
    if not title.startswith("# "):
        nb.cells.insert(first, box)
        return nb
    nb.cells[first].source = title
    after = [box] + ([nbformat.v4.new_markdown_cell(rest.lstrip("\n"))] if rest.strip() else [])
    nb.cells[first + 1 : first + 1] = after
    return nb


def run_table(rows: Sequence[tuple[Any, Mapping[str, Any] | None]]) -> str:
    """Markdown table of (chapter, stamp or None) pairs: model, wall time, peak
    memory and the key parameters that differ from the notebooks' defaults."""
    out = [
        "| chapter | model | wall time | CPU time | peak memory | parameters changed from the notebook |",
        "|---|---|---|---|---|---|",
    ]
    cpus: set[Any] = set()
    for chapter, stamp in rows:
        if not stamp:
            out.append(f"| {chapter.id} {chapter.title} | — | not executed in this build | — | — | — |")
            continue
        params = stamp.get("params", {})
        cpus.add(stamp.get("cpus"))
        changed = [f"`{k}={_value(v)}`" for k, v, c in key_parameters(chapter, params) if c and k != "model"] or ["none (defaults)"]
        out.append(
            f"| {chapter.id} {chapter.title} | `{params.get('model', '(saved results)')}` | "
            f"{_duration(stamp.get('elapsed_s'))} | {_duration(stamp.get('cpu_s'))} | {memory(stamp.get('peak_rss_mb'))} | "
            f"{', '.join(changed)} |"
        )
    known = sorted(c for c in cpus if c)
    machine_note = (
        f"Measured by the runner on a machine with {', '.join(map(str, known))} CPU cores"
        if known
        else "Measured by the runner"
    )
    return (
        "\n".join(out)
        + f"\n\n{machine_note}: wall time of executing the notebook (kernel start included), CPU time of the "
        "kernel process (user and system, all threads: on an otherwise idle machine of n cores the wall time is at "
        "least the CPU time divided by n), its peak resident memory. Chapters read lenses and frequency tables from the cache when an earlier run "
        "made them (chapter 00 trains the tuned lens the others use), so their times depend on the order they ran in.\n"
    )


def write_run_table(book_dir: Path, rows: Sequence[tuple[Any, Mapping[str, Any] | None]]) -> Path:
    target = Path(book_dir) / RUN_TABLE
    text = run_table(rows)
    # An unchanged file keeps its timestamp, so Sphinx's incremental build holds.
    if not target.is_file() or target.read_text(encoding="utf-8") != text:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, text)
    return target
