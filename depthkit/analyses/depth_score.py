"""How much depth each prediction needs, and what a model that stopped early
would save.

Input is a :class:`depthkit.Trajectories` of running text (positions ``"all"``,
e.g. built from :func:`depthkit.analyses.residual.passage_items`), so every predicted token
has a lens reading at every layer. Layers are the trajectory's own (canonical:
0..L, where layer L is the model's output).

Per predicted token (:func:`depth_scores`):

* **onset depth** ``d_1``: the earliest layer from layer 1 at which the model's
  final top-1 token has rank 1 (row L, the model's own output, counts: ``d_1 = L``
  when no lens row finds it first);
* **saturation depth** ``d_sat``: within the *lens rows* 1..L-1, the earliest layer
  from which the lens top-1 never changes again up to row L-1. Row L is left out:
  it is the model's exact readout, not a lens reading, and counting the jump from
  the lens to it would give ``d_sat = L`` to every token the lens gets wrong at L-1.
  ``settles_on_final`` says whether the lens settled on the model's own token;
* **flips**: the number of lens rows 2..L-1 whose top-1 differs from the row before.

Layer 0, the embedding read through the lens, is no depth and enters none of them.

Each is also given normalised by the number of blocks ``L`` (``d_1/L``,
``d_sat/L``, ``flips/L``), so models of different depth can be compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from depthkit.analyses.summaries import FIRST_DEPTH_LAYER
from depthkit.lens.base import Lens, layer_plan
from depthkit.lens.trajectories import Item, Trajectories

if TYPE_CHECKING:
    from depthkit.engine.handle import Model


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
    """``(d_1, d_sat, flips, settles_on_final)`` per token, as the module defines them."""
    depth = g.layers >= FIRST_DEPTH_LAYER
    lens_rows = depth & (g.layers < g.n_blocks)
    if not lens_rows.any():
        raise ValueError("The trajectory has no lens row between layer 1 and L-1 to score.")
    d1, _, _ = scores_from_arrays(g.top1[:, depth], g.final_rank[:, depth], g.layers[depth])
    _, d_sat, flips = scores_from_arrays(g.top1[:, lens_rows], g.final_rank[:, lens_rows], g.layers[lens_rows])
    return d1, d_sat, flips, g.top1[:, lens_rows][:, -1] == g.final


def depth_scores(traj: Trajectories, *, next_target: str | None = "next") -> pd.DataFrame:
    """One row per predicted token: ``item, position, final_id, d1, d_sat, flips``,
    their normalised versions ``d1_norm, d_sat_norm, flips_norm`` (divided by the
    number of blocks L), ``final_prob`` (the model's probability of its top-1),
    ``settles_on_final`` (the lens's row L-1 is the model's prediction) and, when the
    trajectory has the target ``next_target``
    (the true next token, see :func:`depthkit.analyses.residual.passage_items`), ``next_id``
    and ``correct`` (the model's top-1 is the true next token)."""
    g = _grid(traj)
    d1, d_sat, flips, settles = _depths(g)
    L = g.n_blocks
    out = g.keys.copy()
    out["final_id"] = g.final
    out["d1"] = d1
    out["d_sat"] = d_sat
    out["flips"] = flips.astype(np.int64)
    out["d1_norm"] = d1 / L
    out["d_sat_norm"] = d_sat / L
    out["flips_norm"] = flips / L
    out["final_prob"] = g.prob[:, -1] if g.layers[-1] == L and traj.convention == "canonical" else np.nan
    out["settles_on_final"] = settles
    if next_target is not None and next_target in set(traj.targets["target"].unique()):
        nxt = traj.target(next_target).groupby(["item", "position"])["token_id"].first()
        out["next_id"] = nxt.reindex(pd.MultiIndex.from_frame(g.keys)).to_numpy(dtype=np.int64)
        out["correct"] = out["next_id"].to_numpy() == out["final_id"].to_numpy()
    return out


def deep_thinking_ratio(scores: pd.DataFrame, *, rho: float = 0.85, by: str = "item") -> pd.DataFrame:
    """Deep-thinking ratio (DTR) of every passage.

    Chen et al. 2026 ("Think Deep, Not Just Long") call a generated token
    *deep-thinking* when its intermediate-layer prediction converges to the final one
    only in the late part of the network, and a sequence's DTR is the share of such
    tokens. They measure convergence with a Jensen–Shannon divergence threshold; our
    reading, on the quantities of this module, replaces that with the top-1 saturation
    depth: a token is deep-thinking when ``d_sat / L ≥ rho``, with ``rho = 0.85`` (the
    depth fraction reported for their method), i.e. its lens top-1 still changes after
    85 % of the blocks. DTR = deep-thinking tokens / predicted tokens of the passage.
    This follows our reading of the definition, not their code.

    Returns ``[by, n_tokens, n_deep, dtr]``.
    """
    if not 0 < rho <= 1:
        raise ValueError(f"rho is a depth fraction in (0, 1], got {rho}.")
    for col in (by, "d_sat_norm"):
        if col not in scores.columns:
            raise ValueError(f"scores lack column {col!r}; pass the output of depth_scores.")
    deep = scores["d_sat_norm"].to_numpy() >= rho - 1e-12
    out = scores.assign(deep=deep).groupby(by, sort=True)["deep"].agg(n_tokens="size", n_deep="sum").reset_index()
    out["n_deep"] = out["n_deep"].astype(np.int64)
    out["dtr"] = out["n_deep"] / out["n_tokens"]
    return out


# ---------------------------------------------------------------------------
# Early exit


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
        rows.append({
            "policy": r.policy, "target": target, "param": r.param, "agreement_select": r.agreement,
            "agreement": np.nan if got is None else got["agreement"],
            "frac_layers": np.nan if got is None else got["frac_layers"],
        })
    out = pd.DataFrame(rows)
    out["saving"] = 1 - out["frac_layers"]
    return out


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
    keys = g.keys
    if int(keys["item"].max()) >= len(items):
        raise ValueError("The trajectory refers to more items than were given; pass the items it was built from.")
    device = next(model.bridge.parameters()).device
    rows = []
    exits = {tau: confidence_exit(g.prob, layers, L, tau) for tau in taus}
    # one truncated pass per (text, exit depth) serves every τ
    needed: dict[int, set[int]] = {}
    for idx in exits.values():
        for it, j in zip(keys["item"].to_numpy(), idx):
            if j >= 0:
                needed.setdefault(int(it), set()).add(int(layers[j]))
    real: dict[tuple[int, int], dict[int, int]] = {}  # (item, depth) -> position -> top-1
    bar = tqdm(total=sum(len(v) for v in needed.values()), desc="truncated passes", unit="pass", disable=not progress, leave=False)
    for it, depths in needed.items():
        item = items[it]
        toks = torch.tensor([item.tokens], device=device)
        pos = torch.tensor(item.positions, device=device)
        for d in sorted(depths):
            h = model.bridge(toks, stop_at_layer=d)[0, pos]
            top = lens(h.float(), plan[d]).argmax(-1).cpu().numpy()
            real[(it, d)] = dict(zip(item.positions, top.tolist()))
            bar.update(1)
    bar.close()
    n = len(g.final)
    for tau, idx in exits.items():
        full = idx < 0
        sim = np.where(full, g.final, g.top1[np.arange(n), np.maximum(idx, 0)])
        trunc = np.array(
            [
                g.final[k] if full[k] else real[(int(keys["item"].iat[k]), int(layers[idx[k]]))][int(keys["position"].iat[k])]
                for k in range(n)
            ]
        )
        used = np.where(full, L, layers[np.maximum(idx, 0)])
        rows.append(
            {
                "tau": float(tau),
                "n_tokens": n,
                "agreement_simulated": float(np.mean(sim == g.final)),
                "agreement_truncated": float(np.mean(trunc == g.final)),
                "same_as_simulated": float(np.mean(trunc == sim)),
                "frac_layers": float(used.mean() / L),
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------
# Part of speech of predicted tokens


def token_pos(model: Model, items: Sequence[Item], texts: Sequence[str], *, nlp=None) -> pd.DataFrame:
    """Universal part-of-speech tag of the token each position predicts.

    ``items[i]`` must come from ``texts[i]`` (e.g. :func:`depthkit.analyses.residual.passage_items`
    with no text dropped). Each text is tagged with spaCy (:func:`depthkit.analyses.part_of_speech.load_spacy`);
    the model token predicted at position ``p`` (token ``p + 1``) takes the tag of the
    spaCy word that contains its first non-space character, so a word split into
    several model tokens gives its tag to each of them (``first_piece`` marks the
    first). Tokens made of whitespace only get ``"SPACE"``; special tokens (BOS) get
    ``"SPECIAL"``. Returns ``[item, position, pos, first_piece]``.
    """

    if len(items) != len(texts):
        raise ValueError(f"{len(items)} items for {len(texts)} texts; pass the texts the items were built from.")
    if nlp is None:
        from depthkit.analyses.part_of_speech import load_spacy

        nlp = load_spacy()
    tok = model.tokenizer
    rows = []
    for i, (item, text, doc) in enumerate(zip(items, texts, nlp.pipe(texts))):
        enc = tok(text, add_special_tokens=True, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
        n = len(item.tokens)
        if ids[:n] != list(item.tokens):
            raise ValueError(f"Item {i} is not the tokenisation of text {i}; build items and texts together.")
        char_tag = np.full(len(text) + 1, "SPACE", dtype=object)
        char_word = np.full(len(text) + 1, -1, dtype=np.int64)
        for w in doc:
            char_tag[w.idx : w.idx + len(w.text)] = w.pos_
            char_word[w.idx : w.idx + len(w.text)] = w.i
        special = set(getattr(tok, "all_special_ids", []) or [])
        prev_word = -2
        tags, first = [], []
        for t in range(n):
            s, e = offsets[t]
            if ids[t] in special and e <= s:
                tags.append("SPECIAL")
                first.append(True)
                continue
            span = text[s:e]
            lead = len(span) - len(span.lstrip())
            c = s + lead
            if c >= e:
                tags.append("SPACE")
                first.append(True)
                continue
            tags.append(char_tag[c])
            first.append(bool(char_word[c] != prev_word))
            prev_word = char_word[c]
        for p in item.positions:
            if p + 1 < n:
                rows.append((i, p, tags[p + 1], first[p + 1]))
    return pd.DataFrame(rows, columns=["item", "position", "pos", "first_piece"])
