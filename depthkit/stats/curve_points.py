"""The layers where a curve changes or arrives: the split of a two-segment fit, the
knee, the layer from which it stays at its final level, and the first layer at
which it reaches a level."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SegmentFit:
    """Best two-segment least-squares fit of ``y`` against ``x``.

    ``split`` is the layer where the regime changes: the knot of the continuous
    (hinge) fit, or the first x of the second segment of the broken fit.
    """

    split: float
    sse: float
    slope_left: float
    slope_right: float
    fitted: np.ndarray
    kind: str


def two_segment_fit(x: Sequence[float], y: Sequence[float], *, kind: str = "hinge", min_points: int = 2) -> SegmentFit:
    """Fit two straight segments to a curve and return the best split.

    ``kind="hinge"``: a continuous piecewise-linear fit ``y = a + b·x + c·max(x - k, 0)``
    with the knot ``k`` tried at every x that leaves ``min_points`` points on each
    side (knot included on both). ``kind="broken"``: two independent lines on
    ``x < k`` and ``x ≥ k`` (allows a jump). Ties between splits go to the earliest.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-d and of equal length, got shapes {x.shape} and {y.shape}.")
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    if kind not in ("hinge", "broken"):
        raise ValueError(f"kind must be 'hinge' or 'broken', got {kind!r}.")
    if len(x) < 2 * min_points + (0 if kind == "broken" else -1):
        raise ValueError(f"A two-segment fit needs at least {2 * min_points} finite points, got {len(x)}.")
    best: SegmentFit | None = None
    for j in range(len(x)):
        k = x[j]
        if kind == "hinge":
            if j + 1 < min_points or len(x) - j < min_points:
                continue
            design = np.stack([np.ones_like(x), x, np.maximum(x - k, 0.0)], 1)
            coef, *_ = np.linalg.lstsq(design, y, rcond=None)
            fitted = design @ coef
            slopes = (coef[1], coef[1] + coef[2])
        else:
            if j < min_points or len(x) - j < min_points:
                continue
            fitted = np.empty_like(y)
            slopes = []
            for sl in (slice(0, j), slice(j, None)):
                design = np.stack([np.ones_like(x[sl]), x[sl]], 1)
                coef, *_ = np.linalg.lstsq(design, y[sl], rcond=None)
                fitted[sl] = design @ coef
                slopes.append(coef[1])
        sse = float(((y - fitted) ** 2).sum())
        if best is None or sse < best.sse - 1e-12 * max(1.0, abs(best.sse)):
            best = SegmentFit(float(k), sse, float(slopes[0]), float(slopes[1]), fitted, kind)
    if best is None:
        raise ValueError(f"No split leaves {min_points} points on each side of {len(x)} points.")
    return best


def knee(x: Sequence[float], y: Sequence[float]) -> float:
    """The x of largest distance between the curve and the chord joining its first
    and last points, both axes min-max normalised (the Kneedle criterion of
    Satopää et al. 2011, without smoothing)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3:
        raise ValueError(f"A knee needs at least 3 finite points, got {len(x)}.")
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    xn = (x - x[0]) / (x[-1] - x[0])
    span = y.max() - y.min()
    yn = (y - y.min()) / span if span > 0 else np.zeros_like(y)
    chord = yn[0] + (yn[-1] - yn[0]) * xn
    return float(x[int(np.argmax(np.abs(yn - chord)))])


def settling_layer(x: Sequence[float], y: Sequence[float], *, tol: float = 0.05) -> float:
    """Earliest x from which ``y`` stays within ``tol`` (absolute) of its last value
    for good (e.g. where a share reaches its final level)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(x) == 0 or x.shape != y.shape:
        raise ValueError("settling_layer needs non-empty x and y of equal length.")
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    outside = np.abs(y - y[-1]) > tol
    if not outside.any():
        return float(x[0])
    return float(x[int(np.nonzero(outside)[0].max()) + 1])


def first_layer_reaching(x: Sequence[float], y: Sequence[float], level: float) -> float:
    """Earliest x where ``y`` is at least ``level`` (NaN if it never is)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    order = np.argsort(x, kind="stable")
    hit = np.nonzero(y[order] >= level)[0]
    return float(x[order][hit[0]]) if len(hit) else float("nan")
