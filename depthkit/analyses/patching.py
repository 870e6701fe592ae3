"""Activation patching of the residual stream at one layer and the last position.

The paper's activation-patching experiment: run a *source* prompt, take its residual
stream at layer ℓ at the last position, write that vector into a *target* prompt
at the same layer and position, finish the target's forward pass and look at what
it predicts. Layers follow :mod:`depthkit.lens.base`: ℓ = 0 is the embedding output
(hook ``blocks.0.hook_resid_pre``), ℓ = i the input of block i, ℓ = L the final
residual (``blocks.{L-1}.hook_resid_post``), so patching ℓ = L replaces the
target's output by the source's.

Only the last position is patched, and attention is causal, so the earlier
positions of the target are unaffected; the patched vector is read again by every
block after ℓ, with the target's own context around it.

Every (pair, layer) is one row of a batched forward pass: rows are sorted by
length and padded on the right (with an attention mask; the runs themselves are
:func:`depthkit.engine.capture.patched_final_residuals`), and the readout at the last
position goes through the model's own final norm and unembedding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from depthkit.engine.batching import token_key
from depthkit.engine.capture import Item, check_layers, patched_final_residuals, residual_rows
from depthkit.engine.contexts import KeptContext
from depthkit.lens.base import LogitLens
from depthkit.lens.trajectories import TokenNames, encode
from depthkit.stats import LEVEL, MIN_N

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

CLASSES = ("target-option", "source-option", "other")
FOLLOWS = ("target", "source", "both", "neither")

TokensLike = str | Sequence[int]


def _ids(model: Model, x: TokensLike) -> list[int]:
    if isinstance(x, str):
        return encode(model, x)
    ids = [int(i) for i in x]
    if not ids:
        raise ValueError("A prompt has no tokens; remove empty prompts.")
    return ids


@torch.no_grad()
def patched_logits(
    model: Model,
    targets: Sequence[Sequence[int]],
    layers: Sequence[int],
    vectors: Float[Tensor, "row d_model"],
    *,
    batch_size: int = 64,
    progress: bool = False,
) -> Float[Tensor, "row d_vocab"]:
    """Next-token logits at the last position of each target after writing
    ``vectors[r]`` into the residual stream of ``targets[r]`` at layer ``layers[r]``
    (last position). Rows are independent; results keep the input order.
    ``batch_size``: patched rows of one target per forward pass."""
    h = patched_final_residuals(model, targets, layers, vectors, batch_size=batch_size, progress=progress)
    readout = LogitLens(model).readout
    out = torch.empty((len(targets), model.info.d_vocab), dtype=torch.float32)
    for s in range(0, len(targets), batch_size):  # vocabulary-sized products a block of rows at a time
        out[s : s + batch_size] = readout(h[s : s + batch_size]).float().cpu()
    return out


class CleanRuns:
    """Unpatched last-position residuals of prompts at every depth 0..L, each distinct
    prompt run once however many sweeps (and :func:`final_tokens`) ask for it: two
    patching directions between the same tasks read the same prompts, and a
    random-source control reads its prompts as sources and as targets.
    :meth:`keep` takes residuals another pass already read (e.g. the option ranks of
    :func:`depthkit.analyses.mcq.option_ranks`), so those prompts never run here.

    Calling it with token-id lists gives ``[depth, prompt, d_model]`` in their order.

    ``targets``: prompts that patching sweeps will patch. A pass that keeps their
    residuals also keeps their key/value states (:attr:`contexts`, up to
    ``context_mb`` megabytes; where the model allows, :func:`depthkit.engine.contexts.can_keep`),
    so that their patched runs feed only copies of the last token instead of running
    the prompt again."""

    def __init__(self, model: Model, *, batch_size: int = 16, targets: Sequence[TokensLike] = (), context_mb: float = 1024.0) -> None:
        self.model, self.batch_size = model, batch_size
        self._rows: dict[tuple[int, ...], Float[Tensor, "depth d_model"]] = {}
        self._wanted = {token_key(_ids(model, t)) for t in targets}
        self._room = int(context_mb * 2**20)
        self._prefixes: set[int] = set()
        self.contexts: dict[tuple[int, ...], KeptContext] = {}

    def wants_context(self, tokens: Sequence[int]) -> bool:
        key = token_key(tokens)
        return key in self._wanted and key not in self.contexts and self._room > 0

    def keep_context(self, context: KeptContext) -> None:
        """Keep ``context`` (of a prompt :meth:`wants_context` asked for) while room is left;
        a shared prefix counts once, however many contexts continue it."""
        if token_key(context.prompt) in self.contexts:
            return  # the same prompt twice in one pass: its states are kept, and counted, once
        new_prefix = context.prefix is not None and id(context.prefix) not in self._prefixes
        size = context.own_bytes + (context.prefix.nbytes if new_prefix else 0)  # type: ignore[union-attr]
        if size > self._room:
            self._room = 0  # the rest run their context again
            return
        self._room -= size
        if new_prefix:
            self._prefixes.add(id(context.prefix))
        self.contexts[token_key(context.prompt)] = context

    def keep(self, items: Sequence[Item], residuals: Float[Tensor, "depth row d_model"]) -> None:
        """Store the last-position residuals of ``items`` from a pass that read every
        depth 0..L at their positions (rows item by item, position by position; the
        ``keep`` of :func:`depthkit.lens.trajectories.trajectories`). Items that do
        not read their last token are skipped."""
        depths = self.model.info.n_blocks + 1
        if residuals.shape[0] != depths:
            raise ValueError(f"Clean runs keep residuals at all {depths} depths 0..L; got {residuals.shape[0]}.")
        row = 0
        for it in items:
            last = len(it.tokens) - 1
            if last in it.positions:
                # A copy: a view would keep the whole batch's residuals alive.
                self._rows[token_key(it.tokens)] = residuals[:, row + it.positions.index(last)].clone()
            row += len(it.positions)
        if row != residuals.shape[1]:
            raise ValueError(f"{len(items)} items read {row} positions, but {residuals.shape[1]} residual rows were given.")

    @torch.no_grad()
    def __call__(self, prompts: Sequence[Sequence[int]]) -> Float[Tensor, "depth prompt d_model"]:
        keys = [token_key(p) for p in prompts]
        missing = [k for k in dict.fromkeys(keys) if k not in self._rows]
        if missing:
            depths = list(range(self.model.info.n_blocks + 1))
            items = [Item(list(k), [len(k) - 1]) for k in missing]
            h = residual_rows(self.model, items, depths, batch_size=self.batch_size, share_prefix=True)
            self._rows.update((k, h[:, j]) for j, k in enumerate(missing))
        return torch.stack([self._rows[k] for k in keys], 1)


@torch.no_grad()
def final_tokens(
    model: Model, prompts: Sequence[TokensLike], *, batch_size: int = 16, clean: CleanRuns | None = None
) -> np.ndarray:
    """The model's own next token (its top-1) after each prompt. ``clean``: residuals
    already run (or to be kept) for these prompts."""
    ids = [_ids(model, p) for p in prompts]
    runs = clean if clean is not None else CleanRuns(model, batch_size=batch_size)
    h = runs(ids)[model.info.n_blocks]
    return LogitLens(model).readout(h).argmax(-1).cpu().numpy()


def different_answer_sources(answers: Sequence[int], seed: int = 0) -> np.ndarray:
    """For every target ``i``, a random other prompt whose answer differs from
    ``answers[i]`` (sources may repeat); ``answers`` are the model's own (e.g.
    :func:`final_tokens`) or gold labels. A source with the target's own answer would
    make "follows the source" indistinguishable from "keeps its answer"."""
    a = np.asarray(answers)
    if len(np.unique(a)) < 2:
        raise ValueError("A random-source control needs prompts with at least two different answers; all have the same.")
    rng = np.random.default_rng(seed)
    return np.array([rng.choice(np.flatnonzero(a != a[i])) for i in range(len(a))], dtype=np.int64)


def _option_sets(options: Sequence[int] | Sequence[Sequence[int]], n: int, what: str) -> list[list[int]]:
    if len(options) == 0:
        raise ValueError(f"{what} is empty; give the option token ids.")
    if isinstance(options[0], (int, np.integer)):
        return [[int(o) for o in options]] * n  # type: ignore[union-attr]
    if len(options) != n:
        raise ValueError(f"{what}: give one id list shared by all pairs, or one list per pair ({n}), not {len(options)}.")
    return [[int(o) for o in opts] for opts in options]  # type: ignore[union-attr]


@torch.no_grad()
def _clean_runs(
    runs: CleanRuns,
    src_ids: list[list[int]],
    tgt_ids: list[list[int]],
    depths: list[int],
    n_blocks: int,
    readout,
) -> tuple[Tensor, np.ndarray, np.ndarray, np.ndarray]:
    """Unpatched residuals at ``depths`` (last position) of every distinct prompt,
    ``[depth, prompt]``, the row of each source in them, and the model's own output
    token (read at layer ``n_blocks``) of each source and each target."""
    # One clean run per distinct prompt (the control's sources are its targets too).
    distinct = {ids: k for k, ids in enumerate(dict.fromkeys(tuple(i) for i in src_ids + tgt_ids))}
    clean = runs(list(distinct))[depths]
    src_row = np.array([distinct[tuple(i)] for i in src_ids])
    tgt_row = np.array([distinct[tuple(i)] for i in tgt_ids])
    out_ids = readout(clean[depths.index(n_blocks)]).argmax(-1).cpu().numpy()
    return clean, src_row, out_ids[src_row], out_ids[tgt_row]


@torch.no_grad()
def _read_patched(
    readout, h: Tensor, pair_idx: np.ndarray, t_opts: list[list[int]], s_opts: list[list[int]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per patched row: the output token, its probability, and the probability mass
    on the target's and on the source's options."""
    out_id, out_p = np.empty(len(h), dtype=np.int64), np.empty(len(h))
    p_t, p_s = np.empty(len(h)), np.empty(len(h))
    for s in range(0, len(h), 64):  # vocabulary-sized rows a block at a time (Gemma: 262k entries each)
        probs = torch.softmax(readout(h[s : s + 64]), -1).cpu()
        top = probs.max(-1)
        out_id[s : s + 64], out_p[s : s + 64] = top.indices.numpy(), top.values.numpy()
        for r in range(s, s + len(probs)):
            p_t[r] = probs[r - s, t_opts[pair_idx[r]]].sum().item()
            p_s[r] = probs[r - s, s_opts[pair_idx[r]]].sum().item()
    return out_id, out_p, p_t, p_s


def _classify(
    out_id: np.ndarray,
    pair_idx: np.ndarray,
    t_opts: list[list[int]],
    s_opts: list[list[int]],
    tgt_out: np.ndarray,
    src_out: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``class`` and ``follows`` columns of :func:`patching_sweep`."""
    cls = np.array(
        [
            "target-option" if o in t_opts[p] else "source-option" if o in s_opts[p] else "other"
            for o, p in zip(out_id.tolist(), pair_idx.tolist())
        ],
        dtype=object,
    )
    same_t = out_id == tgt_out[pair_idx]
    same_s = out_id == src_out[pair_idx]
    follows = np.where(same_t & same_s, "both", np.where(same_t, "target", np.where(same_s, "source", "neither")))
    return cls, follows


@torch.no_grad()
def patching_sweep(
    model: Model,
    sources: Sequence[TokensLike],
    targets: Sequence[TokensLike],
    *,
    target_options: Sequence[int] | Sequence[Sequence[int]],
    source_options: Sequence[int] | Sequence[Sequence[int]],
    layers: Sequence[int] | None = None,
    batch_size: int = 16,
    progress: bool = True,
    clean: CleanRuns | None = None,
) -> pd.DataFrame:
    """Patch ``sources[i]`` into ``targets[i]`` at every layer of ``layers`` (default
    0..L) and classify what the target then predicts.

    ``target_options`` / ``source_options``: option token ids of each task (one list
    for all pairs, or one list per pair). A token in both sets counts as a
    target option. ``clean``: a :class:`CleanRuns` shared with sweeps of the same prompts.

    Returns one row per (pair, layer): ``pair, layer, output_id, output_token,
    output_prob, class`` (target-option / source-option / other),
    ``p_target_options`` and ``p_source_options`` (probability mass on each set),
    and ``follows``: whether the output equals the target's own unpatched output
    (``target``), the source's (``source``), both, or neither.
    """
    if len(sources) != len(targets):
        raise ValueError(f"Give one source per target: {len(sources)} sources, {len(targets)} targets.")
    if len(targets) == 0:
        raise ValueError("No pairs given.")
    n_blocks = model.info.n_blocks
    layers = list(range(n_blocks + 1)) if layers is None else check_layers(layers, n_blocks)
    n = len(targets)
    t_opts = _option_sets(target_options, n, "target_options")
    s_opts = _option_sets(source_options, n, "source_options")
    src_ids, tgt_ids = [_ids(model, s) for s in sources], [_ids(model, t) for t in targets]
    readout = LogitLens(model).readout

    depths = sorted(set(layers) | {n_blocks})
    runs = clean if clean is not None else CleanRuns(model, batch_size=batch_size)
    clean_h, src_row, src_out, tgt_out = _clean_runs(runs, src_ids, tgt_ids, depths, n_blocks, readout)
    pair_idx = np.repeat(np.arange(n), len(layers))
    layer_col = np.tile(np.array(layers), n)
    vectors = clean_h[[depths.index(l) for l in layer_col], src_row[pair_idx]]
    h = patched_final_residuals(model, [tgt_ids[p] for p in pair_idx], layer_col.tolist(), vectors, contexts=runs.contexts,
                                progress=progress)  # fmt: skip
    out_id, out_p, p_t, p_s = _read_patched(readout, h, pair_idx, t_opts, s_opts)
    cls, follows = _classify(out_id, pair_idx, t_opts, s_opts, tgt_out, src_out)
    return pd.DataFrame(
        {
            "pair": pair_idx.astype(np.int64),
            "layer": layer_col.astype(np.int64),
            "output_id": out_id.astype(np.int64),
            "output_token": TokenNames(model.tokenizer)(out_id),
            "output_prob": out_p,
            "class": cls,
            "p_target_options": p_t,
            "p_source_options": p_s,
            "follows": follows.astype(object),
        }
    )


def class_shares(sweep: pd.DataFrame, column: str = "class") -> pd.DataFrame:
    """Share of pairs in each category of ``column`` per layer (every category of
    :data:`CLASSES` or :data:`FOLLOWS` present, zeros included): ``[layer, <column>, share, n]``."""
    if column not in sweep.columns or "layer" not in sweep.columns:
        raise ValueError(f"The sweep frame needs columns 'layer' and {column!r}; it has {list(sweep.columns)}.")
    cats = CLASSES if column == "class" else FOLLOWS if column == "follows" else tuple(sorted(sweep[column].unique()))
    counts = pd.crosstab(sweep["layer"], sweep[column]).reindex(columns=list(cats), fill_value=0)
    n = counts.sum(axis=1)
    out = (counts.div(n, axis=0)).stack().rename("share").reset_index()
    out.columns = ["layer", column, "share"]
    out["n"] = out["layer"].map(n).astype(np.int64)
    return out


def _transition_from_matrix(to: np.ndarray, against: np.ndarray, layers: np.ndarray) -> float:
    """``to``/``against``: [pair, layer] 0/1 indicators. Earliest layer from which the
    share of ``to`` exceeds that of ``against`` at every later layer."""
    ahead = to.mean(0) > against.mean(0)
    if not ahead[-1]:
        return float("nan")
    behind = np.flatnonzero(~ahead)
    first = 0 if len(behind) == 0 else behind[-1] + 1
    return float(layers[first])


def transition_layer(
    sweep: pd.DataFrame,
    *,
    column: str = "class",
    to: str = "source-option",
    against: str = "target-option",
    n_boot: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
    min_n: int = MIN_N,
) -> dict[str, float]:
    """The layer where patching starts to carry the source's answer: the earliest
    layer from which the share of pairs whose output is ``to`` stays above the share
    that is ``against`` at every later layer (NaN if that never holds at the last
    layer swept). The interval resamples pairs (percentile bootstrap,
    :func:`depthkit.stats.bootstrap_layer`); ``mode_share``, ``censored_share`` (the
    last layer swept, the output) and ``step`` as in :class:`depthkit.stats.LayerCI`.

    For a random-source control of the same task use ``column="follows", to="source",
    against="target"``.
    """
    from depthkit.stats import bootstrap_layer

    need = {"pair", "layer", column}
    if not need <= set(sweep.columns):
        raise ValueError(f"The sweep frame needs columns {sorted(need)}; it has {list(sweep.columns)}.")
    wide = sweep.pivot(index="pair", columns="layer", values=column).sort_index(axis=1)
    if wide.isna().any().any():
        raise ValueError("Every pair needs a row at every layer swept.")
    layers = wide.columns.to_numpy()
    to_m = (wide.to_numpy() == to).astype(float)
    ag_m = (wide.to_numpy() == against).astype(float)

    def stat(idx: np.ndarray) -> float:
        i = idx.astype(np.int64)
        return _transition_from_matrix(to_m[i], ag_m[i], layers)

    # A resample in which the shares never cross gives NaN, and then so does the
    # interval: an interval never hides that the crossing is unstable.
    ci = bootstrap_layer(
        np.arange(len(wide), dtype=float),
        stat,
        n_boot=n_boot,
        seed=seed,
        level=level,
        min_n=min_n,
        grid=layers,
        censor_at=float(layers.max()),
    )
    return {
        "transition_layer": ci.estimate,
        "lo": ci.lo,
        "hi": ci.hi,
        "n_pairs": int(len(wide)),
        "mode_share": ci.mode_share,
        "censored_share": ci.censored_share,
        "step": ci.step,
    }
