"""Checks of exercise 00: the logit-lens readout and the logit lens at a layer.

Each check runs the student's function on tiny practice models and compares it
with depthkit's own lens (:class:`depthkit.lens.base.LogitLens`) and with a
computation that shares no code with it (the norm formula written out; the
model's own logits; depthkit's batched trajectories). When the answer is wrong,
it is compared with what the usual mistakes would produce, to say which one it is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from depthkit.engine.capture import Item, residual_hook_names
from depthkit.exercises._check import ExerciseError, as_tensor, call, close, passed, shape_of, single_threaded
from depthkit.exercises._fixtures import PROMPTS, clear_hooks, practice_model, tokens_of
from depthkit.lens.base import LogitLens

ARCHS = ("llama", "gpt2")  # an RMSNorm family and a LayerNorm family (with a bias)


def _plain_norm(model, h: Tensor) -> Tensor:
    """The final norm without its learned weight and bias: what re-implementing the
    norm by hand and forgetting the affine part gives."""
    norm = model.ln_final._original_component
    if hasattr(norm, "variance_epsilon"):  # RMSNorm (llama)
        return h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    centred = h - h.mean(-1, keepdim=True)
    return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + norm.eps)


def _by_formula(model, h: Tensor) -> Tensor:
    """The readout written out from the weights: norm formula, learned scale (and
    shift), then W_U (and b_U). Independent of the model's modules."""
    norm = model.ln_final._original_component
    x = _plain_norm(model, h) * norm.weight
    if getattr(norm, "bias", None) is not None:
        x = x + norm.bias
    z = x @ model.unembed.W_U
    b = getattr(model.unembed, "b_U", None)
    return z if b is None else z + b


def _readout_mistake(model, h: Tensor, got: Tensor, want: Tensor) -> str:
    """What a wrong readout most likely did, in words."""
    d_model, d_vocab = int(model.cfg.d_model), int(model.cfg.d_vocab)
    if got.shape != want.shape:
        if got.shape == want.shape[:-1]:
            return (
                f"`readout` returned shape {shape_of(got)}, one number per residual: it looks like token ids "
                f"(an argmax). Return the logits, shape {shape_of(want)}; the top-1 is `logits.argmax(-1)`, later."
            )
        if got.shape[-1] == d_model:
            return (
                f"The last dimension of what `readout` returned is d_model = {d_model}: that is still a residual "
                "(the normalised one?). Multiply by the unembedding: `model.unembed(x)` (or `x @ model.W_U`)."
            )
        return (
            f"For residuals of shape {shape_of(h)}, `readout` returned shape {shape_of(got)}; the logits have shape "
            f"{shape_of(want)}: every leading dimension of the input kept, the last one d_vocab = {d_vocab}."
        )
    with torch.no_grad():
        ln, un = model.ln_final, model.unembed
        known = [
            (un(h), "These are the logits of the residual *without* the final norm. Apply the model's final norm "
                    "(`model.ln_final`) before the unembedding: the model never unembeds an unnormalised residual."),
            (un(_plain_norm(model, h)), "You normalised the residual but left out the norm's learned weight (and "
                                        "bias). Call `model.ln_final` itself instead of writing the norm by hand."),
            (un(ln(ln(h))), "The final norm is applied twice; apply it once."),
            (torch.softmax(want, -1), "These are probabilities (a softmax of the logits); return the logits themselves."),
            (torch.log_softmax(want, -1), "These are log-probabilities; return the raw logits (no log_softmax)."),
        ]
    for value, message in known:
        if close(got, value.float()):
            return message
    err = float((got - want).abs().max())
    return f"`readout` returns logits of the right shape but wrong values (largest difference {err:.3g})."


@single_threaded
def check_readout(readout: Callable[..., Tensor]) -> None:
    """Check ``readout(model, resid) -> logits``: the final norm then the unembedding,
    on residuals of any leading shape."""
    __tracebackhide__ = True
    for arch in ARCHS:
        model = practice_model(arch)
        clear_hooks(model)
        lens = LogitLens(model)
        gen = torch.Generator().manual_seed(7)
        h = 3.0 * torch.randn(2, 3, int(model.cfg.d_model), generator=gen)
        with torch.no_grad():
            want = lens.readout(h).float()
            formula = _by_formula(model, h).float()
        if not close(want, formula):  # the two references disagree: the checker itself is broken
            raise RuntimeError(f"depthkit's readout and the norm formula disagree on tiny-{arch}; report this.")
        got = as_tensor(call(readout, "readout", model, h.clone()), "readout")
        if not close(got, want):
            raise ExerciseError(f"On a tiny {arch} model: " + _readout_mistake(model, h, got, want))
        # The readout of the final residual must be the model's own output.
        tokens = tokens_of(model, PROMPTS[0])
        with torch.no_grad():
            logits, cache = model.run_with_cache(tokens)
        final = cache[residual_hook_names(int(model.cfg.n_layers))[-1]]
        got = as_tensor(call(readout, "readout", model, final), "readout")
        if not close(got, logits.float()):
            raise ExerciseError(
                f"On a tiny {arch} model, `readout` of the final residual is not the model's own logits "
                f"(shape {shape_of(got)} against {shape_of(logits)}); it should be exactly what the model outputs."
            )
    passed(
        "readout is right: on a tiny llama (RMSNorm) and a tiny GPT-2 (LayerNorm) it matches depthkit's logit lens "
        "and the norm formula written out, and on the final residual it gives the model's own logits."
    )


def _layer_hint(n_blocks: int, layer: int) -> Callable[[BaseException], str | None]:
    def hint(err: BaseException) -> str | None:
        if isinstance(err, KeyError) and layer == n_blocks and "hook_resid_pre" in str(err):
            return (
                f"layer L = {n_blocks} is the final residual, the *output* of the last block: "
                f"`blocks.{n_blocks - 1}.hook_resid_post` (there is no block {n_blocks})."
            )
        if isinstance(err, KeyError):
            return "cache keys are hook names such as 'blocks.0.hook_resid_pre'; print(list(cache.keys())) to see them."
        return None

    return hint


def _lens_mistake(model, cache, layer: int, got: Tensor, readouts: list[Tensor], logits: Tensor) -> str:
    n_blocks = int(model.cfg.n_layers)
    names = residual_hook_names(n_blocks)
    want = readouts[layer]
    if got.shape != want.shape:
        if got.shape == want.shape[1:]:
            return (
                f"`logit_lens` returned shape {shape_of(got)}: the batch dimension is gone. Return "
                f"[batch, seq, d_vocab] = {shape_of(want)}, the shape of `model(tokens)`."
            )
        if got.shape == (want.shape[0], want.shape[2]):
            return f"`logit_lens` returned one position ({shape_of(got)}); return every position, {shape_of(want)}."
        return f"At layer {layer}, `logit_lens` returned shape {shape_of(got)}; expected {shape_of(want)}."
    if layer < n_blocks and close(got, readouts[layer + 1]):
        return (
            f"Off by one layer: at layer {layer} you return the lens of layer {layer + 1}, the output of block "
            f"{layer} (`blocks.{layer}.hook_resid_post`). Layer ℓ is the *input* of block ℓ, "
            f"`blocks.ℓ.hook_resid_pre`; layer 0 is the embedding output, before any block has run."
        )
    if layer > 0 and close(got, readouts[layer - 1]):
        return f"Off by one layer: at layer {layer} you return the lens of layer {layer - 1}, one block too early."
    if layer < n_blocks and close(got, logits):
        return (
            f"At layer {layer} you return the model's final logits: decode the residual at layer {layer} "
            "(from the cache), not the model's output."
        )
    with torch.no_grad():
        if close(got, model.unembed(cache[names[layer]]).float()):
            return "The residual is unembedded without the final norm: call your `readout` (norm, then unembedding)."
        for block in (layer - 1, layer):
            name = f"blocks.{block}.hook_resid_mid"
            if 0 <= block < n_blocks and close(got, model.unembed(model.ln_final(cache[name])).float()):
                return f"At layer {layer} you read `{name}`, halfway through block {block}; read the residual *between* blocks."
    err = float((got - want).abs().max())
    return f"At layer {layer} your logits differ from the logit lens (largest difference {err:.3g})."


@single_threaded
def check_logit_lens(logit_lens: Callable[..., Tensor]) -> None:
    """Check ``logit_lens(model, tokens, layer) -> logits [batch, seq, d_vocab]`` at
    every layer 0..L of a tiny model."""
    __tracebackhide__ = True
    from depthkit.lens.trajectories import trajectories

    model = practice_model("llama")
    clear_hooks(model)
    n_blocks = int(model.cfg.n_layers)
    lens = LogitLens(model)
    tokens = tokens_of(model, PROMPTS[1])
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        readouts = [lens.readout(cache[name]).float() for name in residual_hook_names(n_blocks)]
    logits = logits.float()
    # Independent of hook names: depthkit's batched capture, every position, every layer.
    ids = tokens[0].tolist()
    traj = trajectories(model, [Item(ids, list(range(len(ids))))], lens="logit", top_k=1, progress=False)
    for layer in range(n_blocks + 1):
        got = call(logit_lens, "logit_lens", model, tokens.clone(), layer, hint=_layer_hint(n_blocks, layer))
        got = as_tensor(got, "logit_lens")
        if not close(got, readouts[layer]):
            raise ExerciseError(_lens_mistake(model, cache, layer, got, readouts, logits))
        top1 = traj.steps.loc[traj.steps["layer"] == layer].sort_values("position")["top1_id"].tolist()
        if got[0].argmax(-1).tolist() != top1:
            raise ExerciseError(f"At layer {layer} your top-1 tokens differ from depthkit's trajectories: {top1}.")
    if not close(readouts[n_blocks], logits):
        raise RuntimeError("The lens of the final residual is not the model's output on the practice model; report this.")
    passed(
        f"logit_lens is right at every layer 0..{n_blocks}: it decodes blocks.ℓ.hook_resid_pre (ℓ < L) and "
        f"blocks.{n_blocks - 1}.hook_resid_post (ℓ = L), agrees with depthkit's trajectories on every top-1, "
        "and at the last layer it is the model's own logits."
    )
