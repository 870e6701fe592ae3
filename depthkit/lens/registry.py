"""The one front door for lenses: :func:`get_lens` returns a lens for a model by kind
name, file path or lens object, and the registry of lens kinds it looks names up in.

Each kind is one file in :mod:`depthkit.lens.kinds` that defines ``KIND``, a
:class:`LensKind`; the registry finds them by listing that folder, so adding a
lens kind is one new file and no edit here or anywhere else.

>>> from depthkit.lens.registry import kind_names
>>> kind_names()
('logit', 'tuned')
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from depthkit.lens.base import DEFAULT_LENS, Lens

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

__all__ = ["LensKind", "get_lens", "is_lens_path", "kind_names", "lens_kind"]

LENS_FILE_SUFFIXES = (".safetensors", ".json")


@dataclass(frozen=True)
class LensKind:
    """A kind of lens, as one file in :mod:`depthkit.lens.kinds` declares it.

    ``load(model, **options)`` returns the lens without training anything (it may
    read a saved file and raise saying how to make it); ``make(model, **options)``
    may train. A kind that never trains leaves ``make`` unset."""

    name: str
    summary: str
    load: Callable[..., Lens]
    make: Callable[..., Lens] | None = None

    @property
    def trains(self) -> bool:
        return self.make is not None


@functools.cache
def _kinds() -> dict[str, LensKind]:
    import depthkit.lens.kinds as package

    found: dict[str, LensKind] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        kind = getattr(importlib.import_module(f"{package.__name__}.{info.name}"), "KIND", None)
        if not isinstance(kind, LensKind):
            raise TypeError(f"depthkit/lens/kinds/{info.name}.py must define KIND = LensKind(...).")
        if kind.name in found:
            raise ValueError(f"Two lens kinds are named {kind.name!r}; rename one.")
        found[kind.name] = kind
    return found


def kind_names() -> tuple[str, ...]:
    """The names of every lens kind, sorted."""
    return tuple(sorted(_kinds()))


def lens_kind(name: str) -> LensKind:
    """The registered kind ``name``, or a clear error listing the kinds."""
    kinds = _kinds()
    if name not in kinds:
        raise ValueError(
            f"Unknown lens {name!r}; choose {', '.join(repr(k) for k in sorted(kinds))}, the path of a saved lens "
            "file (.safetensors), or pass a Lens object."
        )
    return kinds[name]


def is_lens_path(lens: str | os.PathLike[str]) -> bool:
    """Whether a ``lens`` argument names a saved lens file rather than a lens kind."""
    return os.fspath(lens).endswith(LENS_FILE_SUFFIXES)


def get_lens(model: Model, lens: str | os.PathLike[str] | Lens = DEFAULT_LENS, *, train: bool = False, **options: Any) -> Lens:
    """A lens for ``model``: a :class:`~depthkit.lens.base.Lens` is returned as it
    is, a path loads that saved lens file (checked against ``model``), a kind name
    asks its kind. ``train=False`` (what every engine call uses) never trains: a
    tuned lens must already be saved; ``train=True`` trains and saves it if needed.
    ``options`` go to the kind (for the tuned lens: ``budget``, ``text``,
    ``cache_dir``, ``downweight``, ``seed``, ``start``, and with ``train=True`` ``progress``
    and ``cache``).

    >>> import depthkit as dk
    >>> model = dk.load_model("tiny-llama", seed=0)
    >>> get_lens(model, "logit").name
    'logit'
    """
    if isinstance(lens, Lens):
        return lens
    if isinstance(lens, os.PathLike) or (isinstance(lens, str) and is_lens_path(lens)):
        from depthkit.lens.store import load_lens

        return load_lens(model, os.fspath(lens))
    if not isinstance(lens, str):
        raise TypeError(f"lens must be a kind name, a lens file path or a Lens; got {type(lens).__name__}.")
    kind = lens_kind(lens)
    if train and kind.make is not None:
        return kind.make(model, **options)
    return kind.load(model, **options)
