"""Chapter 02's early exit: the option an exit after each layer would choose, read
canonically (translator ℓ after ℓ blocks), and how early it agrees with the full model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from depthkit.analyses import early_exit, mcq
from depthkit.chapters.ch02_layers import DECIDE_LEVEL, share_ci
from depthkit.stats import narrate

if TYPE_CHECKING:
    from depthkit.engine.handle import Model


def early_exits(trajs: Mapping[str, Any], model: Model | None = None, prompts: pd.DataFrame | None = None, lens=None) -> pd.DataFrame:
    """Every task's early-exit table. An exit after ℓ blocks reads that residual with
    translator ℓ (the canonical convention), so trajectories read in the authors'
    convention are read again canonically, from ``model``, ``prompts`` and ``lens``."""
    if any(tr.convention != "canonical" for tr in trajs.values()):
        if model is None or prompts is None:
            raise ValueError("These trajectories are not in the canonical convention; pass model, prompts and lens to read the exits.")
        _, trajs = mcq.option_ranks(model, prompts, lens=lens, convention="canonical", return_trajectories=True)

    def options(tr) -> list[str]:
        return sorted([t for t in tr.targets["target"].unique() if t.startswith("opt")], key=lambda s: int(s[3:]))

    return pd.concat([early_exit.early_exit_table(tr, gold="gold", options=options(tr)).assign(task=t) for t, tr in trajs.items()], ignore_index=True)


def early_exit_summary(exits: pd.DataFrame, n_blocks: int, *, n_boot: int, seed: int) -> str:
    lines = []
    for t, g in exits.groupby("task", sort=False):
        g = g.set_index("layer")
        first = mcq.first_layer_reaching(g["choice_agreement"].to_numpy(), g.index.to_numpy(), DECIDE_LEVEL, stay=True)
        n, half = int(g.loc[n_blocks, "n"]), n_blocks // 2

        def share(layer: int, col: str) -> str:
            return narrate.share(*share_ci(g.loc[layer, col], n, n_boot=n_boot, seed=seed)[:3], digits=0)

        reach = ("never agrees with the full model's for 90% of prompts before the output" if not np.isfinite(first) or first >= n_blocks
                 else f"agrees with the full model's for at least 90% of prompts from layer {int(first)} on "
                      f"({g.loc[int(first), 'compute_fraction']:.0%} of the blocks)")
        lines.append(
            f"* **{t}**: the exit's chosen option {reach}. Option accuracy: {share(half, 'choice_accuracy')} at half depth, "
            f"{share(n_blocks, 'choice_accuracy')} for the full model (n = {n}); the exit's top-1 token equals the full model's "
            f"for {share(half, 'agreement')} of prompts at half depth."
        )
    return "\n".join(lines)
