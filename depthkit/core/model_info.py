"""What a result says about the model that produced it. Plain data, no torch: the
results and book layers read it without loading a model."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ModelInfo:
    """What a result needs to say about the model that produced it.

    >>> info = ModelInfo("toy", "llama", 2, 8, 50, 64, "none", "tiny", "0" * 16)
    >>> info.is_quantised, info.as_dict()["n_blocks"]
    (False, 2)
    """

    name: str
    family: str
    n_blocks: int
    d_model: int
    d_vocab: int
    n_ctx: int
    quantisation: str
    source: str  # "embedded" | "tiny" | "hub" | "local"
    fingerprint: str  # hash of the weights (see :func:`depthkit.engine.models.weights_fingerprint`)
    # The engine that ran it: "bridge" (TransformerLens), "nnsight", or "nnsight-remote" (NDIF).
    backend: str = "bridge"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def is_quantised(self) -> bool:
        return self.quantisation != "none"


class HasInfo(Protocol):
    """Anything that carries a :class:`ModelInfo`, such as a loaded
    :class:`depthkit.engine.handle.Model`."""

    info: ModelInfo
