"""Held-out metrics of a lens (mean KL to the final distribution and top-1
agreement, per layer) and the logit budget they share with tuned-lens training:
how many layers' logits are stacked into one unembedding product.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from depthkit.lens.base import Lens, Readout, TunedLens

# Positions per chunk of the held-out metrics.
EVAL_CHUNK = 256
# Most float32 logits alive at once, in training and in the held-out metrics.
# Layers are stacked into one unembedding product up to this size: on two CPU cores
# a product of ~2,500 rows runs about a third faster than one per layer's 128.
LOGIT_BUDGET_MB = 512.0


def layer_groups(n_layers: int, rows: int, d_vocab: int, budget_mb: float | None = None) -> list[range]:
    """Consecutive layers whose logits for ``rows`` positions fit ``budget_mb``
    (default :data:`LOGIT_BUDGET_MB`) together, at least one layer a group."""
    budget = LOGIT_BUDGET_MB if budget_mb is None else budget_mb
    size = max(1, min(n_layers, int(budget * 2**20 // (4 * rows * d_vocab))))
    return [range(a, min(n_layers, a + size)) for a in range(0, n_layers, size)]


def _product_rows(n_layers: int, rows: Sequence[int], d_vocab: int) -> tuple[int, ...]:
    """Row counts of the stacked unembedding products for chunks of ``rows`` positions
    (what the bfloat16 probe must run)."""
    return tuple(sorted({len(g) * r for r in rows if r > 0 for g in layer_groups(n_layers, r, d_vocab)}))


def _dtype_check_positions(n_held: int) -> int:
    """Positions of the float32 cross-check of bfloat16 metrics: a float32 pass costs
    as much as several bfloat16 ones, so 16 for the smoke budget, 128 by default."""
    return min(n_held, 128, max(16, n_held // 16))


@torch.no_grad()
def heldout_metrics(
    lens: Lens,
    resid: Float[Tensor, "depth n d_model"],
    *,
    chunk: int = EVAL_CHUNK,
    dtype: torch.dtype = torch.float32,
    variants: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Per layer ℓ < L: mean KL(p_L ‖ q_ℓ) in nats and the share of positions whose
    lens top-1 equals the final top-1, over the positions of ``resid`` (depths 0..L).
    ``dtype`` is that of the unembedding product (softmax and sums are float32 or
    wider). A :class:`TunedLens` is scored with and without its translators (rows
    "tuned" and "logit", or those named in ``variants``); any other lens as itself."""
    readout = Readout(lens.model, dtype)
    n_blocks, n = resid.shape[0] - 1, resid.shape[1]
    if variants is None:
        variants = ["logit", "tuned"] if isinstance(lens, TunedLens) else [lens.name]
    kl = {v: torch.zeros(n_blocks, dtype=torch.float64) for v in variants}
    agree = {v: torch.zeros(n_blocks, dtype=torch.float64) for v in variants}
    groups = layer_groups(n_blocks, min(chunk, n), lens.d_vocab)
    # KL(p ‖ q) = Σ p log p - Σ p z + logsumexp(z): no log-softmax of z is formed; the
    # logits of a group of layers live in one reused buffer, overwritten by exp(z - max).
    buf = torch.empty(len(groups[0]) * min(chunk, n) * lens.d_vocab)
    for s in range(0, n, chunk):
        sl = slice(s, min(n, s + chunk))
        zf = readout(resid[-1, sl])
        top_final = zf.argmax(-1)
        p_final = torch.softmax(zf, -1)
        neg_entropy = torch.einsum("nv,nv->n", p_final, zf) - torch.logsumexp(zf, -1)
        del zf
        for g in groups:
            for v in variants:
                if v == "logit":
                    h = resid[g.start : g.stop, sl]
                else:
                    h = torch.stack([lens.translate(resid[l, sl], l) for l in g])
                z = readout(h, out=buf)  # [layer, pos, vocab]
                top, arg = z.max(-1)
                cross = torch.einsum("nv,gnv->gn", p_final, z)
                lse = top + torch.log(z.sub_(top[..., None]).exp_().sum(-1))
                kl[v][g.start : g.stop] += (neg_entropy - cross + lse).clamp_min(0).double().sum(-1)
                agree[v][g.start : g.stop] += (arg == top_final).double().sum(-1)
    rows = [
        {"layer": l, "lens": v, "kl": float(kl[v][l] / n), "top1_agreement": float(agree[v][l] / n)}
        for v in variants
        for l in range(n_blocks)
    ]
    return pd.DataFrame(rows)
