"""The residual stream itself, layer by layer: how large each block's update is,
which way it points, what removing it does, and where the regime changes.

Notation (canonical layers, see :mod:`depthkit.lens.base`): ``h_ℓ`` is the residual
stream entering block ``ℓ`` (``h_0`` = embeddings, ``h_L`` = final residual).
Block ``ℓ`` writes ``Δ_ℓ = h_{ℓ+1} - h_ℓ``, the sum of its attention update
``Δ^attn_ℓ = m_ℓ - h_ℓ`` and its MLP update ``Δ^mlp_ℓ = h_{ℓ+1} - m_ℓ``, where
``m_ℓ`` is the stream between the two sublayers (``hook_resid_mid``).

Updates are taken as *differences of residuals* (``hook_resid_pre``,
``hook_resid_mid``, ``hook_resid_post``) rather than read from
``hook_attn_out``/``hook_mlp_out``: in the llama bridge the two agree, but in
Gemma 3 the sublayer output is normalised again (``post_attention_layernorm``)
before it is added, and the difference is what the stream actually receives
(checked on the llama and gemma3 bridges: both identities hold to 1e-7).

Statistics are per text (mean over its positions), so that every curve comes
with a bootstrap over texts. The first position of every text is left out: it
is the attention-sink position whose residual norm is an outlier by orders of
magnitude in most models and has no context to refine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from depthkit.engine.capture import Item, block_maps, length_batches, residual_runs
from depthkit.lens.base import LogitLens
from depthkit.lens.trajectories import Trajectories, encode
from depthkit.stats import MIN_N, LayerEstimate, curve_estimate, narrate, two_segment_fit

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

# ---------------------------------------------------------------------------
# Running text as items


def sample_passages(passages: Sequence[str], n: int, *, seed: int = 0, min_chars: int = 400) -> list[str]:
    """``n`` distinct passages of at least ``min_chars`` characters, in an order
    shuffled with ``seed`` (long passages, so that every text gives many positions)."""
    unique = [p for p in dict.fromkeys(passages) if isinstance(p, str) and len(p) >= min_chars]
    if len(unique) < n:
        raise ValueError(
            f"Only {len(unique)} distinct passages have at least {min_chars} characters; ask for n <= {len(unique)}."
        )
    order = np.random.default_rng(seed).permutation(len(unique))[:n]
    return [unique[i] for i in order]


def passage_items(
    model: Model,
    texts: Sequence[str],
    *,
    max_tokens: int = 128,
    min_tokens: int = 16,
    skip_first: int = 1,
) -> list[Item]:
    """Items for running text: the first ``max_tokens`` tokens of every text, with
    every position from ``skip_first`` on that has a next token, and the true next
    token as target ``"next"`` (so lens trajectories also report its rank).

    Texts shorter than ``min_tokens`` tokens are dropped; an error says so if none
    is left.
    """
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be at least 2 (a token and its successor), got {max_tokens}.")
    if not 0 <= skip_first < max_tokens - 1:
        raise ValueError(f"skip_first must be between 0 and max_tokens - 2 = {max_tokens - 2}, got {skip_first}.")
    if len(texts) == 0:
        raise ValueError("No texts given: pass a list of passages, e.g. depthkit.data.embedded.wikipedia_passages()[:24].")
    items = []
    for text in texts:
        ids = encode(model, text, on_overflow="error")[:max_tokens]
        if len(ids) < max(min_tokens, skip_first + 2):
            continue
        pos = list(range(skip_first, len(ids) - 1))
        items.append(Item(ids, pos, {"next": [ids[p + 1] for p in pos]}))
    if not items:
        raise ValueError(
            f"All {len(texts)} texts are shorter than min_tokens={min_tokens} tokens; lower min_tokens or pass longer texts."
        )
    return items


# ---------------------------------------------------------------------------
# Update sizes and directions


UPDATE_STATS = (
    "norm_h",
    "attn_rel",
    "mlp_rel",
    "block_rel",
    "cos_attn",
    "cos_mlp",
    "cos_update",
    "block_influence",
)


def _cos(a: Tensor, b: Tensor) -> Tensor:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-12)


def update_stats_from_residuals(
    h_pre: Float[Tensor, "pos d_model"],
    h_mid: Float[Tensor, "pos d_model"],
    h_post: Float[Tensor, "pos d_model"],
) -> dict[str, Tensor]:
    """Per-position statistics of one block from its three residuals.

    ``attn_rel = ‖m - h‖/‖h‖``, ``mlp_rel = ‖h' - m‖/‖m‖`` (each sublayer relative
    to the stream it adds to), ``block_rel = ‖h' - h‖/‖h‖``, cosines of each update
    with the stream it adds to, and block influence ``1 - cos(h, h')``.
    """
    h, m, hp = h_pre.double(), h_mid.double(), h_post.double()
    d_attn, d_mlp, d = m - h, hp - m, hp - h
    nh, nm = h.norm(dim=-1), m.norm(dim=-1)
    return {
        "norm_h": nh,
        "attn_rel": d_attn.norm(dim=-1) / nh,
        "mlp_rel": d_mlp.norm(dim=-1) / nm,
        "block_rel": d.norm(dim=-1) / nh,
        "cos_attn": _cos(d_attn, h),
        "cos_mlp": _cos(d_mlp, m),
        "cos_update": _cos(d, h),
        "block_influence": 1.0 - _cos(h, hp),
    }


@torch.no_grad()
def update_stats(model: Model, items: Sequence[Item], *, batch_size: int = 8, progress: bool = True) -> pd.DataFrame:
    """Per (item, block): the mean over the item's positions of every statistic in
    :data:`UPDATE_STATS` (see :func:`update_stats_from_residuals`), plus
    ``n_positions``. Row ``block = ℓ`` describes the block that reads ``h_ℓ`` and
    writes ``h_{ℓ+1}``.

    Memory: one batch's residuals at its positions of interest, three per block
    (3·L·rows vectors), are held at a time.
    """
    n_blocks = model.info.n_blocks
    frames = []
    bar = tqdm(total=len(items), desc="update norms", unit="text", disable=not progress, leave=False)
    batches = length_batches(items, batch_size)
    stats = block_maps(
        model, [[items[i] for i in batch] for batch in batches], lambda b, pre, mid, post: update_stats_from_residuals(pre, mid, post)
    )
    for batch, sums in zip(batches, stats):
        chunk = [items[i] for i in batch]
        item_of_row = np.repeat(np.array(batch), [len(it.positions) for it in chunk])
        for b in range(n_blocks):
            df = pd.DataFrame({k: v.cpu().numpy() for k, v in sums[b].items()})
            df["item"] = item_of_row
            df["block"] = b
            frames.append(df)
        bar.update(len(batch))
    bar.close()
    per_pos = pd.concat(frames, ignore_index=True)
    out = per_pos.groupby(["item", "block"], sort=True)[list(UPDATE_STATS)].mean()
    out["n_positions"] = per_pos.groupby(["item", "block"], sort=True).size()
    return out.reset_index()


# ---------------------------------------------------------------------------
# Transition estimates


def split_estimator(kind: str = "hinge", min_points: int = 2) -> Callable[[np.ndarray, np.ndarray], float]:
    """``estimator`` for :func:`depthkit.stats.curve_estimate` returning the two-segment split."""
    return lambda x, y: two_segment_fit(x, y, kind=kind, min_points=min_points).split


# ---------------------------------------------------------------------------
# Lens curves per text (from a Trajectories with positions="all")


def kl_by_layer(traj: Trajectories) -> pd.DataFrame:
    """Per (item, layer): mean KL(p_L ‖ q_ℓ) over the item's positions, in nats."""
    return traj.steps.groupby(["item", "layer"], sort=True)["kl_to_final"].mean().rename("kl").reset_index()


def top_share_by_layer(traj: Trajectories, token_rank: Callable[[np.ndarray], np.ndarray], *, top: int = 10) -> pd.DataFrame:
    """Per (item, layer): share of the item's positions whose lens top-1 token is
    among the ``top`` most frequent tokens. ``token_rank`` maps token ids to corpus
    frequency ranks (1 = most frequent)."""
    steps = traj.steps
    in_top = token_rank(steps["top1_id"].to_numpy()) <= top
    return (
        steps.assign(in_top=in_top).groupby(["item", "layer"], sort=True)["in_top"].mean().rename(f"top{top}_share").reset_index()
    )


# ---------------------------------------------------------------------------
# Layer skipping


def _chunked_kl_agree(
    readout: Callable[[Tensor], Tensor], h_full: Tensor, h_skip: Tensor, budget_mb: float
) -> tuple[Tensor, Tensor]:
    """Per position: KL(p_full ‖ p_skip) and whether the top-1 tokens agree, with at
    most ~``budget_mb`` of vocabulary-sized tensors alive."""
    probe = readout(h_full[:1])
    per_pos = probe.shape[-1] * 4 * 4
    chunk = max(1, int(budget_mb * 2**20 // per_pos))
    kls, agree = [], []
    for s in range(0, h_full.shape[0], chunk):
        lf = torch.log_softmax(readout(h_full[s : s + chunk]).double(), -1)
        ls = torch.log_softmax(readout(h_skip[s : s + chunk]).double(), -1)
        kls.append((lf.exp() * (lf - ls)).sum(-1).clamp_min(0.0))
        agree.append(lf.argmax(-1) == ls.argmax(-1))
    return torch.cat(kls), torch.cat(agree)


@torch.no_grad()
def skip_block_effects(
    model: Model,
    items: Sequence[Item],
    *,
    blocks: Sequence[int] | None = None,
    batch_size: int = 8,
    budget_mb: float = 256.0,
    progress: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Remove one block's update at a time (``h_{b+1} := h_b``, the rest of the
    forward pass unchanged) and measure what changes.

    Returns ``(later, output)``:

    * ``later``: per (skipped block, layer ℓ > b): mean over positions of the
      relative change ``‖h'_ℓ - h_ℓ‖ / ‖h_ℓ‖`` of the residual stream;
    * ``output``: per skipped block: mean KL(p ‖ p') of the model's output
      distribution in nats, and the share of positions whose top-1 token is
      unchanged (``top1_agreement``).

    One extra forward pass per block and batch.
    """
    n_blocks = model.info.n_blocks
    blocks = list(range(n_blocks)) if blocks is None else [int(b) for b in blocks]
    for b in blocks:
        if not 0 <= b < n_blocks:
            raise ValueError(f"Block {b} does not exist; the model has blocks 0..{n_blocks - 1}.")
    readout = LogitLens(model).readout
    change_sum = torch.zeros(len(blocks), n_blocks + 1, dtype=torch.float64)
    kl_sum = torch.zeros(len(blocks), dtype=torch.float64)
    agree_sum = torch.zeros(len(blocks), dtype=torch.float64)
    n_pos = 0
    bar = tqdm(total=len(items) * len(blocks), desc="skip blocks", unit="pass", disable=not progress, leave=False)
    for batch in length_batches(items, batch_size):
        chunk = [items[i] for i in batch]
        # The plain pass and one pass per removed block, handed to the backend together.
        passes = residual_runs(model, [(chunk, None)] + [(chunk, b) for b in blocks])
        base = next(passes)
        base_norm = base.double().norm(dim=-1)
        for j, skipped in enumerate(passes):
            rel = (skipped.double() - base.double()).norm(dim=-1) / base_norm
            change_sum[j] += rel.sum(-1)
            kl, agree = _chunked_kl_agree(readout, base[-1], skipped[-1], budget_mb)
            kl_sum[j] += kl.sum()
            agree_sum[j] += agree.double().sum()
            bar.update(len(batch))
        n_pos += base.shape[1]
    bar.close()
    return _skip_frames(blocks, n_blocks, change_sum, kl_sum, agree_sum, n_pos)


def _skip_frames(
    blocks: list[int], n_blocks: int, change_sum: Tensor, kl_sum: Tensor, agree_sum: Tensor, n_pos: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(later, output)`` of :func:`skip_block_effects` from its sums over positions."""
    rows = [
        {"skipped": b, "layer": l, "rel_change": float(change_sum[j, l] / n_pos)}
        for j, b in enumerate(blocks)
        for l in range(b + 1, n_blocks + 1)
    ]
    later = pd.DataFrame(rows, columns=["skipped", "layer", "rel_change"])
    output = pd.DataFrame(
        {
            "skipped": blocks,
            "kl": (kl_sum / n_pos).numpy(),
            "top1_agreement": (agree_sum / n_pos).numpy(),
            "n_positions": n_pos,
        }
    )
    return later, output


def _fit_frame(per_item: pd.DataFrame, value: str, blocks: Sequence[int] | None, log: bool) -> pd.DataFrame:
    if "block" not in per_item.columns:
        raise ValueError("per_item must be the output of update_stats (it needs a 'block' column).")
    n_blocks = int(per_item["block"].max()) + 1
    keep = list(range(1, n_blocks - 1)) if blocks is None else [int(b) for b in blocks]
    sub = per_item[per_item["block"].isin(keep)]
    if log and (sub[value] > 0).all():
        sub = sub.assign(**{value: np.log(sub[value])})
    return sub


def phase_change(
    per_item: pd.DataFrame,
    value: str = "block_rel",
    *,
    blocks: Sequence[int] | None = None,
    log: bool = True,
    kind: str = "hinge",
    n_boot: int = 1000,
    seed: int = 0,
    min_n: int = MIN_N,
) -> LayerEstimate:
    """The phase-change layer ℓ*: the two-segment split of the mean curve of a
    per-block statistic (output of :func:`update_stats`), with a bootstrap interval
    over texts.

    ``blocks`` defaults to the interior blocks ``1..L-2``: block 0 reads the raw
    embeddings (its relative update is an order of magnitude larger than any other)
    and the last block prepares the unembedding; either would decide the fit alone.
    ``log`` fits ``log(value)`` so that a change of *rate* counts, not of scale
    (non-positive statistics such as cosines are fitted as they are).
    """
    sub = _fit_frame(per_item, value, blocks, log)
    return curve_estimate(sub, value, split_estimator(kind), by="block", name=value, n_boot=n_boot, seed=seed, min_n=min_n)


@dataclass(frozen=True)
class PhaseTest:
    """Whether two segments describe a curve better than one line: the split ℓ*, the
    change of slope there (right minus left, per block) with its interval over
    texts, and the range of knots the fit could choose."""

    split: LayerEstimate
    slope_change: LayerEstimate
    first_knot: float
    last_knot: float
    DIGITS: ClassVar[int] = 3  # of the slope change in chapter 05's sentence, which judges it at them

    @property
    def at_edge(self) -> bool:
        """The split sits on the first or last knot the fit allows: no interior change."""
        return self.split.estimate in (self.first_knot, self.last_knot)

    @property
    def two_segments(self) -> bool:
        """A phase change is supported: an interior split and a slope change whose
        interval excludes zero, as chapter 05 prints it."""
        return not self.at_edge and narrate.excludes_zero(self.slope_change.lo, self.slope_change.hi, digits=self.DIGITS)

    def as_frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {
                    "statistic": self.split.name,
                    "split": self.split.estimate,
                    "split_lo": self.split.lo,
                    "split_hi": self.split.hi,
                    "slope_change": self.slope_change.estimate,
                    "slope_change_lo": self.slope_change.lo,
                    "slope_change_hi": self.slope_change.hi,
                    "first_knot": self.first_knot,
                    "last_knot": self.last_knot,
                    "at_edge": self.at_edge,
                    "two_segments": self.two_segments,
                    "n": self.split.n,
                }
            ]
        )


def phase_test(
    per_item: pd.DataFrame,
    value: str = "block_rel",
    *,
    blocks: Sequence[int] | None = None,
    log: bool = True,
    n_boot: int = 1000,
    seed: int = 0,
    min_n: int = MIN_N,
) -> PhaseTest:
    """Two segments against one (hinge fit, as :func:`phase_change`): the split,
    the slope change at the split with its interval (texts resampled, the knot
    re-chosen in every resample), and whether the split is interior."""
    sub = _fit_frame(per_item, value, blocks, log)

    def change(x: np.ndarray, y: np.ndarray) -> float:
        fit = two_segment_fit(x, y, kind="hinge")
        return fit.slope_right - fit.slope_left

    split = curve_estimate(sub, value, split_estimator("hinge"), by="block", name=value, n_boot=n_boot, seed=seed, min_n=min_n)
    slope = curve_estimate(sub, value, change, by="block", name=f"slope change of {value}", n_boot=n_boot, seed=seed, min_n=min_n)
    knots = sorted(sub["block"].unique())
    # the hinge fit keeps two points on each side, the knot counted on both
    return PhaseTest(split, slope, float(knots[1]), float(knots[-2]))
