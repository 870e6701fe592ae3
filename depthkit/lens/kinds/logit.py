"""The logit lens: the model's own final norm and unembedding applied at every depth."""

from __future__ import annotations

from typing import Any

from depthkit.lens.base import LogitLens
from depthkit.lens.registry import LensKind


def _load(model: Any, **_options: Any) -> LogitLens:
    # Budgets and training text mean nothing to the logit lens; a chapter passes
    # them whatever lens it was asked for.
    return LogitLens(model)


KIND = LensKind("logit", "the model's own readout at every depth (nothing trained)", load=_load)
