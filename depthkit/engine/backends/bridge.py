"""The default backend: TransformerLens 4's ``TransformerBridge``, driven by hooks.

A :class:`~depthkit.engine.work.ForwardWork` becomes one hook per site (named as
TransformerLens names them, ``blocks.{b}.hook_resid_pre|mid|post``) doing that
site's steps in order. Attention runs as the model's own fused module where the
architecture allows (:mod:`depthkit.engine.attention`).

A pass ends at its last site (:meth:`~depthkit.engine.work.ForwardWork.ends_at_last_site`):
the blocks after it, the final norm and the unembedding never run. The model's own
logits would cost a product with the whole unembedding every pass, which on a
262k-token vocabulary (Gemma 3) is a large share of a short pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from depthkit.engine.attention import run_attention
from depthkit.engine.backends.base import ReadoutParts
from depthkit.engine.contexts import CACHE, empty_cache
from depthkit.engine.work import Call, Continued, ForwardWork, SiteSteps

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

__all__ = ["BridgeBackend", "hook_name"]

_HOOK = {"pre": "hook_resid_pre", "mid": "hook_resid_mid", "post": "hook_resid_post"}


class _PassDone(Exception):
    """Raised by the hook of a pass's last site: nothing after it is needed."""


def hook_name(block: int, where: str) -> str:
    """TransformerLens's name of a residual site.

    >>> hook_name(2, "mid")
    'blocks.2.hook_resid_mid'
    """
    return f"blocks.{block}.{_HOOK[where]}"


class BridgeBackend:
    """Forward passes of a ``TransformerBridge`` (see the module docstring)."""

    name = "bridge"
    supports_prefix = True
    keeps_cache = True

    def __init__(self, bridge: TransformerBridge) -> None:
        self.network = bridge
        self.bridge = bridge
        self.config = bridge.original_model.config

    @property
    def device(self) -> torch.device:
        return next(self.bridge.parameters()).device

    @property
    def out_device(self) -> torch.device:
        # With device_map the blocks may sit on several devices; residuals are gathered
        # where the readout (unembedding) lives, which is where they are decoded.
        unembed = self.bridge.unembed
        return unembed.weight.device if hasattr(unembed, "weight") else self.device

    @property
    def blocks(self) -> Any:
        return self.bridge.blocks

    @torch.no_grad()
    def execute(
        self,
        tokens: Int[Tensor, "batch seq"],
        attention_mask: Tensor | dict[str, Tensor],
        work: ForwardWork,
        *,
        position_ids: Int[Tensor, "batch seq"] | None = None,
        prefix: Continued | None = None,
    ) -> dict[str, Float[Tensor, "row d_model"]]:
        got: dict[str, Tensor] = {}
        stash: dict[int, Tensor] = {}
        steps = work.steps()
        stop = work.ends_at_last_site(self.bridge.cfg.n_layers)
        hooks = [(hook_name(s.block, s.where), self._site_hook(s, got, stash, stop and s is steps[-1])) for s in steps]
        # logits_to_keep=1: a pass that runs to the end (one keeping its cache) would
        # otherwise compute batch x seq x vocab logits that nothing reads.
        options: dict[str, Any] = {"attention_mask": attention_mask, "fwd_hooks": hooks, "logits_to_keep": 1}
        if position_ids is not None:
            options["position_ids"] = position_ids
        if prefix is not None or work.keep_cache:
            options.update(cache=prefix.cache_for(len(tokens)) if prefix is not None else empty_cache(), use_cache=True)
        try:
            with run_attention(self.bridge):
                self.bridge.run_with_hooks(tokens, **options)
        except _PassDone:
            pass  # run_with_hooks removes its hooks on the way out
        if work.keep_cache:
            got[CACHE] = options["cache"]  # the forward pass appended this pass's states to it
        missing = [k for k in work.keys() if k not in got]
        if missing:
            raise RuntimeError(
                f"The bridge never reached the hook(s) of {missing}; this architecture's bridge does not populate every "
                "residual hook (hook_resid_mid is missing on parallel-attention blocks). Use backend='nnsight' or fewer sites."
            )
        return got

    @torch.no_grad()
    def execute_all(self, calls: Iterable[Call]) -> Iterator[dict[str, Float[Tensor, "row d_model"]]]:
        for c in calls:
            yield self.execute(c.tokens, c.attention_mask, c.work, position_ids=c.position_ids, prefix=c.prefix)

    def _site_hook(self, steps: SiteSteps, got: dict[str, Tensor], stash: dict[int, Tensor], last: bool) -> Callable:
        out_device = self.out_device

        def hook(x: Tensor, hook: Any) -> Tensor:  # noqa: ARG001 - TransformerLens hook signature
            if steps.stash:
                stash[steps.block] = x.clone()
            if steps.skip:
                x = stash.pop(steps.block)
            if steps.writes:
                x = x.clone()
                for rows, positions, vectors in steps.writes:
                    x[rows.to(x.device), positions.to(x.device)] = vectors.to(device=x.device, dtype=x.dtype)
            for key, rows, positions in steps.reads:
                got[key] = x[rows.to(x.device), positions.to(x.device)].detach().float().to(out_device)
            if last:
                raise _PassDone
            return x

        return hook

    def encode_prefix(self, tokens: Int[Tensor, "1 seq"]) -> Any:
        with run_attention(self.bridge):
            _, cache = self.bridge(tokens, return_type="logits_and_cache", use_cache=True, logits_to_keep=1)
        return cache

    @torch.no_grad()
    def truncated_all(
        self, runs: Iterable[tuple[Int[Tensor, "batch seq"], Tensor | None, int]]
    ) -> Iterator[Float[Tensor, "batch seq d_model"]]:
        for tokens, mask, depth in runs:
            yield self._truncated(tokens, mask, depth)

    def _truncated(
        self, tokens: Int[Tensor, "batch seq"], attention_mask: Tensor | None, depth: int
    ) -> Float[Tensor, "batch seq d_model"]:
        if depth == self.bridge.cfg.n_layers:
            # stop_at_layer=L would run the unembedding too; read the final residual instead.
            b, s = tokens.shape
            rows, positions = torch.arange(b).repeat_interleave(s), torch.arange(s).repeat(b)
            work = ForwardWork().read("h", (depth - 1, "post"), rows, positions)
            mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
            return self.execute(tokens, mask, work)["h"].view(b, s, -1)
        if attention_mask is None:
            return self.bridge(tokens, stop_at_layer=int(depth))
        return self.bridge(tokens, attention_mask=attention_mask, stop_at_layer=int(depth))

    def logits(self, tokens: Int[Tensor, "batch seq"], attention_mask: Tensor | None) -> Float[Tensor, "batch seq d_vocab"]:
        return self.bridge(tokens, attention_mask=attention_mask)

    def readout_parts(self) -> ReadoutParts:
        unembed = self.bridge.unembed
        b = getattr(unembed, "b_U", None)
        return ReadoutParts(
            norm=self.bridge.ln_final,
            unembed=unembed,
            W_U=unembed.W_U.detach(),
            b_U=None if b is None else b.detach(),
            head=getattr(unembed, "original_component", None),
            softcap=float(getattr(self.config, "final_logit_softcapping", None) or 0.0),
        )
