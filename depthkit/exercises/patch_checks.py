"""Checks of exercise 02: activation patching of one residual vector.

The student's ``patched_logit_diff`` runs on a tiny practice model, at every layer
0..L, for a pair of prompts of different lengths (last position) and a pair of equal
lengths (last and a middle position). Answers are compared with the reference
solution and, at the last position, with depthkit's own batched patching
(:func:`depthkit.analyses.patching.patched_logits`), which shares no code with either. A
wrong answer is compared, over all layers at once, with what the usual mistakes give.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from depthkit.analyses.patching import patched_logits
from depthkit.engine.capture import Item, residual_hook_names, residual_rows
from depthkit.exercises._check import ExerciseError, call, passed, single_threaded
from depthkit.exercises._fixtures import clear_hooks, practice_model, tokens_of

PAIRS = (
    ("She opened the door and", "A small dog ran into the", -1),
    ("The capital of France is", "In the morning she walked to the old market", -1),
    ("She opened the door and", "The river flows to the", 5),
)


def _hook_name(n_blocks: int, layer: int, *, post: bool = False) -> str:
    if post:  # the usual off-by-one: the output of block ℓ instead of its input
        return f"blocks.{min(layer, n_blocks - 1)}.hook_resid_post"
    return residual_hook_names(n_blocks)[layer]


@torch.no_grad()
def _variant(model, cache: Any, target: Tensor, layer: int, good: int, bad: int, position: int, how: str = "") -> float:
    """Logit difference after a patch done right (``how=""``) or done as a usual
    mistake does it: "post" (hook off by one), "probs" (probabilities, not logits).
    (Writing every position of an equal-length target just reruns the source.) ``cache``: the source run's activations."""
    n_blocks = int(model.cfg.n_layers)
    name = _hook_name(n_blocks, layer, post=how == "post")
    src = cache[name].clone()

    def write(resid: Tensor, hook: Any) -> Tensor:  # noqa: ARG001 - TransformerLens hook signature
        resid[:, position] = src[:, position]
        return resid

    out = model.run_with_hooks(target, fwd_hooks=[(name, write)])[0, -1]
    if how == "probs":
        out = torch.softmax(out, -1)
    return float(out[good] - out[bad])


@torch.no_grad()
def _clean(model, tokens: Tensor, good: int, bad: int) -> float:
    out = model(tokens)[0, -1]
    return float(out[good] - out[bad])


def _number(value: Any) -> float:
    __tracebackhide__ = True
    if value is None:
        raise ExerciseError("`patched_logit_diff` returned None: did you forget the `return` line?")
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ExerciseError(
                f"`patched_logit_diff` returned a tensor of shape {list(value.shape)}; return one number: "
                "logits[0, -1, good] - logits[0, -1, bad] (a float, e.g. with .item())."
            )
        return float(value.detach().reshape(()))
    if isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool):
        return float(value)
    raise ExerciseError(f"`patched_logit_diff` returned a {type(value).__name__}; return one number (a float).")


def _hint(n_blocks: int, layer: int) -> Callable[[BaseException], str | None]:
    def hint(err: BaseException) -> str | None:
        text = str(err)
        if isinstance(err, KeyError) and layer == n_blocks:
            return (
                f"layer L = {n_blocks} is the output of the last block: `blocks.{n_blocks - 1}.hook_resid_post` "
                f"(there is no block {n_blocks}); layers ℓ < L are `blocks.ℓ.hook_resid_pre`."
            )
        if isinstance(err, RuntimeError) and ("size" in text or "shape" in text):
            return (
                "the source and target prompts have different lengths, so the whole source residual does not fit "
                "into the target's. Patch one position: `resid[:, position] = source_resid[:, position]`."
            )
        return None

    return hint


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.allclose(a, b, atol=1e-3 * max(1.0, float(np.abs(b).max())), rtol=1e-4))


def _explain(got: np.ndarray, want: np.ndarray, known: dict[str, np.ndarray], where: str) -> str:
    messages = {
        "sign": "The sign is flipped: return logit(good) - logit(bad), not bad - good.",
        "post": "Off by one layer: you patched the output of block ℓ (`blocks.ℓ.hook_resid_post`), which is layer "
                "ℓ + 1. Layer ℓ is the *input* of block ℓ, `blocks.ℓ.hook_resid_pre` (and layer L the output of the last block).",
        "target": "The patch has no effect: every layer gives the target's own, unpatched logit difference. The hook must "
                  "write the source vector into the tensor it receives (and return it), under the exact hook name, "
                  "and the logits must come from `model.run_with_hooks(target, fwd_hooks=[(name, hook)])`.",
        "source": "Every layer gives the *source* prompt's own logit difference. Either you read the logits of the "
                  "source run, or you wrote the source's residual at *every* position, which turns the target run into "
                  "the source run. Patch only `position` of the target, and read the logits of that patched run.",
        "probs": "These are differences of probabilities; use the logits (no softmax).",
    }
    for name, values in known.items():
        if _close(got, values) and not _close(want, values):
            return f"{where}: {messages[name]}"
    layer = int(np.argmax(np.abs(got - want)))
    return f"{where}: wrong at layer {layer}: {got[layer]:.4f}, should be {want[layer]:.4f}."


@single_threaded
def check_patched_logit_diff(patched_logit_diff: Callable[..., Any]) -> None:
    """Check ``patched_logit_diff(model, source, target, layer, good, bad, position=-1)``
    at every layer, on three prompt pairs."""
    __tracebackhide__ = True
    model = practice_model("llama")
    clear_hooks(model)
    n_blocks = int(model.cfg.n_layers)
    layers = list(range(n_blocks + 1))
    for source_text, target_text, position in PAIRS:
        source, target = tokens_of(model, source_text), tokens_of(model, target_text)
        with torch.no_grad():
            good = int(model(source)[0, -1].argmax())
            ranked = model(target)[0, -1].argsort(descending=True).tolist()
        bad = next(t for t in ranked if t != good)
        where = f"source {source_text!r}, target {target_text!r}, position {position}"
        with torch.no_grad():
            _, cache = model.run_with_cache(source)

        def variant(how: str = "", cache: Any = cache, source: Tensor = source, target: Tensor = target,
                    good: int = good, bad: int = bad, position: int = position) -> np.ndarray:
            return np.array([_variant(model, cache, target, ell, good, bad, position, how) for ell in layers])

        want = variant()
        if position == -1:  # depthkit's batched patching, independent of hook names
            ids_s, ids_t = source[0].tolist(), target[0].tolist()
            vec = residual_rows(model, [Item(ids_s, [len(ids_s) - 1])], layers)[:, 0]
            z = patched_logits(model, [ids_t] * len(layers), layers, vec)
            if not _close((z[:, good] - z[:, bad]).numpy(), want):
                raise RuntimeError("depthkit's patching and the checker's own patch disagree; report this.")
        got = np.array([
            _number(call(patched_logit_diff, "patched_logit_diff", model, source.clone(), target.clone(), ell, good, bad,
                         position=position, hint=_hint(n_blocks, ell)))
            for ell in layers
        ])  # fmt: skip
        if _close(got, want):
            continue
        known = {
            "sign": -want,
            "post": variant("post"),
            "target": np.full(len(layers), _clean(model, target, good, bad)),
            "source": np.full(len(layers), _clean(model, source, good, bad)),
            "probs": variant("probs"),
        }
        raise ExerciseError(_explain(got, want, known, where))
    passed(
        f"patched_logit_diff is right at every layer 0..{n_blocks} on {len(PAIRS)} prompt pairs (equal lengths, "
        "different lengths, a middle position); at the last position it agrees with depthkit's batched patching."
    )
