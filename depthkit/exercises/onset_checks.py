"""Checks of exercise 04: the onset layer, the earliest *depth* layer at which a
target reaches rank ≤ k.

The book's definition is :func:`depthkit.analyses.summaries.onset_layers` with
``first_layer=FIRST_DEPTH_LAYER``: layer 0, the embedding read through the lens,
is not depth and never counts, and the onset is the first layer that reaches rank
≤ k even if a later layer leaves it again. Hand-made rank sequences each trip one
usual mistake; random ones are compared with depthkit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from depthkit.analyses.summaries import FIRST_DEPTH_LAYER, onset_layers
from depthkit.exercises._check import ExerciseError, call, passed, single_threaded

# (ranks at layers 0..L, k, onset), worked out by hand.
CASES: tuple[tuple[tuple[int, ...], int, int | None], ...] = (
    ((1, 7, 3, 1, 1), 1, 3),  # rank 1 at layer 0 is not depth
    ((9, 4, 1, 2, 1), 1, 2),  # reached at 2, left at 3: the onset is still 2
    ((8, 5, 3, 3, 1), 3, 2),  # rank == k counts
    ((5, 4, 3, 2, 2), 1, None),  # never
    ((50, 40, 10, 2, 1), 10, 2),
    ((2, 1, 1, 1), 1, 1),
    ((1, 1, 1, 1, 1, 1), 1, 1),
    ((30, 12, 6, 1, 4, 1, 1), 5, 3),
)


def _onset(value: Any) -> float | None:
    """The student's answer as a layer number (None for "never"), or advice."""
    __tracebackhide__ = True
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None  # the book's tables say NaN for "never": fine too
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ExerciseError(f"`onset_layer` returned a {type(value).__name__}; return a layer number (an int), or None.")
    if float(value) != int(value):
        raise ExerciseError(f"`onset_layer` returned {value}; a layer is a whole number.")
    return int(value)


def _variants(ranks: Sequence[int], k: int) -> dict[str, int | None]:
    """What the usual mistakes return on ``ranks``."""
    first = lambda start, ok: next((i for i in range(start, len(ranks)) if ok(ranks[i])), None)  # noqa: E731
    right = first(1, lambda r: r <= k)
    stay = None  # "settles": the first layer from which the rank stays ≤ k
    for i in range(len(ranks) - 1, 0, -1):
        if ranks[i] > k:
            break
        stay = i
    return {
        "layer0": first(0, lambda r: r <= k),
        "strict": first(1, lambda r: r < k),
        "index": None if right is None else right - 1,
        "settle": stay,
        "never_-1": -1 if right is None else right,
        "never_len": len(ranks) if right is None else right,
        "never_last": len(ranks) - 1 if right is None else right,
        "never_0": 0 if right is None else right,
    }


MESSAGES = {
    "layer0": "Layer 0 counts in your answer: it is the embedding read through the lens, before any block has run, "
              "so it is not depth. Start at layer 1 (dk.metrics.FIRST_DEPTH_LAYER).",
    "strict": "Rank ≤ k includes rank k itself: use `<=`, not `<`.",
    "index": "Your answers are one less than the layer: you return a position in ranks[1:], not the layer number. "
             "ranks[ℓ] is the rank at layer ℓ; return ℓ.",
    "settle": "You return the layer from which the rank *stays* ≤ k. The book's onset is the first depth layer that "
              "*reaches* rank ≤ k, even if a later layer falls back.",
    "never_-1": "When the target never reaches rank ≤ k, return None (not -1, which reads as a layer).",
    "never_len": "When the target never reaches rank ≤ k, return None (not len(ranks), which reads as a layer).",
    "never_last": "When the target never reaches rank ≤ k, return None (not the last layer).",
    "never_0": "When the target never reaches rank ≤ k, return None (not 0, which is a layer).",
}


def _random_cases(n: int = 200, seed: int = 0) -> pd.DataFrame:
    """Rank sequences of random length and shape, as a targets frame [item, layer, rank]."""
    rng = np.random.default_rng(seed)
    rows = []
    for item in range(n):
        n_layers = int(rng.integers(2, 12))
        ranks = np.maximum(1, (rng.lognormal(2.0, 1.5, n_layers) * rng.random(n_layers).cumsum()[::-1]).astype(int))
        rows += [{"item": item, "layer": layer, "rank": int(r)} for layer, r in enumerate(ranks)]
    return pd.DataFrame(rows)


@single_threaded
def check_onset_layer(onset_layer: Callable[..., Any]) -> None:
    """Check ``onset_layer(ranks, k) -> int | None`` on hand-made and random rank sequences."""
    __tracebackhide__ = True
    got: list[int | None] = []
    for ranks, k, _ in CASES:
        got.append(_onset(call(onset_layer, "onset_layer", list(ranks), k)))
    wrong = [(c, g) for c, g in zip(CASES, got) if g != c[2]]
    if wrong:
        # The mistake that explains every answer, if there is one.
        for name, message in MESSAGES.items():
            if all(_variants(ranks, k)[name] == g for (ranks, k, _), g in zip(CASES, got)):
                raise ExerciseError(message)
        (ranks, k, want), g = wrong[0]
        name = next((n for n, v in _variants(ranks, k).items() if v == g), None)
        extra = f" {MESSAGES[name]}" if name else ""
        raise ExerciseError(f"For ranks {list(ranks)} and k = {k} you return {g}; the onset is {want}.{extra}")
    frame = _random_cases()
    for k in (1, 3, 10):
        ref = onset_layers(frame, [k], first_layer=FIRST_DEPTH_LAYER).set_index("item")["onset"]
        for item, g in frame.groupby("item"):
            ranks = g.sort_values("layer")["rank"].tolist()
            mine = _onset(call(onset_layer, "onset_layer", list(ranks), k))
            want = None if np.isnan(ref[item]) else int(ref[item])
            if mine != want:
                raise ExerciseError(f"For ranks {ranks} and k = {k} you return {mine}; dk.metrics.onset_layers says {want}.")
    passed(
        f"onset_layer is right: {len(CASES)} hand-made cases (layer 0, rank = k, falling back, never) and "
        f"{frame['item'].nunique()} random rank sequences at k = 1, 3, 10 agree with dk.metrics.onset_layers."
    )
