"""The model handle: what :func:`depthkit.load_model` returns and every ``model``
argument in depthkit takes.

A :class:`Model` carries the network that runs (a TransformerLens 4
``TransformerBridge``), its :class:`~depthkit.core.model_info.ModelInfo` (written
next to every result) and the tokenizer depthkit encodes with, so no function has
to look any of them up elsewhere. This module imports neither torch nor
TransformerLens.

For readers who know TransformerLens, attributes the handle does not have are the
bridge's, and calling the handle calls the bridge: ``model.cfg.n_layers``,
``model(tokens)`` and hooked runs work as on a bridge. depthkit's
own code always says ``model.bridge``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from depthkit.core.model_info import ModelInfo

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedTokenizerBase

__all__ = ["Model", "ModelInfo", "as_model"]


@dataclass(frozen=True, eq=False)  # compared and hashed by identity, like the network it holds
class Model:
    """A loaded model: the network, what depthkit knows about it, and its tokenizer.

    >>> import depthkit as dk
    >>> model = dk.load_model("tiny-gpt2", seed=0)
    >>> model.info.n_blocks == model.bridge.cfg.n_layers == model.cfg.n_layers
    True
    >>> model.tokenizer("Paris")["input_ids"] == model.tokenizer.encode("Paris")
    True
    """

    bridge: TransformerBridge
    info: ModelInfo
    # The model family's own tokenizer: TransformerBridge swaps in a copy that always
    # prepends BOS, and depthkit tokenises prompts as the family does by default.
    tokenizer: PreTrainedTokenizerBase

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the handle lacks; the bridge's own error otherwise.
        if name.startswith("__") or name in ("bridge", "info", "tokenizer"):
            raise AttributeError(name)
        return getattr(self.bridge, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.bridge(*args, **kwargs)

    def __repr__(self) -> str:
        i = self.info
        return f"Model({i.name!r}, {i.family}, {i.n_blocks} blocks, d_model={i.d_model}, source={i.source})"


def as_model(model: Any) -> Model:
    """``model`` if it is a :class:`Model`; otherwise a clear error naming the fix."""
    if isinstance(model, Model):
        return model
    raise TypeError(
        f"Expected a model loaded with depthkit.load_model (a depthkit Model); got {type(model).__name__}. "
        "Load it with `dk.load_model(name_or_path)`."
    )
