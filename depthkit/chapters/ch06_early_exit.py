"""Chapter 06's early exit: the operating points of each exit policy at the target
agreement, the thresholds checked with truncated passes, and their prose."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

POLICIES = ("confidence", "fixed", "oracle (d_sat)", "oracle (d_1)")
# Headline names of each policy's saving (chapter 07 and saved runs use them).
SAVING_LABELS = {"confidence": "confidence policy", "fixed": "fixed exit", "oracle (d_sat)": "oracle (d_sat)", "oracle (d_1)": "oracle (d_1)"}


def _exit_layer(layer: float, n_blocks: int) -> str:
    # An exit at row L is the full model: "no exit before the output", never "layer L of L".
    if np.isnan(layer):
        return "no exit layer"
    return "no exit before the output" if layer >= n_blocks else f"layer {layer:.0f} of {n_blocks}"


def _pct(v: float) -> str:
    return "not reached" if np.isnan(v) else f"{v:.0%}"


def block_parameters(model: Any) -> int:
    """Weights in one decoder block of ``model`` (whatever its backend)."""
    return sum(t.numel() for t in model.backend.blocks[0].parameters())


def exit_text(
    saving: pd.DataFrame, sweep: pd.DataFrame, *, target: float, info: Any, block_params: int,
    n_select: int | None = None, n_report: int | None = None,
) -> str:
    """The Markdown summary of the early-exit operating points at ``target`` agreement
    (``saving``: :func:`depthkit.analyses.depth_score.held_out_saving`, thresholds chosen on
    ``n_select`` passages and measured on ``n_report`` others; no interval)."""
    s = saving.set_index("policy")
    conf, fixed, osat, o1 = (s.loc[k] for k in POLICIES)
    readout = info.d_model * info.d_vocab
    if np.isnan(conf["saving"]):
        tau_max = sweep.loc[sweep["policy"] == "confidence", "param"].max()
        conf_line = (
            f"the **confidence policy** never reaches this agreement at any τ of the sweep (up to {tau_max:.4g}): "
            "a dynamic-depth model driven by this lens's confidence saves nothing at this level"
        )
    else:
        conf_line = (
            f"the **confidence policy** (τ = {conf['param']:.4g}) runs {conf['frac_layers']:.0%} of the blocks on average "
            f"and agrees with the full model on {_pct(conf.get('agreement', np.nan))} of tokens: a dynamic-depth model "
            f"could save **{conf['saving']:.0%}** of the block compute"
        )
    split = (
        f"τ and the exit layer are chosen on {n_select} passages to reach {target:.0%} agreement there; the figures below "
        f"are measured on the other {n_report}, so they may fall short of {target:.0%}."
        if n_select and n_report else f"At {target:.0%} agreement with the full model:"
    )
    return f'''
{split}

* {conf_line}
* a **fixed exit layer** saves {_pct(fixed['saving'])} ({_exit_layer(fixed['param'], info.n_blocks)}, agreement {_pct(fixed.get('agreement', np.nan))});
* the oracles save {_pct(osat['saving'])} (exit at d_sat) and {_pct(o1['saving'])} (exit at d₁): what a perfect exit rule could reach.

The saving counts transformer blocks only. Testing the confidence needs a lens read-out per layer: one unembedding has
{readout / 1e6:.1f} M weights against {block_params / 1e6:.1f} M in a block of {info.name} (ratio {readout / block_params:.1f}), so with
this vocabulary a per-layer check costs {'more' if readout > block_params else 'less'} than the block it might save. Agreement is measured on
teacher-forced text, where every earlier position ran all blocks; a real per-token exit would also have to supply the
deeper keys and values that later tokens attend to.
'''


def verify_taus(saving: pd.DataFrame, taus: list[float]) -> list[float]:
    """The thresholds to check with truncated passes: ``taus`` and the one reaching the target."""
    conf = saving.set_index("policy").loc["confidence", "param"]
    return sorted({float(t) for t in taus} | ({float(conf)} if not np.isnan(conf) else set()))


def verify_text(verify: pd.DataFrame, n_passages: int, seconds: float) -> str:
    return (
        f"On {int(verify['n_tokens'].iloc[0]):,} tokens of {n_passages} passage{'s' if n_passages != 1 else ''}, at every checked τ the truncated passes give "
        f"the same token as the simulation for at least {verify['same_as_simulated'].min():.2%} of the tokens ({seconds:.0f} s)."
    )
