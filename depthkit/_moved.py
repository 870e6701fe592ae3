"""Old import paths, kept for one release.

Before 0.2 depthkit was one flat folder (``depthkit.lens_store``,
``depthkit.metrics``, ...). Those paths still import, with a
:class:`DeprecationWarning` naming the new one; they go in the next release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

# old module name -> new dotted name under depthkit
MOVED: dict[str, str] = {
    "cache": "core.files",
    "params": "core.params",
    "results": "core.results",
    "narrate": "stats.narrate",
    "corpus": "data.corpus",
    "records": "data.user_files",
    "choice_sets": "data.choice_sets",
    "handles": "engine.handle",
    "models": "engine.models",
    "precision": "engine.precision",
    "attention": "engine.attention",
    "prefix": "engine.prefix",
    "capture": "engine.capture",
    "lenses": "lens.base",
    "lens_data": "lens.training_data",
    "lens_training": "lens.training",
    "lens_store": "lens.store",
    "lens_compare": "lens.compare",
    "tuned_lens": "lens",
    "trajectories": "lens.trajectories",
    "frequency": "analyses.frequency",
    "metrics": "analyses.summaries",
    "pos": "analyses.part_of_speech",
    "pos_filter": "analyses.part_of_speech_filter",
    "facts": "analyses.facts",
    "mcq": "analyses.mcq",
    "patching": "analyses.patching",
    "residual": "analyses.residual",
    "depth_score": "analyses.depth_score",
    "early_exit": "analyses.early_exit",
    "explorer": "plots.explorer",
    "book_pages": "book.pages",
    "book_site": "book.site",
    "publish": "book.publish",
    "reference": "book.reference",
    "stamps": "book.stamps",
    "tether": "book.tether",
    "time_shares": "book.time_shares",
}


def moved(old: str) -> ModuleType:
    """The module that ``depthkit.<old>`` became, with a deprecation warning."""
    new = MOVED[old]
    warnings.warn(
        f"depthkit.{old} moved to depthkit.{new}; the old path will be removed in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return importlib.import_module(f"depthkit.{new}")


class _Alias(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        # The import system returns whatever sys.modules holds under the old name
        # once this returns: the new module itself, so both names share one object.
        sys.modules[module.__name__] = moved(module.__name__.rpartition(".")[2])


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package == "depthkit" and name in MOVED:
            return importlib.machinery.ModuleSpec(fullname, _Alias())
        return None


def install() -> None:
    """Let ``import depthkit.<old>`` find the moved module (idempotent)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
