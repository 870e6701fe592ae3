"""What a backend offers depthkit: the :class:`Backend` protocol and the parts of
the model's readout (:class:`ReadoutParts`) that lenses decode with."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from jaxtyping import Float, Int
from torch import Tensor

from depthkit.engine.work import Call, Continued, ForwardWork

__all__ = ["BACKENDS", "Backend", "ReadoutParts"]

BACKENDS = ("bridge", "nnsight")


@dataclass(frozen=True)
class ReadoutParts:
    """The model's own readout, as a lens needs it.

    ``norm``: the final norm module; ``unembed``: the module giving logits from
    normed residuals; ``W_U`` ``[d_model, d_vocab]`` and ``b_U`` (``None`` without a
    bias) its weights; ``head``: the plain ``torch.nn.Linear`` behind ``unembed``
    where there is one (its weight can be multiplied directly), else ``None``;
    ``softcap``: the final logit soft-cap (0 without one).
    """

    norm: Any
    unembed: Any
    W_U: Float[Tensor, "d_model d_vocab"]
    b_U: Float[Tensor, " d_vocab"] | None
    head: torch.nn.Module | None
    softcap: float


class Backend(Protocol):
    """A model that runs forward passes for depthkit (see the package docstring).

    ``network`` is the object a user of that engine would hold (a
    ``TransformerBridge``, an nnsight model), ``config`` the Hugging Face config.
    """

    name: str
    network: Any
    config: Any
    supports_prefix: bool
    keeps_cache: bool  # execute() can return its pass's key/value cache (ForwardWork.keep_cache)

    @property
    def device(self) -> torch.device: ...

    @property
    def out_device(self) -> torch.device: ...

    @property
    def blocks(self) -> Any:
        """The model's decoder blocks, in order (torch modules)."""
        ...

    def execute(
        self,
        tokens: Int[Tensor, "batch seq"],
        attention_mask: Tensor | dict[str, Tensor],
        work: ForwardWork,
        *,
        position_ids: Int[Tensor, "batch seq"] | None = None,
        prefix: Continued | None = None,
    ) -> dict[str, Float[Tensor, "row d_model"]]:
        """Run one pass doing ``work``, ending it at its last site where
        :meth:`~depthkit.engine.work.ForwardWork.ends_at_last_site` allows; the reads
        by key, float32 on :attr:`out_device`. ``prefix``: the key/value states the
        tokens continue (``attention_mask`` then covers their columns too)."""
        ...

    def execute_all(self, calls: Iterable[Call]) -> Iterator[dict[str, Float[Tensor, "row d_model"]]]:
        """:meth:`execute` of every call, in order. A remote backend sends them a
        few dozen to a request; a local one runs them one by one as they are read."""
        ...

    def encode_prefix(self, tokens: Int[Tensor, "1 seq"]) -> Any:
        """The key/value cache after running ``tokens`` (where :attr:`supports_prefix`)."""
        ...

    def truncated_all(
        self, runs: Iterable[tuple[Int[Tensor, "batch seq"], Tensor | None, int]]
    ) -> Iterator[Float[Tensor, "batch seq d_model"]]:
        """For each ``(tokens, attention_mask, depth)``: the residual at ``depth`` of
        every position, from a pass that stops there."""
        ...

    def logits(self, tokens: Int[Tensor, "batch seq"], attention_mask: Tensor | None) -> Float[Tensor, "batch seq d_vocab"]:
        """The model's logits at every position."""
        ...

    def readout_parts(self) -> ReadoutParts:
        """The final norm and unembedding (see :class:`ReadoutParts`)."""
        ...
