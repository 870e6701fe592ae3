"""Checking a chapter's parameters before anything runs.

Every chapter notebook calls :func:`check_params` in the cell after its parameters
cell, so a typo or an out-of-range value stops the run at once with a message that
names the parameter, what was wrong, and how to re-run::

    p = dk.check_params(
        dict(model=model, n_prompts=n_prompts, lens=lens),
        chapter="01",
        model=Param(str),
        n_prompts=Param(int, min=1),
        lens=Param(str, choices=("tuned", "logit")),
    )
"""

from __future__ import annotations

import difflib
import math
import numbers
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml

__all__ = ["Param", "ParameterError", "check_params", "rerun_hint"]


class ParameterError(ValueError):
    """A chapter parameter has a wrong type, value, or name."""


_TYPES = (int, float, str, bool, list)
_NOUN = {int: "an integer", float: "a number", str: "a string", bool: "True or False", list: "a list"}


@dataclass(frozen=True)
class Param:
    """What one parameter may be.

    ``type``: int, float, str, bool, or list (then ``item`` is the type of its
    elements, default str). ``choices``: allowed values (for a list: allowed
    elements). ``min``/``max``: inclusive bounds (for a list: its length).
    ``optional``: None is allowed. ``help``: what the parameter means, shown in
    errors. ``example``: a valid value to show in errors (default: derived).
    """

    type: type
    choices: Sequence[Any] | None = None
    min: float | None = None
    max: float | None = None
    optional: bool = False
    help: str = ""
    item: type | None = None
    example: Any = None

    def __post_init__(self) -> None:
        if self.type not in _TYPES:
            raise TypeError(f"Param type must be one of int, float, str, bool, list; got {self.type!r}.")
        if self.item is not None and self.type is not list:
            raise TypeError("Param(item=...) only applies to Param(list, ...).")
        if self.type is list and self.item is None:
            object.__setattr__(self, "item", str)
        if self.item is not None and self.item not in (int, float, str, bool):
            raise TypeError(f"Param(list, item=...) takes int, float, str or bool, got {self.item!r}.")
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(self.choices))
            if not self.choices:
                raise ValueError("Param(choices=...) must name at least one value.")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"Param(min={self.min}, max={self.max}): min exceeds max.")

    # What a valid value looks like, for messages.
    def describe(self) -> str:
        if self.type is list:
            noun = "True/False values" if self.item is bool else _NOUN[self.item].split(" ", 1)[1] + "s"
            what = f"a list of {noun}"
            if self.choices is not None:
                what += f" from {_show_choices(self.choices)}"
            bounds = _bounds(
                self.min or None, self.max, "with at least {lo} items", "with at most {hi} items", "with {lo} to {hi} items"
            )
            what = f"{what} {bounds}".strip()
        elif self.choices is not None:
            what = f"one of {_show_choices(self.choices)}"
        elif self.type in (int, float):
            what = f"{_NOUN[self.type]} {_bounds(self.min, self.max, '>= {lo}', '<= {hi}', 'between {lo} and {hi}')}".strip()
        elif self.type is str and self.min is not None:
            what = f"a string of at least {_num(self.min)} characters"
        else:
            what = _NOUN[self.type]
        return what + (" (or None)" if self.optional else "")

    def example_value(self) -> Any:
        if self.example is not None:
            return self.example
        if self.type is list:
            pool = (
                list(self.choices)
                if self.choices is not None
                else {str: ["a", "b"], int: [1, 2], float: [0.5, 1.0], bool: [True, False]}[self.item]
            )
            size = int(self.min) if self.min is not None else min(2, len(pool))
            return pool[: max(size, 1)]
        if self.choices is not None:
            return self.choices[0]
        if self.type is bool:
            return True
        if self.type is str:
            return "text"
        if self.min is not None:
            return int(math.ceil(self.min)) if self.type is int else float(self.min)
        if self.max is not None:
            return int(math.floor(self.max)) if self.type is int else float(self.max)
        return 1 if self.type is int else 0.5


def _bounds(lo: float | None, hi: float | None, only_lo: str, only_hi: str, both: str) -> str:
    if lo is not None and hi is not None:
        return both.format(lo=_num(lo), hi=_num(hi))
    if lo is not None:
        return only_lo.format(lo=_num(lo))
    if hi is not None:
        return only_hi.format(hi=_num(hi))
    return ""


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _show_choices(choices: Sequence[Any]) -> str:
    return ", ".join(repr(c) for c in choices)


def rerun_hint(name: str, param: Param, chapter: str | None, suggest: Any = None) -> str:
    """A re-run command with a valid value for ``name``, written so that it parses:
    ``depthkit run 01 -p n_prompts=200`` (the value as YAML, shell-quoted)."""
    run = f"depthkit run {chapter}" if chapter else "depthkit run <chapter>"
    value = param.example_value() if suggest is None else suggest
    rendered = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    rendered = rendered.removesuffix("\n...").removesuffix("...").strip()
    arg = f"{name}={rendered}"
    # YAML quotes strings like 'yes' with single quotes; double quotes read better then.
    quoted = f'"{arg}"' if "'" in arg and not set(arg) & set('"$`\\!') else shlex.quote(arg)
    hint = f"Re-run with a valid value, e.g. `{run} -p {quoted}`"
    if not chapter:
        hint += " (or papermill's `-p` option)"
    return hint + "."


def _type_name(value: Any) -> str:
    return type(value).__name__


class _Invalid(Exception):
    """Internal: the reason a value does not fit, without the how-to-fix part, and
    the value the user most likely meant (shown in the re-run command)."""

    def __init__(self, reason: str = "", suggest: Any = None) -> None:
        super().__init__(reason)
        self.suggest = suggest


def _scalar(value: Any, kind: type) -> Any:
    """``value`` converted to ``kind`` if it is one, else _Invalid with a hint."""
    if kind is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in {"true", "false"}:
            meant = value.strip().lower() == "true"
            raise _Invalid(f"write {meant} without quotes", meant)
        raise _Invalid("")
    if isinstance(value, (bool, np.bool_)):
        # bool is a subclass of int in Python, but True is no count of anything.
        raise _Invalid("True/False is not a number here")
    if kind is int:
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, numbers.Real) and math.isfinite(float(value)) and float(value).is_integer():
            raise _Invalid(f"write {int(value)}, not {value!r}: an integer is required", int(value))
        if isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value):
            raise _Invalid(f"write {value.strip()} without quotes", int(value))
        raise _Invalid("")
    if kind is float:
        if isinstance(value, numbers.Real):
            value = float(value)
            if not math.isfinite(value):
                raise _Invalid("it must be finite")
            return value
        if isinstance(value, str):
            try:
                float(value)
            except ValueError:
                pass
            else:
                raise _Invalid(f"write {value.strip()} without quotes", float(value))
        raise _Invalid("")
    if isinstance(value, str):
        return value
    raise _Invalid("")


def _check_one(name: str, value: Any, param: Param) -> Any:
    if value is None:
        if param.optional:
            return None
        raise _Invalid("it is required")
    if param.type is list:
        if isinstance(value, str):
            # The command line passes lists as comma-separated text.
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, (list, tuple, np.ndarray)):
            raise _Invalid("")
        items = []
        for i, element in enumerate(value):
            try:
                items.append(_scalar(element, param.item))
            except _Invalid as e:
                detail = f"; {e}" if str(e) else ""
                raise _Invalid(f"element {i} is {element!r} ({_type_name(element)}){detail}") from None
            if param.choices is not None and items[-1] not in param.choices:
                raise _Invalid(f"element {i} {element!r} is not allowed{_close(element, param.choices)}")
        if param.min is not None and len(items) < param.min:
            raise _Invalid(f"it has {len(items)} items")
        if param.max is not None and len(items) > param.max:
            raise _Invalid(f"it has {len(items)} items")
        return items
    converted = _scalar(value, param.type)
    if param.choices is not None:
        if converted not in param.choices:
            close = _close(converted, param.choices)
            raise _Invalid(close.removeprefix("; "), close.split("'")[1] if close else None)
        return converted
    if param.type in (int, float):
        if param.min is not None and converted < param.min:
            raise _Invalid("out of range", None if param.example is not None else param.example_value())
        if param.max is not None and converted > param.max:
            bound = int(math.floor(param.max)) if param.type is int else float(param.max)
            raise _Invalid("out of range", None if param.example is not None else bound)
    elif param.type is str and param.min is not None and len(converted) < param.min:
        raise _Invalid(f"it has {len(converted)} characters")
    return converted


def _close(value: Any, choices: Sequence[Any]) -> str:
    strings = [c for c in choices if isinstance(c, str)]
    close = difflib.get_close_matches(str(value), strings, n=1) if strings else []
    return f"; did you mean {close[0]!r}?" if close else ""


def check_params(values: Mapping[str, Any], /, *, chapter: str | Param | None = None, **spec: Param) -> dict[str, Any]:
    """Validate ``values`` (parameter name -> value) against ``spec`` (name -> Param).

    Returns the values converted to their declared types (ints given for floats
    become floats, tuples become lists, a comma-separated string becomes a list),
    in the order of ``spec``. Raises :class:`ParameterError` for a value of the wrong
    type or range, a missing required parameter, and a name not in ``spec`` (a typo).
    ``chapter`` (e.g. "01") is only used to write the re-run command in messages; a
    parameter that is itself called "chapter" is declared by passing a Param.

    >>> import depthkit as dk
    >>> dk.check_params({"n": 12, "ks": (1, 10)}, chapter="01", n=dk.Param(int, min=1), ks=dk.Param(list, item=int))
    {'n': 12, 'ks': [1, 10]}
    >>> dk.check_params({"n": 0}, chapter="01", n=dk.Param(int, min=1))
    Traceback (most recent call last):
    depthkit.core.params.ParameterError: n must be an integer >= 1, got 0 (int). Re-run with a valid value, e.g. `depthkit run 01 -p n=1`.
    """
    if isinstance(chapter, Param):
        spec = {"chapter": chapter, **spec}
        chapter = None
    if chapter is not None:
        chapter = str(chapter).split("_", 1)[0]
    for name, param in spec.items():
        if not isinstance(param, Param):
            raise TypeError(f"check_params: the spec of {name!r} must be a Param, got {param!r}.")
    if not isinstance(values, Mapping):
        raise TypeError(f"check_params: values must be a dict of parameter name -> value, got {type(values).__name__}.")

    unknown = [k for k in values if k not in spec]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(str(name), list(spec), n=1)
        guess = f" Did you mean {close[0]!r}?" if close else ""
        raise ParameterError(
            f"Unknown parameter {name!r} (value {values[name]!r}).{guess} This chapter takes: {', '.join(spec)}. "
            "Fix the name in your `-p` options or parameters cell."
        )

    checked: dict[str, Any] = {}
    for name, param in spec.items():
        if name not in values and not param.optional:
            raise ParameterError(
                f"Parameter {name!r} is missing; it must be {param.describe()}. {rerun_hint(name, param, chapter)}"
            )
        value = values.get(name)
        try:
            checked[name] = _check_one(name, value, param)
        except _Invalid as e:
            reason = f" ({e})" if str(e) and str(e) != "out of range" else ""
            about = f" ({param.help})" if param.help else ""
            raise ParameterError(
                f"{name}{about} must be {param.describe()}, got {value!r} ({_type_name(value)}){reason}. "
                f"{rerun_hint(name, param, chapter, e.suggest)}"
            ) from None
    return checked
