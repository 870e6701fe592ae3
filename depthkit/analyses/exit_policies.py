"""What a model that stopped early would save: exit policies (a confidence threshold,
a fixed layer, two oracles) scored on a trajectory of running text, the operating
point that keeps agreement with the full model at a target, chosen on some passages
and measured on others, and a check of the threshold policy with real truncated
forward passes.

Layers are the trajectory's own (canonical: 0..L, where layer L is the model's
output); exiting at layer ℓ runs blocks ``0..ℓ-1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from depthkit.analyses.depth_grid import _depths, _Grid, _grid
from depthkit.engine.capture import truncated_runs
from depthkit.lens.base import Lens, layer_plan
from depthkit.lens.trajectories import Item, Trajectories

if TYPE_CHECKING:
    from depthkit.engine.handle import Model


DEFAULT_TAUS: tuple[float, ...] = tuple(
    sorted({round(float(t), 6) for t in np.concatenate([np.linspace(0.05, 0.95, 19), 1 - np.logspace(-1.3, -4, 12)])})
)


def confidence_exit(prob: np.ndarray, layers: np.ndarray, n_blocks: int, tau: float) -> np.ndarray:
    """Index into ``layers`` of the exit of every token under the threshold policy:
    the first layer ``ℓ < L`` whose lens top-1 probability is ``≥ tau``; tokens that
    never reach it run the full model (returned as index ``-1``)."""
    usable = layers < n_blocks
    hit = (prob >= tau) & usable[None, :]
    return np.where(hit.any(1), hit.argmax(1), -1)


def exit_sweep(traj: Trajectories, taus: Sequence[float] = DEFAULT_TAUS) -> pd.DataFrame:
    """Agreement with the full model against depth used, for four policies.

    * ``confidence`` (``param`` = τ): exit at the first layer ``ℓ < L`` whose lens
      top-1 probability is ≥ τ and predict that top-1; otherwise run all L blocks.
    * ``fixed`` (``param`` = ℓ): always exit at layer ℓ.
    * ``oracle (d_sat)``: exit at the saturation depth where the lens settled on the
      model's own token, else run all blocks (knows the future: an upper reference
      for a policy that must never change its mind).
    * ``oracle (d_1)``: exit at the onset depth, the fewest layers that give the
      final answer.

    Exiting at layer ℓ runs blocks ``0..ℓ-1``: ``frac_layers = ℓ / L``. The cost of
    the lens read-outs a real policy needs to test its confidence is *not* counted.
    Returns ``[policy, param, agreement, mean_layers, frac_layers, n_tokens]``.
    """
    g = _grid(traj)
    L, layers = g.n_blocks, g.layers
    n = len(g.final)
    rows = []
    taus = [float(t) for t in taus]
    if not taus or min(taus) <= 0 or max(taus) > 1:
        raise ValueError(f"taus are probabilities in (0, 1], got {taus[:5]}...")
    for tau in taus:
        idx = confidence_exit(g.prob, layers, L, tau)
        full = idx < 0
        pred = np.where(full, g.final, g.top1[np.arange(n), np.maximum(idx, 0)])
        used = np.where(full, L, layers[np.maximum(idx, 0)])
        rows.append(("confidence", tau, np.mean(pred == g.final), used.mean()))
    for j, l in enumerate(layers):
        pred = g.final if l >= L else g.top1[:, j]
        rows.append(("fixed", float(l), np.mean(pred == g.final), float(l)))
    d1, d_sat, _, settles = _depths(g)
    for name, depth in (("oracle (d_sat)", np.where(settles, d_sat, L)), ("oracle (d_1)", d1)):
        depth = np.where(np.isnan(depth), L, depth)
        j = np.searchsorted(layers, depth)
        j = np.minimum(j, len(layers) - 1)
        pred = np.where(depth >= L, g.final, g.top1[np.arange(n), j])
        rows.append((name, np.nan, np.mean(pred == g.final), depth.mean()))
    out = pd.DataFrame(rows, columns=["policy", "param", "agreement", "mean_layers"])
    out["frac_layers"] = out["mean_layers"] / L
    out["n_tokens"] = n
    return out


def saving_at(sweep: pd.DataFrame, target: float = 0.99) -> pd.DataFrame:
    """Per policy, the operating point with the fewest layers whose agreement is at
    least ``target``, and the compute it saves (``1 - frac_layers``, counting
    transformer blocks only). Policies that never reach the target get ``NaN``.
    Returns ``[policy, target, param, agreement, frac_layers, saving]``."""
    if not 0 < target <= 1:
        raise ValueError(f"target is an agreement in (0, 1], got {target}.")
    rows = []
    for policy, g in sweep.groupby("policy", sort=False):
        ok = g[g["agreement"] >= target - 1e-12]
        if ok.empty:
            rows.append({"policy": policy, "target": target, "param": np.nan, "agreement": np.nan, "frac_layers": np.nan})
            continue
        best = ok.sort_values(["frac_layers", "agreement"], ascending=[True, False]).iloc[0]
        rows.append(
            {
                "policy": policy,
                "target": target,
                "param": best["param"],
                "agreement": best["agreement"],
                "frac_layers": best["frac_layers"],
            }
        )
    out = pd.DataFrame(rows)
    out["saving"] = 1 - out["frac_layers"]
    return out


def held_out_saving(select: pd.DataFrame, report: pd.DataFrame, target: float = 0.99) -> pd.DataFrame:
    """Operating points chosen on one set of passages and measured on another: per
    policy, the τ or exit layer :func:`saving_at` picks on ``select`` (an
    :func:`exit_sweep`), then that same τ or layer's agreement and depth on
    ``report`` (a sweep of other passages, same grids). Choosing and scoring on the
    same tokens would overstate what a policy reaches. Returns ``[policy, target,
    param, agreement_select, agreement, frac_layers, saving]``, the last three on
    ``report``."""
    rows = []
    for r in saving_at(select, target).itertuples(index=False):
        rep = report[report["policy"] == r.policy]
        if r.policy.startswith("oracle"):
            hit = rep  # an oracle has no parameter: it is exact on any tokens
        elif np.isnan(r.param):
            hit = rep.iloc[:0]
        else:
            hit = rep[np.isclose(rep["param"].to_numpy(dtype=float), r.param)]
        got = hit.iloc[0] if len(hit) else None
        rows.append(
            {
                "policy": r.policy,
                "target": target,
                "param": r.param,
                "agreement_select": r.agreement,
                "agreement": np.nan if got is None else got["agreement"],
                "frac_layers": np.nan if got is None else got["frac_layers"],
            }
        )
    out = pd.DataFrame(rows)
    out["saving"] = 1 - out["frac_layers"]
    return out


def _exit_depths(exits: dict[float, np.ndarray], token_items: np.ndarray, layers: np.ndarray) -> dict[int, set[int]]:
    """Per item, the exit layers some token of it takes under some τ."""
    # one truncated pass per (text, exit depth) serves every τ
    needed: dict[int, set[int]] = {}
    for idx in exits.values():
        for it, j in zip(token_items, idx):
            if j >= 0:
                needed.setdefault(int(it), set()).add(int(layers[j]))
    return needed


@torch.no_grad()
def _truncated_top1(
    model: Model, items: Sequence[Item], lens: Lens, plan: dict, needed: dict[int, set[int]], *, progress: bool
) -> dict[tuple[int, int], dict[int, int]]:
    """``(item, depth) -> position -> top-1``: each text run only up to each depth in
    ``needed`` and read out through ``lens`` with that layer's translator."""
    device = model.backend.device
    real: dict[tuple[int, int], dict[int, int]] = {}
    bar = tqdm(
        total=sum(len(v) for v in needed.values()), desc="truncated passes", unit="pass", disable=not progress, leave=False
    )
    runs = [(it, d) for it, depths in needed.items() for d in sorted(depths)]
    tokens = {it: torch.tensor([items[it].tokens], device=device) for it in needed}
    passes = truncated_runs(model, [(tokens[it], None, d) for it, d in runs])
    for (it, d), h_all in zip(runs, passes):
        positions = items[it].positions
        h = h_all[0, torch.tensor(positions, device=h_all.device)]
        top = lens(h.float(), plan[d]).argmax(-1).cpu().numpy()
        real[(it, d)] = dict(zip(positions, top.tolist()))
        bar.update(1)
    bar.close()
    return real


def _agreement_row(g: _Grid, real: dict[tuple[int, int], dict[int, int]], tau: float, idx: np.ndarray) -> dict:
    """One τ's row of :func:`verify_exit`: the simulated and the truncated exits
    against the full model and each other."""
    L, layers, keys = g.n_blocks, g.layers, g.keys
    n = len(g.final)
    full = idx < 0
    sim = np.where(full, g.final, g.top1[np.arange(n), np.maximum(idx, 0)])
    trunc = np.array(
        [
            g.final[k] if full[k] else real[(int(keys["item"].iat[k]), int(layers[idx[k]]))][int(keys["position"].iat[k])]
            for k in range(n)
        ]
    )
    used = np.where(full, L, layers[np.maximum(idx, 0)])
    return {
        "tau": float(tau),
        "n_tokens": n,
        "agreement_simulated": float(np.mean(sim == g.final)),
        "agreement_truncated": float(np.mean(trunc == g.final)),
        "same_as_simulated": float(np.mean(trunc == sim)),
        "frac_layers": float(used.mean() / L),
    }


@torch.no_grad()
def verify_exit(
    model: Model,
    items: Sequence[Item],
    traj: Trajectories,
    lens: Lens,
    taus: Sequence[float],
    *,
    progress: bool = True,
) -> pd.DataFrame:
    """Check the threshold policy with real truncated forward passes.

    For every τ, every token's exit layer ℓ is taken from the trajectory; the model
    is then run on each text only up to layer ℓ (``stop_at_layer=ℓ``: blocks
    ``ℓ..L-1`` are never computed) and the residual at the token's position is read
    out through ``lens`` with the translator the trajectory used for layer ℓ. Tokens
    that never exit early take the model's own output.

    ``items`` and ``traj`` must match (the trajectory built from these items). Every
    position of a text runs to the same depth, so the earlier positions a token
    attends to are complete up to ℓ, exactly as in the full pass: the check covers
    the simulation's numerics, not the key/value problem of a real per-token exit
    (a token that exited early would lack the deeper states later tokens attend to).

    Returns ``[tau, n_tokens, agreement_simulated, agreement_truncated,
    same_as_simulated, frac_layers]``.
    """
    g = _grid(traj)
    L, layers = g.n_blocks, g.layers
    plan = {s.layer: s.translator for s in layer_plan(L, traj.convention)}
    if int(g.keys["item"].max()) >= len(items):
        raise ValueError("The trajectory refers to more items than were given; pass the items it was built from.")
    exits = {tau: confidence_exit(g.prob, layers, L, tau) for tau in taus}
    needed = _exit_depths(exits, g.keys["item"].to_numpy(), layers)
    real = _truncated_top1(model, items, lens, plan, needed, progress=progress)
    return pd.DataFrame([_agreement_row(g, real, tau, idx) for tau, idx in exits.items()])
