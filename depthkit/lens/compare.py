"""Several lenses on the same prompts, side by side (chapter 00's comparison)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from depthkit.engine.capture import collect_residuals, length_batches
from depthkit.lens.base import LayerStep, Lens, layer_plan
from depthkit.lens.decode import _Decoded, decode_residuals
from depthkit.lens.prompts import make_items

if TYPE_CHECKING:
    from depthkit.engine.handle import Model


def compare_lenses(
    model: Model,
    prompts: Sequence[str],
    lenses: Mapping[str, Lens],
    *,
    frequent_ids: Sequence[int] = (),
    convention: str = "canonical",
    batch_size: int = 16,
    on_overflow: Literal["error", "truncate"] = "error",
    progress: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Decode the last position of every prompt through each lens, with one forward
    pass for all lenses (the trajectory engine's residual collection and decoding).

    Returns ``(per_layer, steps)``: ``per_layer`` is DataFrame[lens, layer, kl,
    top1_agreement, frequent_share, n] — mean KL(final ‖ lens), share of prompts
    whose lens top-1 equals the model's final top-1, and share whose top-1 is in
    ``frequent_ids`` (e.g. the corpus's Top-10 tokens); ``steps`` has one row per
    (lens, item, layer): top1_id, top1_prob, kl_to_final, final_id, agrees, frequent."""
    if not lenses:
        raise ValueError("compare_lenses needs at least one lens, e.g. {'logit': LogitLens(model)}.")
    items = make_items(model, list(prompts), positions="last", on_overflow=on_overflow)
    n_blocks = model.info.n_blocks
    plan = layer_plan(n_blocks, convention)  # type: ignore[arg-type]
    needed = sorted({s.layer for s in plan} | {n_blocks})
    local = [LayerStep(needed.index(s.layer), s.translator) for s in plan]
    layer_ids = np.array([s.layer for s in plan])
    frequent = np.asarray(list(frequent_ids), dtype=np.int64)
    frames = []
    bar = tqdm(total=len(items), desc=f"{len(lenses)} lenses", unit="prompt", disable=not progress, leave=False)
    for batch in length_batches(items, batch_size):
        resid = collect_residuals(model, [items[i] for i in batch], needed)
        for name, lens in lenses.items():
            dec = decode_residuals(lens, local, resid, None, top_k=1)
            frames.append(_lens_frame(name, dec, batch, layer_ids, frequent))
        bar.update(len(batch))
    bar.close()
    steps = pd.concat(frames, ignore_index=True)
    steps["lens"] = pd.Categorical(steps["lens"], categories=list(lenses))
    steps = steps.sort_values(["lens", "item", "layer"], kind="stable").reset_index(drop=True)
    steps["lens"] = steps["lens"].astype(str)
    per_layer = (
        steps.groupby(["lens", "layer"], sort=False)
        .agg(
            kl=("kl_to_final", "mean"), top1_agreement=("agrees", "mean"), frequent_share=("frequent", "mean"), n=("item", "size")
        )
        .reset_index()
    )
    return per_layer, steps


def _lens_frame(name: str, dec: _Decoded, batch: list[int], layer_ids: np.ndarray, frequent: np.ndarray) -> pd.DataFrame:
    """The ``steps`` rows of one lens on one batch (one position per item)."""
    n_steps, n_pos = dec.kl.shape
    top1 = dec.top_ids[..., 0].reshape(-1).numpy()
    final = np.tile(dec.final_top1.numpy(), n_steps)
    return pd.DataFrame(
        {
            "lens": name,
            "item": np.tile(np.array(batch), n_steps),
            "layer": np.repeat(layer_ids, n_pos),
            "top1_id": top1,
            "top1_prob": dec.top_probs[..., 0].reshape(-1).numpy(),
            "kl_to_final": dec.kl.reshape(-1).numpy(),
            "final_id": final,
            "agrees": top1 == final,
            "frequent": np.isin(top1, frequent),
        }
    )
