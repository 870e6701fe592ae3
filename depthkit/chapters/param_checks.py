"""Checking a chapter's parameter values before anything runs: the spec, the lens
choice and the checks across parameters, and for a command line also unknown names
(with "did you mean") and the notebook's defaults."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from depthkit.chapters.specs import Chapter, notebook_defaults
from depthkit.core.params import ParameterError, check_params, rerun_hint


def _lens_choice(ch: Chapter, p: dict[str, Any]) -> str | None:
    """``lens`` is a kind or an existing lens file; a budget is a name or valid
    TrainConfig fields (checked by the config itself, which imports torch only when
    a budget other than the two names is given)."""
    from depthkit.lens.registry import is_lens_path, kind_names

    lens = p.get("lens")
    if lens is not None and lens not in kind_names():
        if not is_lens_path(str(lens)):
            kinds = ", ".join(repr(k) for k in kind_names())
            return (f"lens={lens!r}: choose {kinds} or the path of a saved lens file (.safetensors). "
                    f"Re-run with e.g. `depthkit run {ch.id} -p lens=tuned`.")
        if not Path(str(lens)).expanduser().with_suffix(".safetensors").is_file():
            return (f"lens={lens!r}: no such lens file. Save one with depthkit.lens.save_lens, or re-run with "
                    f"e.g. `depthkit run {ch.id} -p lens=tuned`.")
    for key in ("lens_budget", "bias_budget"):
        budget = p.get(key)
        if budget is None or budget in ("default", "smoke"):
            continue
        from depthkit.lens.training_data import resolve_config

        try:
            resolve_config(budget)
        except (TypeError, ValueError) as err:
            return f"{key}={budget!r}: {err} Re-run with e.g. `depthkit run {ch.id} -p {key}=steps=200`."
    return None


def _check(ch: Chapter, values: Mapping[str, Any]) -> dict[str, Any]:
    values = dict(values)
    if isinstance(values.get("remote"), bool):
        # `-p remote=true` reads as YAML's true; the parameter also takes 'local'.
        values["remote"] = str(values["remote"]).lower()
    p = check_params(values, chapter=ch.id, **ch.params)
    if p.get("remote") in ("true", "local") and p.get("backend") != "nnsight":
        raise ParameterError(
            f"remote={p['remote']!r} runs through nnsight: add -p backend=nnsight (or --backend nnsight)."
        )
    problem = _lens_choice(ch, p)
    if problem:
        raise ParameterError(problem)
    for check in ch.checks:
        problem = check(p)
        if problem:
            raise ParameterError(problem)
    return p


def validate_run(ch: Chapter, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``overrides`` of a chapter run before anything runs: unknown names (with
    "did you mean"), then every value, the notebook's defaults filling the rest.
    Returns the overrides, converted to their declared types."""
    unknown = [k for k in overrides if k not in ch.params]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, list(ch.params), n=1)
        guess = f" Did you mean {close[0]!r}?" if close else ""
        example = ""
        if close:
            param = ch.params[close[0]]
            try:
                suggest = check_params({close[0]: overrides[name]}, **{close[0]: param})[close[0]]
            except ParameterError:
                suggest = None  # the value does not fit the likely name either: show a valid one
            example = rerun_hint(close[0], param, ch.id, suggest)
        raise ParameterError(
            f"Chapter {ch.id} has no parameter {name!r}.{guess} It takes: {', '.join(ch.params)}." + (f" {example}" if example else "")
        )
    merged = {**notebook_defaults(ch), **overrides}
    checked = _check(ch, merged)
    return {k: checked[k] for k in overrides}
