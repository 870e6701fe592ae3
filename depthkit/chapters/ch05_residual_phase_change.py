"""Chapter 05 (a phase change in the residual stream): the tables behind its
charts, the transition estimates, the generated prose and the headline quantities.

Every interval resamples passages (the ``item`` column): positions of one passage
share their context and are not independent.

One axis for blocks and layers: block b reads the residual layer ℓ = b and writes
ℓ = b + 1. :mod:`depthkit.analyses.residual` indexes its per-block statistics (and the
two-segment split fitted to them) by the block b; this chapter reports and draws
every one of them at the residual layer ℓ = b + 1 its update produces
(:data:`WRITES`), so that they share one axis with the lens curves (ℓ = 0..L), the
KL knee, the Top-10 settling layer and chapter 02's patching transition.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from depthkit import stats
from depthkit.analyses import residual
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.stats import narrate

# The paper gives no layer for a residual phase change; chapter 07 shows ours alone.
PAPER = pd.DataFrame(columns=PAPER_COLUMNS)

# Statistic -> the chart panel (y axis) it is drawn in.
PANELS: dict[str, str] = {
    "attn_rel": "‖Δ‖/‖h‖", "mlp_rel": "‖Δ‖/‖h‖", "block_rel": "‖Δ‖/‖h‖",
    "cos_attn": "cos(Δ, h)", "cos_mlp": "cos(Δ, h)", "cos_update": "cos(Δ, h)",
    "block_influence": "1 − cos(h_ℓ, h_ℓ+1)",
}
TRANSITION_COLUMNS = ["name", "estimate", "lo", "hi", "n", "n_boot"]
# What a layer interval on a grid cannot say alone (depthkit.stats.LayerCI); NaN where a row lacks them.
GRID_COLUMNS = ["mode_share", "step", "censored_share"]
MCQ_SLUG = "02_mcq_collection_vs_reasoning"
# Block b writes the residual layer ℓ = b + WRITES.
WRITES = 1
CONVENTION = (
    "**One axis for blocks and layers.** Block b reads the residual stream at layer ℓ = b and writes layer "
    "ℓ = b + 1 (layer 0 is the embedding output, layer L the final residual). Every per-block statistic (update "
    "sizes, directions, block influence, and the two-segment split ℓ\\* fitted to them) is drawn and reported at "
    "ℓ = b + 1, the layer its update produces, so that it shares one axis with the lens curves, the KL knee, the "
    "Top-10 settling layer and the patching transition. Where a block itself is meant (its update, its removal), it is "
    "named by its index b, with the layer it writes."
)


def layer_of(block: float) -> float:
    """The residual layer block ``block`` writes (:data:`WRITES`)."""
    return block + WRITES


def model_line(info: Any, lens_name: str, convention: str) -> str:
    return narrate.model_note(info, lens_name, convention)


def update_curves(updates: pd.DataFrame, *, n_boot: int, seed: int) -> pd.DataFrame:
    """Mean curve over passages of every update statistic: ``[x, mean, lo, hi, n, stat, panel]``,
    ``x`` the residual layer ℓ = b + 1 that block b writes."""
    parts = [
        stats.layer_means(updates, s, by="block", n_boot=n_boot, seed=seed).assign(stat=s, panel=panel)
        for s, panel in PANELS.items()
    ]
    out = pd.concat(parts, ignore_index=True)
    return out.assign(x=layer_of(out["block"])).drop(columns="block")[["x", *[c for c in out.columns if c != "block"]]]


def lens_curves(kl: pd.DataFrame, top: pd.DataFrame, lens_name: str, *, n_boot: int, seed: int) -> pd.DataFrame:
    """KL(p_L ‖ q_ℓ) of every lens in ``kl`` and the Top-10 share of the chosen lens,
    as curves over layers in the layout of :func:`update_curves`."""
    parts = [
        stats.layer_means(kl[kl["lens"] == name], "kl", by="layer", n_boot=n_boot, seed=seed).assign(
            stat=f"KL, {name} lens", panel="KL(p_L ‖ q_ℓ), nats"
        )
        for name in kl["lens"].unique()
    ]
    parts.append(
        stats.layer_means(top, "top10_share", by="layer", n_boot=n_boot, seed=seed).assign(
            stat=f"Top-10 share, {lens_name} lens", panel="top-1 in Top-10"
        )
    )
    return pd.concat(parts, ignore_index=True).rename(columns={"layer": "x"})


def patching_rows(mcq_run: Any) -> pd.DataFrame:
    """Chapter 02's patching transitions as transition rows (its own intervals kept)."""
    pt = mcq_run["patching_transitions"]
    pt = pt[pt["what"] == "patching transition"]
    return pd.DataFrame(
        {
            "name": "patching transition (" + pt["direction"].astype(str) + ")",
            "estimate": pt["transition_layer"].astype(float),
            "lo": pt["lo"].astype(float),
            "hi": pt["hi"].astype(float),
            "n": pt["n_pairs"].astype(float),
            "n_boot": np.nan,
        },
        columns=TRANSITION_COLUMNS,
    )


def load_patching(model_name: str, results_root: str | None) -> tuple[pd.DataFrame, str]:
    """Chapter 02's saved patching transitions of this model and a note saying where
    they come from, or no rows and a note saying why they are missing."""
    from depthkit.core.results import ResultsError, load_run

    try:
        run = load_run(model_name, MCQ_SLUG, root=results_root)
        rows = patching_rows(run)
    except (ResultsError, KeyError) as err:
        note = (
            f"**The patching transition is missing**: chapter 02 (`{MCQ_SLUG}`) has no usable saved run for "
            f"{model_name} ({str(err).splitlines()[0][:200]}). Run that chapter for this model to add it here."
        )
        return pd.DataFrame(columns=TRANSITION_COLUMNS), note
    finished = run.manifest.get("finished_utc", "?")
    return rows, f"The patching transitions come from chapter 02's run of {model_name} (finished {finished})."


def transitions(
    updates: pd.DataFrame,
    kl: pd.DataFrame,
    top: pd.DataFrame,
    lens_name: str,
    *,
    phase_curve: str,
    top_tol: float,
    n_blocks: int,
    patching: pd.DataFrame | None = None,
    n_boot: int,
    seed: int,
) -> pd.DataFrame:
    """ℓ*, the KL knee, the layer where the Top-10 share settles, and (when given)
    chapter 02's patching transitions: ``[name, estimate, lo, hi, n, n_boot, mode_share,
    step, censored_share, estimate / L]``, every one a residual layer (ℓ* the layer
    written by the block where the fit splits). The first row is always ℓ*."""
    phase = _in_layers(residual.phase_change(updates, phase_curve, n_boot=n_boot, seed=seed))
    knee = stats.curve_estimate(
        kl[kl["lens"] == lens_name], "kl", stats.knee, name=f"KL knee ({lens_name} lens)", n_boot=n_boot, seed=seed
    )
    settle = stats.curve_estimate(
        top, "top10_share", lambda x, y: stats.settling_layer(x, y, tol=top_tol),
        name="Top-10 share reaches its final level", n_boot=n_boot, seed=seed, censor_at=float(top["layer"].max()),
    )
    rows = [dict(phase.as_dict(), name=f"ℓ* (two-segment fit, log {phase_curve})"), knee.as_dict(), settle.as_dict()]
    cols = TRANSITION_COLUMNS + GRID_COLUMNS
    out = pd.DataFrame(rows)[cols].astype({"n": "float64", "n_boot": "float64"})
    if patching is not None and len(patching):
        out = pd.concat([out, patching.reindex(columns=cols).astype(out.dtypes.to_dict())], ignore_index=True)
    out["estimate / L"] = out["estimate"] / n_blocks
    return out


def _in_layers(est: stats.LayerEstimate) -> stats.LayerEstimate:
    """A split fitted over blocks, moved to the residual layers those blocks write."""
    return replace(est, estimate=layer_of(est.estimate), lo=layer_of(est.lo), hi=layer_of(est.hi))


def phase_test(updates: pd.DataFrame, phase_curve: str, *, n_boot: int, seed: int) -> residual.PhaseTest:
    """Two segments against one for the ℓ* curve (:func:`depthkit.analyses.residual.phase_test`),
    the split and the knots it may take in residual layers (ℓ = b + 1); the slope
    change is per block, which is per layer."""
    t = residual.phase_test(updates, phase_curve, n_boot=n_boot, seed=seed)
    return replace(t, split=_in_layers(t.split), first_knot=layer_of(t.first_knot), last_knot=layer_of(t.last_knot))


def phase_sentence(test: residual.PhaseTest, n_blocks: int) -> str:
    """Whether the run shows a phase change at all, and why not when it does not."""
    change = narrate.estimate(test.slope_change.estimate, test.slope_change.lo, test.slope_change.hi, digits=residual.PhaseTest.DIGITS)
    if test.two_segments:
        near = min(test.split.estimate - test.first_knot, test.last_knot - test.split.estimate) <= 1
        edge = (
            f" It sits one layer from the edge of the range the fit may choose (layers {test.first_knot:.0f}–"
            f"{test.last_knot:.0f}): the bend separates the first few blocks from the rest, not two halves of the network."
            if near else ""
        )
        return (f"Two segments fit clearly better than one line: at ℓ\\* the slope of the log curve changes by {change} "
                f"per layer, and the split is interior.{edge}")
    if test.at_edge:
        where = "first" if test.split.estimate == test.first_knot else "last"
        return (f"**No phase change is found here:** the best split sits on the {where} layer the fit may choose "
                f"(layers {test.first_knot:.0f}–{test.last_knot:.0f} of {n_blocks}), so two segments are one line with a bent end "
                f"(slope change {change}). ℓ\\* is only where the fit puts its knot, not a transition.")
    return (f"**No clear phase change:** the slope change at ℓ\\*, {change} per layer, has an interval that "
            "does not exclude zero as printed (or too few passages for one), so one line describes the curve as well as two segments.")


def split_sensitivity(updates: pd.DataFrame, *, n_boot: int, seed: int) -> pd.DataFrame:
    """Where the two-segment split falls for every update statistic, in residual
    layers (ℓ = b + 1): ``[statistic, split, lo, hi]``."""
    rows = [_in_layers(residual.phase_change(updates, s, n_boot=n_boot, seed=seed)).as_dict() for s in residual.UPDATE_STATS]
    return pd.DataFrame(rows)[["name", "estimate", "lo", "hi"]].rename(columns={"name": "statistic", "estimate": "split"})


def mlp_vs_attention(updates: pd.DataFrame, *, n_boot: int, seed: int) -> pd.DataFrame:
    """Per block: the MLP minus the attention relative update, mean over passages with
    its interval (one passage one unit): ``[block, layer, estimate, lo, hi, n]``,
    ``layer`` the residual layer the block writes."""
    d = updates.assign(diff=updates["mlp_rel"] - updates["attn_rel"])
    out = stats.bootstrap_ci_by(d, "diff", "block", n_boot=n_boot, seed=seed)
    out.insert(1, "layer", layer_of(out["block"]))
    return out


def _layer(row: pd.Series, n_blocks: int | None = None) -> str:
    grid = {k: float(row[k]) for k in GRID_COLUMNS if k in row and np.isfinite(row[k])}
    return narrate.layer(row["estimate"], row["lo"], row["hi"], n_blocks=n_blocks, **grid)


def summary_text(
    transitions: pd.DataFrame,
    sensitivity: pd.DataFrame,
    updates: pd.DataFrame,
    mlp_attn: pd.DataFrame,
    *,
    model_name: str,
    n_passages: int,
    n_positions: int,
    phase_curve: str,
    test: residual.PhaseTest,
) -> str:
    """The Markdown bullets under the transition chart."""
    n_blocks = int(updates["block"].max()) + 1
    tr = transitions.set_index("name")
    star = transitions.iloc[0]
    shown = transitions["estimate"].dropna()
    spread = shown.max() - shown.min()
    b = updates.groupby("block")[["attn_rel", "mlp_rel"]].mean()
    inner = mlp_attn[mlp_attn["block"].between(1, n_blocks - 2)]
    mlp_bigger = int((inner["estimate"] > 0).sum())
    if inner["lo"].notna().any():
        clear = (
            f"; the interval over passages of the difference excludes zero in {int((inner['lo'] > 0).sum())} blocks "
            f"with the MLP larger and {int((inner['hi'] < 0).sum())} with attention larger."
        )
    else:
        clear = f" ({narrate.NO_INTERVAL}; no block-wise difference is claimed)."
    knee_name = next(n for n in tr.index if n.startswith("KL knee"))
    return f'''
On {n_passages} passages ({n_positions:,} positions) of {model_name}; every layer below is a residual layer ℓ, a block's
statistics sitting at the layer ℓ = b + 1 it writes:

* **ℓ\\* = {_layer(star)}** of {n_blocks} (ℓ\\*/L = {star['estimate'] / n_blocks:.2f}), from the log of `{phase_curve}`: the layer at
  which the two fitted line segments meet.
  {phase_sentence(test, n_blocks)}
  Fitted to the other statistics the split falls between layers {sensitivity['split'].min():.0f} and {sensitivity['split'].max():.0f}:
  the "phase change" is a property of the curve one chooses as much as of the network.
* KL knee: {_layer(tr.loc[knee_name])}; Top-10 share at its final level from {_layer(tr.loc["Top-10 share reaches its final level"], n_blocks)}.
  The estimates shown span {spread:.0f} layers ({spread / n_blocks:.0%} of the depth).
* Block 0 (embeddings, layer 0 → layer 1) adds an update {b.loc[0, 'attn_rel'] + b.loc[0, 'mlp_rel']:.1f}× the size of its input
  (attention + MLP, relative); in the blocks that write layers 2–{n_blocks - 1} (blocks 1–{n_blocks - 2}) the mean MLP
  update is larger than the attention update in {mlp_bigger} of {len(inner)} blocks{clear}
'''


def skip_text(
    skip_later: pd.DataFrame, skip_output: pd.DataFrame, *, split: float, n_passages: int, seconds: float
) -> str:
    """The Markdown bullets under the layer-skipping chart. The effects are pooled
    over the positions of a few passages and carry no interval, so the means on
    either side of ℓ* are described, not compared."""
    n_blocks = int(skip_output["skipped"].max()) + 1
    so = skip_output.set_index("skipped")
    worst = so["kl"].sort_values(ascending=False).head(3)
    at_l = skip_later[skip_later["layer"] == n_blocks].set_index("skipped")["rel_change"]
    # ``split`` is a residual layer; block b sits before it when the layer it writes does
    writes = layer_of(so.index.to_numpy())
    before, after = so.loc[writes < split], so.loc[writes >= split]
    l_writes = layer_of(at_l.index.to_numpy())
    changes_top1 = int((so["top1_agreement"] < 0.9).sum())
    passages = f"{n_passages} passage{'s' if n_passages != 1 else ''}"
    worst_list = ", ".join(
        f"block {b} (writes layer {layer_of(b)}; KL {v:.2f} nats, top-1 kept at {so.loc[b, 'top1_agreement']:.0%} of positions)"
        for b, v in worst.items()
    )
    return f'''
* The blocks whose removal changes the output most are {worst_list}.
* {changes_top1} of {n_blocks} blocks, each removed on its own, change the top-1 token at more than 10 % of positions.
* Mean output KL for the blocks that write layers before ℓ\\* ({len(before)} blocks): {before['kl'].mean():.2f} nats; for those that
  write ℓ\\* and later ({len(after)} blocks): {after['kl'].mean():.2f} nats.
  Mean relative change of the final residual h_L: {at_l[l_writes < split].mean():.2f} before ℓ\\*, {at_l[l_writes >= split].mean():.2f} from ℓ\\* on.
  These means pool the positions of {passages} and carry no interval, so no difference between the two sides of ℓ\\* is claimed.
* The skipping experiment took {seconds:.0f} s ({n_blocks} extra forward passes over {passages}).
'''


def headlines(run: Any) -> pd.DataFrame:
    """Every transition estimate of the run (table ``transitions``), in layers; ℓ*
    only where two segments beat one (table ``phase_test``)."""
    t = run["transitions"]
    try:
        supported = bool(run["phase_test"]["two_segments"].iloc[0])
    except KeyError:  # a run saved before the test existed
        supported = True
    if not supported:
        t = t.iloc[1:]
    out = pd.DataFrame(
        {
            "quantity": t["name"].astype(str),
            "value": t["estimate"].astype(float),
            "lo": t["lo"].astype(float),
            "hi": t["hi"].astype(float),
            "n": t["n"].astype(float),
            "scale": "layer",
        }
    )
    return out[HEADLINE_COLUMNS].reset_index(drop=True)


def lens_tables(net: Any, items: list, lens: Any, *, convention: str, batch_size: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(kl, top)``: per (item, layer) KL(p_L ‖ q_ℓ) through ``lens`` and the logit lens
    (column ``lens``), and the share of positions whose lens top-1 is one of the ten most
    frequent tokens, through ``lens``."""
    from depthkit.analyses import frequency
    from depthkit.lens.trajectories import trajectories

    trajs = {lens.name: trajectories(net, items, lens=lens, convention=convention, top_k=1, batch_size=batch_size)}
    if lens.name != "logit":
        # The logit lens alongside shows how much of the KL curve's shape is the lens's.
        trajs["logit"] = trajectories(net, items, lens="logit", convention=convention, top_k=1, batch_size=batch_size)
    kl = pd.concat([residual.kl_by_layer(t).assign(lens=name) for name, t in trajs.items()], ignore_index=True)
    freq = frequency.token_frequencies(net.tokenizer)
    top = residual.top_share_by_layer(trajs[lens.name], lambda ids: frequency.ranks_of(freq, ids), top=10)
    return kl, top
