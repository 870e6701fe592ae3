"""Early exit: stop the forward pass at layer ℓ and read the prediction out
through a lens (the paper's early-exit analysis).

:func:`exit_logits` really truncates the forward pass
(:func:`~depthkit.engine.capture.truncated_residuals`): it is what a deployed early-exit model computes. Layer ℓ's
residual does not depend on the blocks after it, so the residual a truncated pass
ends with is exactly the one a full pass holds at ℓ; a sweep over every layer
therefore reads all exits from one full pass (:func:`early_exit_table`, on a
:class:`~depthkit.lens.trajectories.Trajectories`), and the tests check that both
agree.

Compute used at exit ℓ is counted as the fraction of transformer blocks run,
ℓ / L (the embedding lookup is negligible; the readout costs one unembedding
whichever layer exits).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from depthkit.engine.capture import Item, batch_tensors, model_logits, truncated_residuals
from depthkit.lens.base import DEFAULT_LENS, Lens
from depthkit.lens.registry import get_lens
from depthkit.lens.trajectories import Trajectories, make_items

if TYPE_CHECKING:
    from depthkit.engine.handle import Model


@torch.no_grad()
def exit_logits(
    model: Model,
    prompts: Sequence[str] | Sequence[Item],
    layer: int,
    *,
    lens: str | Lens = DEFAULT_LENS,
    **lens_kwargs,
) -> Float[Tensor, "position d_vocab"]:
    """Logits of an early exit at ``layer`` for the positions of interest of
    ``prompts`` (last token of each prompt by default), in item order.

    The forward pass stops before block ``layer`` (``truncated_residuals``); the residual
    there is decoded with the lens's translator for that layer (the canonical
    convention). ``layer = L`` runs the whole model and gives exactly its logits.
    """
    n_blocks = model.info.n_blocks
    if not 0 <= int(layer) <= n_blocks:
        raise ValueError(f"layer must lie in 0..{n_blocks} (0 = embeddings, {n_blocks} = full model), got {layer}.")
    if len(prompts) == 0:
        raise ValueError("No prompts given.")
    items = list(prompts) if isinstance(prompts[0], Item) else make_items(model, prompts)  # type: ignore[arg-type]
    lens_obj = get_lens(model, lens, **lens_kwargs)
    tokens, mask, bi, pi = batch_tensors(model, items)
    if layer == n_blocks:
        logits = model_logits(model, tokens, mask)
        return logits[bi, pi].float()
    h = truncated_residuals(model, tokens, int(layer), mask)
    return lens_obj(h[bi, pi].float(), int(layer)).float()


def _choice_frame(traj: Trajectories, options: Sequence[str]) -> pd.DataFrame:
    """Per (item, position, layer): index of the most probable of the named option targets."""
    t = traj.targets[traj.targets["target"].isin(options)]
    if t["target"].nunique() != len(options):
        missing = sorted(set(options) - set(t["target"].unique()))
        raise ValueError(
            f"Option targets {missing} are not in the trajectories; it has {sorted(traj.targets['target'].unique())}."
        )
    wide = t.pivot_table(index=["item", "position", "layer"], columns="target", values="prob")[list(options)]
    return pd.DataFrame({"choice": wide.to_numpy().argmax(1)}, index=wide.index).reset_index()


def _gold_choice(traj: Trajectories, gold: str, options: Sequence[str]) -> pd.Series:
    """Per (item, position), the index in ``options`` of the option whose token is the
    gold one (``gold_choice``)."""
    opt_ids = traj.targets[traj.targets["target"].isin(options)].pivot_table(
        index=["item", "position"], columns="target", values="token_id", aggfunc="first"
    )[list(options)]
    gold_ids = traj.target(gold).drop_duplicates(["item", "position"]).set_index(["item", "position"])["token_id"]
    hits = [np.flatnonzero(opt_ids.loc[k].to_numpy() == gold_ids.loc[k]) for k in opt_ids.index]
    missing = [k for k, h in zip(opt_ids.index, hits) if len(h) == 0]
    if missing:
        raise ValueError(
            f"The gold token is not among the option tokens for (item, position) {missing[:5]}; "
            "give a gold target that is one of the options."
        )
    return pd.Series([int(h[0]) for h in hits], index=opt_ids.index, name="gold_choice")


def early_exit_table(
    traj: Trajectories,
    *,
    gold: str | None = None,
    options: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Agreement with the full model and task accuracy of an exit at every layer.

    ``traj``: trajectories in the canonical convention (layer ℓ read with
    translator ℓ, layer L = the model). ``gold``: name of a target holding the
    right answer's token id; ``options``: names of targets holding the option token
    ids (in the same order for every item), for tasks scored by the most probable
    option.

    Returns per layer: ``compute_fraction`` (ℓ / L), ``agreement`` (lens top-1 equals
    the model's top-1), with ``gold``: ``accuracy`` (lens top-1 is the gold token),
    with ``options``: ``choice_agreement`` (most probable option equals the model's),
    and with both: ``choice_accuracy`` (most probable option is the gold one); plus
    ``n`` predictions.
    """
    if traj.convention != "canonical":
        raise ValueError("Early exit reads layer ℓ with translator ℓ: compute the trajectories with convention='canonical'.")
    L = traj.n_blocks
    keys = ["item", "position", "layer"]
    final = traj.target("final")[keys + ["rank"]].rename(columns={"rank": "final_rank"})
    df = final.copy()
    df["agree"] = df["final_rank"] == 1
    if gold is not None:
        g = traj.target(gold)[keys + ["rank", "token_id"]].rename(columns={"rank": "gold_rank", "token_id": "gold_id"})
        df = df.merge(g, on=keys)
        df["correct"] = df["gold_rank"] == 1
    if options:
        ch = _choice_frame(traj, options)
        at_final = ch[ch["layer"] == L][["item", "position", "choice"]].rename(columns={"choice": "final_choice"})
        ch = ch.merge(at_final, on=["item", "position"])
        df = df.merge(ch, on=keys)
        df["choice_agree"] = df["choice"] == df["final_choice"]
        if gold is not None:
            df = df.merge(_gold_choice(traj, gold, options).reset_index(), on=["item", "position"])
            df["choice_correct"] = df["choice"] == df["gold_choice"]
    agg = {"agreement": ("agree", "mean"), "n": ("agree", "size")}
    if gold is not None:
        agg["accuracy"] = ("correct", "mean")
    if options:
        agg["choice_agreement"] = ("choice_agree", "mean")
        if gold is not None:
            agg["choice_accuracy"] = ("choice_correct", "mean")
    out = df.groupby("layer", sort=True).agg(**agg).reset_index()
    out.insert(1, "compute_fraction", out["layer"] / L)
    out["n"] = out["n"].astype(np.int64)
    return out
