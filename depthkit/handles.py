"""What depthkit knows about a model it loaded, kept beside the model rather than
patched onto it: a :class:`ModelInfo` (written next to every result) and the
tokenizer depthkit encodes with.

``Model`` is the type of every ``model`` argument in depthkit: a TransformerLens 4
``TransformerBridge`` returned by :func:`depthkit.load_model`. This module imports
neither torch nor TransformerLens, so the results and book layers can ask about a
model without loading either.
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge as Model  # noqa: F401  (re-exported for annotations)


@dataclass(frozen=True)
class ModelInfo:
    """What a result needs to say about the model that produced it."""

    name: str
    family: str
    n_blocks: int
    d_model: int
    d_vocab: int
    n_ctx: int
    quantisation: str
    source: str  # "embedded" | "tiny" | "hub" | "local"
    fingerprint: str  # hash of the weights (see :func:`depthkit.models.weights_fingerprint`)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def is_quantised(self) -> bool:
        return self.quantisation != "none"


@dataclass(frozen=True)
class _Loaded:
    info: ModelInfo
    tokenizer: Any


# Weak keys: a model that is dropped takes its record with it.
_LOADED: weakref.WeakKeyDictionary[Any, _Loaded] = weakref.WeakKeyDictionary()


def register(model: Model, info: ModelInfo, tokenizer: Any) -> None:
    """Record what :func:`depthkit.load_model` knows about ``model``."""
    _LOADED[model] = _Loaded(info, tokenizer)


def info_of(model: Any) -> ModelInfo | None:
    """The :class:`ModelInfo` of a model loaded by depthkit, else None."""
    try:
        loaded = _LOADED.get(model)
    except TypeError:  # not weak-referenceable (a str, a dict): not a loaded model
        return None
    return loaded.info if loaded else None


def tokenizer_registered(model: Any) -> Any | None:
    """The tokenizer depthkit loaded with ``model``, else None."""
    try:
        loaded = _LOADED.get(model)
    except TypeError:
        return None
    return loaded.tokenizer if loaded else None
