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

The dense per-token arrays these are computed on live in
:mod:`depthkit.analyses.depth_grid`; what a model that stopped early would save (the
exit policies, :func:`exit_sweep`, :func:`verify_exit`) in
:mod:`depthkit.analyses.exit_policies`. The names that lived here before the split are
re-exported, so ``depth_score.X`` still reaches them.
"""

from __future__ import annotations

# The ``X as X`` imports were used here before the grid and
# the exit policies moved out; they stay reachable as ``depth_score.X``.
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from depthkit.analyses.depth_grid import _depths as _depths
from depthkit.analyses.depth_grid import _Grid as _Grid
from depthkit.analyses.depth_grid import _grid as _grid
from depthkit.analyses.depth_grid import scores_from_arrays as scores_from_arrays
from depthkit.analyses.exit_policies import DEFAULT_TAUS as DEFAULT_TAUS
from depthkit.analyses.exit_policies import confidence_exit as confidence_exit
from depthkit.analyses.exit_policies import exit_sweep as exit_sweep
from depthkit.analyses.exit_policies import held_out_saving as held_out_saving
from depthkit.analyses.exit_policies import saving_at as saving_at
from depthkit.analyses.exit_policies import verify_exit as verify_exit
from depthkit.analyses.summaries import FIRST_DEPTH_LAYER as FIRST_DEPTH_LAYER
from depthkit.lens.base import Lens as Lens
from depthkit.lens.base import layer_plan as layer_plan
from depthkit.lens.trajectories import Item, Trajectories

if TYPE_CHECKING:
    from depthkit.engine.handle import Model


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
