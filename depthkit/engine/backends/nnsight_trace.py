"""The nnsight backend: the Hugging Face model itself, inside an nnsight trace.

A :class:`~depthkit.engine.work.ForwardWork` becomes the body of one
``model.trace(...)``: at each site, in forward order, read the block's input, the
stream before its MLP, or its output, do that site's steps, and save the reads.
The body uses nothing but torch, nnsight and plain data, so the same trace runs
here, across the GPUs of one machine (``device_map``), or on NDIF's servers
(``remote=True``), which have never seen depthkit's code. ``remote="local"`` is
nnsight's serverless rehearsal of a remote run: the request is serialised and run
back here with depthkit's modules hidden, as a server would.

Remote runs send up to :attr:`NNsightBackend.calls_per_request` passes per
request (one nnsight session), and cannot ship a key/value cache, so prompts that
share a prefix run whole (:attr:`NNsightBackend.supports_prefix` is off); each
pass's answer is kept (:class:`~depthkit.engine.backends.remote.RequestStore`), so
an interrupted chapter resumes. The lens readout runs here, from the model's final norm and
unembedding: a remote model's are loaded from its checkpoint files alone
(:mod:`depthkit.engine.backends.head`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from depthkit.engine.backends.base import ReadoutParts
from depthkit.engine.backends.layout import Layout, find_layout, submodule
from depthkit.engine.backends.remote import RemoteRunError, RequestStore
from depthkit.engine.work import Call, Continued, ForwardWork, depth_site

__all__ = ["NNsightBackend", "wrap"]


def wrap(hf_model: Any, tokenizer: Any) -> Any:
    """``hf_model`` as an nnsight model (a ``TransformersModel`` for text generation)."""
    from nnsight import TransformersModel

    return TransformersModel(hf_model, task="text-generation", tokenizer=tokenizer)


class NNsightBackend:
    """Forward passes of an nnsight model (see the module docstring).

    ``lm``: the nnsight model; ``hf_model``: the Hugging Face model it wraps (weights
    here, or on the meta device for a remote model); ``remote``: False, True (NDIF)
    or "local" (the rehearsal); ``readout``: the final norm and unembedding where
    ``hf_model`` does not hold them (a remote model); ``store``: where answers of
    remote requests are kept.
    """

    name = "nnsight"
    # Passes per remote request: a chapter is then a handful of requests, each small
    # enough to fail and be re-sent cheaply.
    calls_per_request = 32

    def __init__(
        self, lm: Any, hf_model: Any, *, remote: bool | str = False, readout: ReadoutParts | None = None,
        store: RequestStore | None = None,
    ) -> None:  # fmt: skip
        self.network = lm
        self.hf_model = hf_model
        self.config = hf_model.config
        self.remote = remote
        self.layout: Layout = find_layout(hf_model)
        self.supports_prefix = not remote
        # States saved inside a trace would have to travel back from the server; patched
        # targets run their context again instead.
        self.keeps_cache = False
        self._layers = submodule(lm, self.layout.layers)
        # The module that builds the attention masks and runs the blocks (e.g. `model`).
        self._body = submodule(lm, self.layout.layers.rsplit(".", 1)[0]) if "." in self.layout.layers else lm
        self._readout = readout
        if remote and store is None:
            raise ValueError("A remote backend needs a RequestStore keyed by the model's name and weights.")
        self.store = store

    @property
    def device(self) -> torch.device:
        d = next(self.hf_model.parameters()).device
        return torch.device("cpu") if d.type == "meta" else d

    @property
    def out_device(self) -> torch.device:
        return self.readout_parts().W_U.device

    @property
    def n_blocks(self) -> int:
        return len(self._layers)

    @property
    def blocks(self) -> Any:
        return submodule(self.hf_model, self.layout.layers)

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
        return next(self.execute_all([Call(tokens, attention_mask, work, position_ids, prefix)]))

    @torch.no_grad()
    def execute_all(self, calls: Iterable[Call]) -> Iterator[dict[str, Float[Tensor, "row d_model"]]]:
        out = self.out_device
        if not self.remote:
            # Here, one pass at a time: nothing is held longer than its caller needs it.
            for call in calls:
                keys, (request,) = call.work.keys(), [self._request(call)]
                (got,) = self._session([request])
                yield {k: got[k].float().to(out) for k in keys}
            return
        calls = list(calls)
        for start in range(0, len(calls), self.calls_per_request):
            chunk = calls[start : start + self.calls_per_request]
            for call, got in zip(chunk, self._remote_answers([self._request(c) for c in chunk])):
                yield {k: got[k].float().to(out) for k in call.work.keys()}

    def _request(self, call: Call) -> tuple:
        """A call as plain data: tokens, keyword arguments, per-layer-type mask, site steps, stop."""
        mask = call.attention_mask
        # nnsight pads and batches per-row inputs itself and takes only tensors; a
        # per-layer-type mask (sliding-window models) goes straight to the module
        # that reads it, inside the trace.
        per_type = mask if isinstance(mask, dict) else None
        kwargs: dict[str, Any] = {"attention_mask": mask["full_attention"] if per_type else mask, "logits_to_keep": 1}
        if call.position_ids is not None:
            kwargs["position_ids"] = call.position_ids
        if call.prefix is not None:
            if not self.supports_prefix:
                raise ValueError("A remote nnsight run cannot continue a cached prefix; run the prompts whole.")
            kwargs.update(cache=call.prefix.cache_for(len(call.tokens)), use_cache=True)
        steps = call.work.steps()
        if self.layout.mid is None and any(s.where == "mid" for s in steps):
            raise ValueError(
                f"{type(self.hf_model).__name__} runs attention and MLP in parallel: there is no residual between them "
                "to read (site 'mid')."
            )
        plan = [(s.block, s.where, s.skip, s.stash, list(s.writes), list(s.reads)) for s in steps]
        return call.tokens, kwargs, per_type, plan, call.work.ends_at_last_site(self.n_blocks)

    def _remote_answers(self, requests: list[tuple]) -> list[dict[str, Tensor]]:
        """Answers of ``requests``: those kept from earlier runs, the rest fetched in one request."""
        assert self.store is not None
        keys = [self.store.key(*r) for r in requests]
        answers = [self.store.get(k) for k in keys]
        missing = [i for i, a in enumerate(answers) if a is None]
        if missing:
            try:
                fresh = self._session([requests[i] for i in missing])
            except Exception as err:  # noqa: BLE001 - every failure of a request gets the same advice
                raise _remote_error(err, self.store) from err
            for i, got in zip(missing, fresh):
                answers[i] = dict(got)
                self.store.put(keys[i], answers[i])
            size = sum(t.numel() * t.element_size() for i in missing for t in answers[i].values())  # type: ignore[union-attr]
            self.store.note_request(len(missing), size)
        return answers  # type: ignore[return-value]

    def _session(self, requests: list[tuple]) -> list[dict[str, Tensor]]:
        # The body below is what a remote server runs: torch, nnsight and the plain
        # data in `requests` only (no depthkit names), one access per site, in
        # forward order, every pass of the request in one session.
        import nnsight

        lm, body, layers, mid = self.network, self._body, self._layers, self.layout.mid
        with lm.session(remote=self.remote):
            answers = nnsight.save([])
            for tokens, kwargs, per_type, plan, stop in requests:
                with lm.trace(tokens, **kwargs) as tracer:
                    got = {}
                    stash = {}
                    if per_type is not None:
                        args, named = body.inputs
                        body.inputs = (args, {**named, "attention_mask": per_type})
                    for block, where, skip, keep, writes, reads in plan:
                        layer = layers[block]
                        if where == "pre":
                            x = layer.input
                        elif where == "mid":
                            x = getattr(layer, mid).input
                        else:
                            out = layer.output
                            x = out[0] if isinstance(out, tuple) else out
                        if keep:
                            stash[block] = x.clone()
                        if skip:
                            x = stash.pop(block)
                        if writes:
                            x = x.clone()
                            for rows, positions, vectors in writes:
                                x[rows.to(x.device), positions.to(x.device)] = vectors.to(device=x.device, dtype=x.dtype)
                        if skip or writes:
                            if where == "pre":
                                layer.input = x
                            elif where == "mid":
                                getattr(layer, mid).input = x
                            else:
                                layer.output = (x, *out[1:]) if isinstance(out, tuple) else x
                        for key, rows, positions in reads:
                            got[key] = x[rows.to(x.device), positions.to(x.device)].float()
                    answers.append(got)
                    if stop:
                        tracer.stop()
        return answers

    def encode_prefix(self, tokens: Int[Tensor, "1 seq"]) -> Any:
        if not self.supports_prefix:
            raise ValueError("A remote nnsight run keeps no key/value cache; run the prompts whole.")
        with torch.no_grad():
            out = self.hf_model(tokens.to(self.device), use_cache=True, logits_to_keep=1)
        return out["cache"] if "cache" in out else out.past_key_values

    def truncated_all(
        self, runs: Iterable[tuple[Int[Tensor, "batch seq"], Tensor | None, int]]
    ) -> Iterator[Float[Tensor, "batch seq d_model"]]:
        calls = []
        for tokens, mask, depth in runs:
            b, s = tokens.shape
            rows, positions = torch.arange(b).repeat_interleave(s), torch.arange(s).repeat(b)
            work = ForwardWork().read("h", depth_site(int(depth), self.n_blocks), rows, positions)
            calls.append(Call(tokens, torch.ones_like(tokens) if mask is None else mask, work))
        for call, got in zip(calls, self.execute_all(calls)):
            yield got["h"].view(*call.tokens.shape, -1)

    def logits(self, tokens: Int[Tensor, "batch seq"], attention_mask: Tensor | None) -> Float[Tensor, "batch seq d_vocab"]:
        (h,) = self.truncated_all([(tokens, attention_mask, self.n_blocks)])
        parts = self.readout_parts()
        z = parts.unembed(parts.norm(h.to(parts.W_U.dtype))).float()
        if parts.softcap > 0:
            z = torch.tanh(z / parts.softcap) * parts.softcap
        return z

    def readout_parts(self) -> ReadoutParts:
        if self._readout is None:
            self._readout = readout_of(self.hf_model, self.layout)
        return self._readout


def readout_of(hf_model: Any, layout: Layout) -> ReadoutParts:
    """The readout of a model whose weights are here."""
    head = submodule(hf_model, layout.head)
    b = getattr(head, "bias", None)
    return ReadoutParts(
        norm=submodule(hf_model, layout.norm),
        unembed=head,
        W_U=head.weight.detach().T,
        b_U=None if b is None else b.detach(),
        head=head if type(head) is torch.nn.Linear else None,
        softcap=float(getattr(hf_model.config, "final_logit_softcapping", None) or 0.0),
    )


def _remote_error(err: Exception, store: RequestStore) -> RemoteRunError:
    from depthkit.engine.backends.remote import KEY_HELP

    text = f"{type(err).__name__}: {str(err)[:400]}"
    if "401" in text or "403" in text or "api key" in text.lower() or "unauthor" in text.lower():
        what = f"NDIF refused the request (the API key is missing, wrong or not allowed this model). {KEY_HELP}"
    else:
        what = (
            "The remote request failed. Check that the model is running on NDIF (https://nnsight.net/status) and "
            "that this machine reaches api.ndif.us; a smaller batch_size makes each request lighter."
        )
    return RemoteRunError(
        f"{what} Batches already returned are kept in {store.folder} ({store.sent} sent, {store.reused} reused in "
        f"this run): running the same command again sends only the rest.\n(cause: {text})"
    )
