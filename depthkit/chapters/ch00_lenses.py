"""Chapter 00 (logit lens and tuned lens): lens fidelity, the example prompts, and
the frequency-bias check of lenses trained with frequent targets down-weighted.

Held-out fidelity is recorded at lens-training time as per-layer means only (no
unit to resample), so it is described, not tested; the claims of the chapter (the
tuned lens is closer, early layers prefer frequent tokens) are made on the
prompt-level comparison, one prompt one unit, with paired differences.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from depthkit import stats
from depthkit.analyses import summaries
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.lens.base import RIDGE_START
from depthkit.stats import narrate

# The paper states the lens-bias check without numbers.
PAPER = pd.DataFrame(columns=PAPER_COLUMNS)

TUNED, THE, TOP10 = "tuned", "tuned, ' the' down-weighted", "tuned, Top-10 down-weighted"
Q_EARLY = "early-layer Top-10 share, {lens} lens"
Q_OUTPUT = "model output Top-10 share"


def model_note(info: Any, meta: Mapping[str, Any], budget: str) -> str:
    took = meta["timing"]["total_s"]
    n_passages = len(meta["train_passages"])
    steps = meta["config"]["steps"]
    weights = f"{info.quantisation} — a small quantised model, " if info.is_quantised else "full precision, a small model, "
    training = "closed-form ridge start only" if steps == 0 else f"closed-form start + {steps} Adam steps"
    return (
        f"**Model:** `{info.name}` ({info.n_blocks} blocks, vocabulary {info.d_vocab:,}), weights: {weights}"
        "not one of the paper's models. "
        f"**Tuned lens:** budget `{budget}`, trained on {meta['n_train_positions']:,} positions of "
        f"{n_passages} Wikipedia passage{'s' * (n_passages != 1)} ({training}) "
        f"in {took / 60:.1f} minutes ({took:.0f} s) of wall time on {meta['torch_threads']} threads "
        "(the lens file's sidecar records the machine's load)."
    )


def bias_lenses_note(the_lens: Any, top10_lens: Any, budget: str) -> str:
    """How the two down-weighted lenses were trained, from their sidecars."""
    def how(lens: Any) -> str:
        cfg, took = lens.meta["config"], lens.meta["timing"]["total_s"]
        start = ("continuing from the tuned lens above" if cfg["init"] == "lens"
                 else "from its own weighted ridge start" if cfg["init"] == "ridge" else "from zero")
        return f"{start}, {cfg['steps']} Adam steps at learning rate {cfg['lr']:g} ({took:.0f} s)"

    return (f"Down-weighted lenses (budget `{budget}`): ' the' {how(the_lens)}; Top-10 {how(top10_lens)}; "
            f"positions down-weighted by ×{the_lens.meta['config']['downweight_factor']:g}.")


def fidelity(heldout: pd.DataFrame, L: int) -> tuple[str, pd.DataFrame]:
    """Prose and a table (every ~L/8-th layer) of the held-out KL and top-1 agreement."""
    kl = heldout.pivot(index="layer", columns="lens", values="kl")
    agree = heldout.pivot(index="layer", columns="lens", values="top1_agreement")
    half = kl.index < L // 2
    before, after = kl.loc[half, "logit"].mean(), kl.loc[half, "tuned"].mean()
    better = int((kl["tuned"] < kl["logit"]).sum())
    worst = kl["logit"].idxmax()
    text = (
        f"On these held-out positions the tuned lens has the lower mean KL at **{better} of {L}** layers. "
        f"Over the first half of the network (ℓ < {L // 2}) its mean KL is **{1 - after / before:.0%}** lower "
        f"({before:.2f} → {after:.2f} nats; per-layer means recorded at training time, so no interval: "
        "the prompt-level comparison below gives one). "
        f"The logit lens is worst at layer {worst} ({kl.loc[worst, 'logit']:.1f} nats, top-1 agreement "
        f"{agree.loc[worst, 'logit']:.0%}); there the tuned lens reaches {kl.loc[worst, 'tuned']:.2f} nats and "
        f"{agree.loc[worst, 'tuned']:.0%} agreement. At the last layer before the output (ℓ = {L - 1}) the two "
        f"read {kl.loc[L - 1, 'logit']:.2f} and {kl.loc[L - 1, 'tuned']:.2f} nats."
    )
    if RIDGE_START in kl.columns:
        gained = int((kl["tuned"] < kl[RIDGE_START]).sum())
        text += (
            f" The Adam steps on the KL lower the mean held-out KL from {kl[RIDGE_START].mean():.2f} nats (the ridge "
            f"start) to {kl['tuned'].mean():.2f} and raise the mean top-1 agreement from {agree[RIDGE_START].mean():.1%} "
            f"to {agree['tuned'].mean():.1%}; the trained lens is closer at **{gained} of {L}** layers."
        )
    else:
        text += " This lens is the ridge start alone: its budget took no Adam step on the KL."
    table = pd.concat({"KL (nats)": kl, "top-1 agreement": agree}, axis=1).iloc[:: max(1, L // 8)].round(3)
    return text, table


def examples_topk(ex_logit: Any, ex_tuned: Any) -> pd.DataFrame:
    return pd.concat([ex_logit.topk.assign(lens="logit"), ex_tuned.topk.assign(lens="tuned")], ignore_index=True)


def settled_from(steps: pd.DataFrame, final: pd.DataFrame) -> dict[int, int]:
    """Per item, the earliest layer from which the lens top-1 stays the model's final top-1."""
    s = steps.merge(final[["item", "layer", "token_id"]], on=["item", "layer"])
    out = {}
    for item, g in s.sort_values("layer").groupby("item"):
        wrong = g.loc[g["top1_id"] != g["token_id"], "layer"]
        out[int(item)] = int(g["layer"].min()) if wrong.empty else int(wrong.max()) + 1
    return out


def settle_notes(prompts: Sequence[str], ex_logit: Any, ex_tuned: Any) -> str:
    st = settled_from(ex_tuned.steps, ex_tuned.target("final"))
    sl = settled_from(ex_logit.steps, ex_logit.target("final"))
    s = ex_tuned.steps
    final_tok = s[s["layer"] == s["layer"].max()].set_index("item")["top1_token"]
    return "\n".join(
        f"- {prompt!r} → model output {final_tok[i]!r}: settled from layer {sl[i]} through the logit lens, "
        f"from layer {st[i]} through the tuned lens."
        for i, prompt in enumerate(prompts)
    )


def eval_prompts(n_eval: int, seed: int, lenses: Sequence[Any]) -> pd.DataFrame:
    """Wikipedia prefixes from the analysis split (``passage_id`` indexes
    ``wikipedia_passages("analysis")``), leaving out any passage one of ``lenses``
    was trained on (none, for lenses trained on the book's lens split)."""
    from depthkit import data

    seen = set().union(*(lens.meta.get("train_passage_digests", ()) for lens in lenses))
    passages = data.wikipedia_passages("analysis")
    pool = data.wikipedia_prefixes(n_eval * 2, seed=seed, passages=passages)
    clean = [data.passage_digest(passages[i]) not in seen for i in pool["passage_id"]]
    return pool[clean].head(n_eval).reset_index(drop=True)


def early_layers(layers: Sequence[int], L: int) -> list[int]:
    """The first third of the depth, from layer 1 (layer 0, the embedding read
    through the lens, is no depth)."""
    first = max(int(min(layers)), summaries.FIRST_DEPTH_LAYER)
    return [int(l) for l in sorted(set(layers)) if first <= l < first + max(1, L // 3)]


def bias_table(steps: pd.DataFrame, L: int, *, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per lens: the share of early-layer top-1s that are Top-10 tokens, the model
    output's share, their paired difference, and (``drop``) how much lower the
    share is than through the plain tuned lens, all paired over prompts and
    prompts resampled.

    ``steps`` is :func:`depthkit.lens.compare.compare_lenses`'s per-prompt frame
    (lens, item, layer, frequent, final_id) with ``final_frequent`` added."""
    early = early_layers(steps["layer"].unique(), L)
    e = steps[steps["layer"].isin(early)]
    # One number per prompt: its early layers are not independent of each other.
    per = e.groupby(["lens", "item"], sort=False).agg(early=("frequent", "mean"), output=("final_frequent", "first"))
    per["diff"] = per["early"] - per["output"]
    tuned = per.xs(TUNED, level="lens")["early"] if TUNED in per.index.get_level_values("lens") else None
    rows = []
    for lens, g in per.groupby(level="lens", sort=False):
        ci = stats.bootstrap_ci(g["early"].to_numpy(), n_boot=n_boot, seed=seed)
        d = stats.bootstrap_ci(g["diff"].to_numpy(), n_boot=n_boot, seed=seed)
        o = stats.bootstrap_ci(g["output"].to_numpy(), n_boot=n_boot, seed=seed)
        drop = stats.CI(np.nan, np.nan, np.nan, 0)
        if tuned is not None and lens != TUNED:
            paired = tuned.reindex(g.index.get_level_values("item")).to_numpy() - g["early"].to_numpy()
            drop = stats.bootstrap_ci(paired, n_boot=n_boot, seed=seed)
        rows.append(
            {"lens": lens, "early layers": ci.estimate, "lo": ci.lo, "hi": ci.hi, "model output": o.estimate,
             "output lo": o.lo, "output hi": o.hi, "early − output": d.estimate, "diff lo": d.lo, "diff hi": d.hi,
             "drop": drop.estimate, "drop lo": drop.lo, "drop hi": drop.hi, "n": ci.n}
        )
    out = pd.DataFrame(rows)
    out.attrs["early"] = early
    return out


def with_final_frequent(steps: pd.DataFrame, frequent_ids: Sequence[int]) -> pd.DataFrame:
    return steps.assign(final_frequent=np.isin(steps["final_id"], np.asarray(frequent_ids)).astype(float))


def _clearly_more(row: pd.Series) -> bool:
    # judged in percentage points at one decimal, as _diff_words prints it
    return narrate.excludes_zero(row["diff lo"] * 100, row["diff hi"] * 100, digits=1) and row["early − output"] > 0


def _clearly_dropped(row: pd.Series) -> bool:
    return narrate.excludes_zero(row["drop lo"] * 100, row["drop hi"] * 100, digits=1) and row["drop"] > 0


def _diff_words(row: pd.Series) -> str:
    return narrate.difference(
        row["early − output"] * 100, row["diff lo"] * 100, row["diff hi"] * 100, more="more", less="less",
        than="the model's output", subject=f"early layers through the {row['lens']} lens",
        unit="percentage points of Top-10 picks",
    )


def bias_verdict(bias: pd.DataFrame, early: Sequence[int]) -> str:
    """What the down-weighted lenses say about the early frequency preference; a
    preference counts only when its paired interval lies above zero."""
    b = bias.set_index("lens", drop=False)
    shares = "; ".join(f"{lens} lens {narrate.share(r['early layers'], r['lo'], r['hi'], digits=0)}" for lens, r in b.iterrows())
    o = b.iloc[0]
    head = (
        f"Over the early layers ℓ = {early[0]}..{early[-1]} (the first third) the top-1 is a Top-10 token for: "
        f"{shares}; the model's own output picks a Top-10 token for "
        f"{narrate.share(o['model output'], o.get('output lo', np.nan), o.get('output hi', np.nan), digits=0)} of prompts. "
        f"Paired over prompts, {_diff_words(b.loc[TUNED])}; {_diff_words(b.loc[THE])}; {_diff_words(b.loc[TOP10])}. "
    )
    down = [_clearly_more(b.loc[k]) for k in (THE, TOP10)]
    dropped = [_clearly_dropped(b.loc[k]) for k in (THE, TOP10)]
    # narrate.difference states subject minus reference: the down-weighted share minus
    # the plain one, so a drop is negative, and its interval is signed the same way.
    drops = "; ".join(
        narrate.difference(-b.loc[k, "drop"] * 100, -b.loc[k, "drop hi"] * 100, -b.loc[k, "drop lo"] * 100,
                           more="higher", less="lower", than="through the plain tuned lens",
                           subject=f"early shares through the {k} lens", unit="percentage points")
        for k in (THE, TOP10)
    )
    head += f"Against the plain tuned lens, {drops}. "
    if not _clearly_more(b.loc[TUNED]):
        verdict = (
            "Through the tuned lens, early layers do not clearly pick Top-10 tokens more often than the model's output "
            "does for these prompts, so there is no early frequency preference for the down-weighting to remove; the "
            "guess-then-refine pattern of the later chapters would have to show up in other measures."
        )
    elif all(down) and not any(dropped):
        verdict = (
            "Even the lenses trained to discount frequent targets read the early layers as preferring frequent "
            "tokens more than the model's final prediction does, and down-weighting does not clearly lower the early "
            "share: on this check the frequency-first guess is the model's, not an artefact of the lens objective."
        )
    elif all(down):
        verdict = (
            "Down-weighting frequent targets lowers the early Top-10 share, yet even then early layers prefer frequent "
            "tokens more than the model's output does: the preference is the model's, but part of its size through "
            "the tuned lens comes from the lens objective. Read early-layer frequency shares in the later chapters as "
            "upper estimates."
        )
    elif not any(down):
        verdict = (
            "With frequent targets down-weighted, early layers no longer clearly prefer Top-10 tokens more than the "
            "model's output does: at least part of the early frequency preference seen through the normal tuned "
            "lens may come from the lens's training objective. Read early-layer frequency results in the later "
            "chapters with this caveat, and compare them with the down-weighted lenses."
        )
    else:
        kept = THE if down[0] else TOP10
        verdict = (
            f"Only the {kept} lens still clearly reads a preference for frequent tokens in the early layers; the "
            "other down-weighted lens does not. The evidence on whether the preference is the model's or the lens "
            "objective's is mixed here: read early-layer frequency results in the later chapters with this caveat."
        )
    return head + verdict


def kl_cut(steps: pd.DataFrame, L: int, *, n_boot: int = 1000, seed: int = 0) -> str:
    """Prompt-level version of the held-out claim: tuned minus logit mean KL over
    the first half of the layers, paired per prompt."""
    s = steps[(steps["layer"] < L // 2) & steps["lens"].isin(["logit", TUNED])]
    per = s.groupby(["item", "lens"])["kl_to_final"].mean().unstack()
    d = stats.bootstrap_ci((per[TUNED] - per["logit"]).to_numpy(), n_boot=n_boot, seed=seed)
    return "At the last position of these prompts, over ℓ < {}, {}.".format(
        L // 2,
        narrate.difference(
            d.estimate, d.lo, d.hi, more="higher", less="lower", than="logit-lens ones",
            subject="tuned-lens KL values", unit="nats", digits=2,
        ),
    )


def headlines(run: Any) -> pd.DataFrame:
    """Early-layer Top-10 share per lens and the model output's share (table ``bias_check``)."""
    b = run["bias_check"]
    rows = [
        (Q_EARLY.format(lens=r["lens"]), r["early layers"], r.get("lo", np.nan), r.get("hi", np.nan), r.get("n", np.nan), "share")
        for _, r in b.iterrows()
    ]
    o = b.iloc[0]
    rows.append((Q_OUTPUT, o["model output"], o.get("output lo", np.nan), o.get("output hi", np.nan), o.get("n", np.nan), "share"))
    out = pd.DataFrame(rows, columns=HEADLINE_COLUMNS)
    for c in ("value", "lo", "hi", "n"):
        out[c] = out[c].astype(float)
    return out


# --------------------------------------------------------------------------- the offline explorer

# Positions shown per explorer prompt (the last ones): the page embeds every cell of
# every grid, so prompts x positions x layers must stay a few thousand rows.
EXPLORE_POSITIONS = 10


def explorer_texts(examples: Sequence[str], wikipedia: Sequence[str], n: int) -> list[str]:
    """``n`` prompts for the explorer: the handwritten examples first, then prefixes
    of the analysis split (the prompt-level comparison's own prompts)."""
    return [*examples, *wikipedia][:n]


def explorer_items(model: Any, texts: Sequence[str], n_positions: int = EXPLORE_POSITIONS) -> list[Any]:
    """One item per text, decoded at its last ``n_positions`` positions (the model
    still reads the whole text: only the shown grid is cut)."""
    from depthkit.engine.capture import Item
    from depthkit.lens.trajectories import encode

    items = []
    for text in texts:
        ids = encode(model, text, on_overflow="truncate")
        items.append(Item(ids, list(range(max(0, len(ids) - n_positions), len(ids)))))
    return items


def _label(text: str, width: int = 60) -> str:
    # The end of a prompt is what the last predictions read: keep it, cut the start.
    text = " ".join(text.split())
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def explorer_grid(traj: Any, items: Sequence[Any], texts: Sequence[str], tokenizer: Any) -> pd.DataFrame:
    """One row per (prompt, position, layer) of ``traj`` (decoded at ``items``): the
    input token at that position, the lens's top-1 token and probability and the
    top-3 listing, in the short columns :func:`depthkit.plots.lens_explorer_chart`
    reads (``prompt`` indexes ``texts``; ``label`` names it in the dropdown)."""
    top = traj.topk[traj.topk["k"] <= 3].sort_values(["item", "position", "layer", "k"])
    listing = top.assign(cell=[f"{t!r} {p:.0%}" for t, p in zip(top["token"], top["prob"])]).groupby(
        ["item", "position", "layer"], sort=False
    )["cell"].agg("  ".join)
    s = traj.steps.set_index(["item", "position", "layer"])
    inputs = {(i, pos): tokenizer.decode([it.tokens[pos]]) for i, it in enumerate(items) for pos in it.positions}
    keys = list(s.index)
    return pd.DataFrame(
        {
            "prompt": [k[0] for k in keys],
            "label": [_label(texts[k[0]]) for k in keys],
            "column": [f"{inputs[k[:2]]!r} ·{k[1]}" for k in keys],
            "position": [k[1] for k in keys],
            "layer": [k[2] for k in keys],
            "top1": [repr(t) for t in s["top1_token"]],
            "prob": s["top1_prob"].astype(float).round(3).to_numpy(),
            "top3": listing.reindex(s.index).to_numpy(),
        }
    )
