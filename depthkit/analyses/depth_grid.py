"""A trajectory of running text as dense [token, layer] arrays, and the per-token
depths read off them (onset ``d_1``, saturation ``d_sat``, ``flips``; defined in
:mod:`depthkit.analyses.depth_score`). Shared by the depth scores and the early-exit
policies of :mod:`depthkit.analyses.exit_policies`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from depthkit.analyses.summaries import FIRST_DEPTH_LAYER
from depthkit.lens.trajectories import Trajectories


@dataclass
class _Grid:
    """A trajectory as dense arrays: one row per predicted token, one column per layer."""

    keys: pd.DataFrame  # item, position
    layers: np.ndarray  # [layer]
    top1: np.ndarray  # [token, layer] ids
    prob: np.ndarray  # [token, layer] lens top-1 probability
    final_rank: np.ndarray  # [token, layer] rank of the model's final top-1
    final: np.ndarray  # [token] model's own top-1
    n_blocks: int


def _grid(traj: Trajectories) -> _Grid:
    steps = traj.steps
    if steps.empty:
        raise ValueError("The trajectory is empty: nothing to score.")
    keys = ["item", "position"]
    top1 = steps.pivot(index=keys, columns="layer", values="top1_id").sort_index(axis=1)
    if top1.isna().any().any():
        raise ValueError("Some tokens lack a layer in the trajectory; build it with one plan for all items.")
    prob = steps.pivot(index=keys, columns="layer", values="top1_prob").reindex(index=top1.index, columns=top1.columns)
    fin = traj.target("final")
    rank = fin.pivot(index=keys, columns="layer", values="rank").reindex(index=top1.index, columns=top1.columns)
    final_id = fin.groupby(keys)["token_id"].first().reindex(top1.index)
    return _Grid(
        keys=top1.index.to_frame(index=False),
        layers=top1.columns.to_numpy(dtype=np.int64),
        top1=top1.to_numpy(dtype=np.int64),
        prob=prob.to_numpy(dtype=float),
        final_rank=rank.to_numpy(dtype=float),
        final=final_id.to_numpy(dtype=np.int64),
        n_blocks=int(traj.n_blocks),
    )


def scores_from_arrays(
    top1: np.ndarray, final_rank: np.ndarray, layers: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(d_1, d_sat, flips)`` per row from a [token, layer] array of lens top-1 ids
    and one of the final token's rank (layers in increasing order)."""
    top1 = np.asarray(top1)
    final_rank = np.asarray(final_rank, dtype=float)
    layers = np.asarray(layers)
    if top1.ndim != 2 or top1.shape != final_rank.shape or top1.shape[1] != len(layers):
        raise ValueError(f"top1 {top1.shape} and final_rank {final_rank.shape} must be [token, layer] with {len(layers)} layers.")
    if np.any(np.diff(layers) <= 0):
        raise ValueError("layers must be strictly increasing.")
    at_one = final_rank == 1
    d1 = np.where(at_one.any(1), layers[at_one.argmax(1)].astype(float), np.nan)
    change = top1[:, 1:] != top1[:, :-1]  # change[j] is between layer j and j+1
    flips = change.sum(1)
    # last change between j and j+1 -> settled from j+1; no change -> from the first layer
    last = np.where(change.any(1), change.shape[1] - 1 - np.argmax(change[:, ::-1], axis=1) + 1, 0)
    d_sat = layers[last].astype(float)
    return d1, d_sat, flips


def _depths(g: _Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(d_1, d_sat, flips, settles_on_final)`` per token, as :mod:`depthkit.analyses.depth_score` defines them."""
    depth = g.layers >= FIRST_DEPTH_LAYER
    lens_rows = depth & (g.layers < g.n_blocks)
    if not lens_rows.any():
        raise ValueError("The trajectory has no lens row between layer 1 and L-1 to score.")
    d1, _, _ = scores_from_arrays(g.top1[:, depth], g.final_rank[:, depth], g.layers[depth])
    _, d_sat, flips = scores_from_arrays(g.top1[:, lens_rows], g.final_rank[:, lens_rows], g.layers[lens_rows])
    return d1, d_sat, flips, g.top1[:, lens_rows][:, -1] == g.final
