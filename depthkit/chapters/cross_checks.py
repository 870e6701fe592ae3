"""Checks across several parameters of one chapter, each returning None or what is
wrong with a re-run hint: the parameter spec checks each value alone, these check
how the values fit together."""

from __future__ import annotations

import difflib
from typing import Any

from depthkit.chapters.param_sets import MCQ_TASKS


def _patch_tasks(p: dict[str, Any]) -> str | None:
    """Patching reads two distinct tasks, each embedded or the user's ``dataset``
    (named after its file)."""
    from depthkit.data.user_files import file_set_name

    own = file_set_name(p["dataset"], MCQ_TASKS) if p.get("dataset") else None
    known = (*MCQ_TASKS, *([own] if own else []))
    for key in ("patch_source", "patch_target", "patch_control"):
        if p[key] not in known:
            close = difflib.get_close_matches(str(p[key]), known, n=1)
            yours = f"{own!r} (your dataset) or " if own else ""
            return (
                f"{key}={p[key]!r} is not a task here{f'; did you mean {close[0]!r}?' if close else ''} Choose "
                f"{yours}one of {', '.join(MCQ_TASKS)}"
                + ("" if own else "; a file of your own is patched after `-p dataset=PATH`, under the file's name")
                + f". Re-run with e.g. `depthkit run 02 -p {key}={own or 'mmlu'}`."
            )
    if p["patch_source"] == p["patch_target"]:
        return (
            f"patch_source and patch_target are both {p['patch_source']!r}; patching needs two tasks. "
            "Re-run with e.g. `depthkit run 02 -p patch_source=sst2 -p patch_target=mmlu`."
        )
    return None


def _k_grid_has_one(p: dict[str, Any]) -> str | None:
    if min(p["k_grid"]) < 1 or 1 not in p["k_grid"]:
        return (
            f"k_grid must hold positive integers including 1 (the headline), got {p['k_grid']}. "
            "Re-run with e.g. `depthkit run 03 -p k_grid=[1,10,100]`."
        )
    return None
