"""Reference solutions of the exercises, one function per exercise stub.

Each function has the name and signature of the stub a student fills in, and its
source is what the book shows (folded) under "Solution": so every solution uses
only what the exercise notebooks import (``np``, ``pd``, ``torch``) and, where an
exercise builds on an earlier one, the earlier function by its name. The test
suite checks each one against depthkit's own implementation.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

__all__ = ["flip_rate", "frequency_bucket", "logit_lens", "onset_layer", "patched_logit_diff", "readout"]


# ------------------------------------------------------------ 00: the logit lens


def readout(model, resid: torch.Tensor) -> torch.Tensor:
    """Logits [..., d_vocab] of residual vectors [..., d_model]: the model's
    own final norm, then its unembedding (what the model does to its last
    residual)."""
    return model.unembed(model.ln_final(resid))


def logit_lens(model, tokens: torch.Tensor, layer: int) -> torch.Tensor:
    """The logit lens at `layer` for token ids [batch, seq]: logits
    [batch, seq, d_vocab]. Layer 0 is the embedding output, layer l the
    input of block l, layer L the output of the last block."""
    n_blocks = model.cfg.n_layers
    if layer < n_blocks:
        name = f"blocks.{layer}.hook_resid_pre"  # the input of block `layer`
    else:  # there is no block L: layer L is the output of the last block
        name = f"blocks.{n_blocks - 1}.hook_resid_post"
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=name)
    return readout(model, cache[name])


# ------------------------------------------------------ 01: buckets and flips


def frequency_bucket(ranks: np.ndarray) -> np.ndarray:
    """The frequency bucket of each corpus rank (1 = most frequent token).
    Upper edges are inclusive: rank 10 is one of the top 10."""
    ranks = np.asarray(ranks)
    return np.select(
        [ranks <= 10, ranks <= 100, ranks <= 1000],
        ["Top 1-10", "11-100", "101-1000"],
        "rest",
    )


def flip_rate(steps: pd.DataFrame) -> pd.DataFrame:
    """Per layer and bucket of the layer's top-1: the share of predictions
    whose top-1 differs from the final one (the top-1 at the deepest layer).
    Returns [layer, bucket, flip_rate] for the pairs that occur."""
    deepest = steps["layer"] == steps["layer"].max()
    final = steps.loc[deepest, ["item", "top1_id"]]
    rows = steps.merge(final.rename(columns={"top1_id": "final_id"}), on="item")
    rows["flipped"] = rows["top1_id"] != rows["final_id"]
    by = rows.groupby(["layer", "bucket"], observed=True)  # pairs that occur
    return by["flipped"].mean().rename("flip_rate").reset_index()


# ----------------------------------------------------- 02: activation patching


def patched_logit_diff(model, source: torch.Tensor, target: torch.Tensor,
                       layer: int, good: int, bad: int,
                       position: int = -1) -> float:
    """Write source's residual at (layer, position) into target's run at the
    same place; return logit(good) - logit(bad) at target's last position."""
    n_blocks = model.cfg.n_layers
    if layer < n_blocks:
        name = f"blocks.{layer}.hook_resid_pre"
    else:
        name = f"blocks.{n_blocks - 1}.hook_resid_post"
    with torch.no_grad():
        _, cache = model.run_with_cache(source, names_filter=name)
        vector = cache[name][:, position].clone()

        def write(resid: torch.Tensor, hook) -> torch.Tensor:
            resid[:, position] = vector  # one position: the rest is target's
            return resid

        logits = model.run_with_hooks(target, fwd_hooks=[(name, write)])
    return float(logits[0, -1, good] - logits[0, -1, bad])


# --------------------------------------------------------------- 04: onsets


def onset_layer(ranks, k: int = 1) -> int | None:
    """The earliest layer l >= 1 with ranks[l] <= k (ranks[l]: the target's
    rank at layer l = 0..L), or None if there is none. Layer 0 is the
    embedding read through the lens, before any block: not depth."""
    for layer in range(1, len(ranks)):
        if ranks[layer] <= k:
            return layer
    return None


SOLUTIONS = {
    f.__name__: f
    for f in (readout, logit_lens, frequency_bucket, flip_rate, patched_logit_diff, onset_layer)
}
