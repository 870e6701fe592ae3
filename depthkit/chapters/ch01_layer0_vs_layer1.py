"""Chapter 01's comparison of layer 1 with layer 0 (the embedding row read through the
lens, before any block): is the layer-1 guess more than what the embeddings alone give?
Differences are paired within a prompt, then prompts resampled."""

from __future__ import annotations

import pandas as pd

from depthkit import stats
from depthkit.chapters.ch01_quantities import EMBEDDING_LAYER, FIRST_LAYER, _pp
from depthkit.stats import narrate

# What the layer-0/layer-1 comparison compares (per-prompt columns of :func:`per_prompt_guesses`).
L0_QUANTITIES = {"top10": "top-1 in Top 1-10", "bigram": "top-1 = bigram guess", "unigram": "top-1 = unigram guess"}


def layer0_vs_layer1(ppg: pd.DataFrame, *, n_boot: int, seed: int) -> pd.DataFrame:
    """Layer 0 (the embedding row through the lens, before any block) beside layer 1,
    per quantity of :data:`L0_QUANTITIES`: the two shares with their intervals and the
    paired difference layer 1 − layer 0 (per prompt first, then prompts resampled), in
    percentage points: ``[quantity, layer0, layer0_lo, layer0_hi, layer1, layer1_lo,
    layer1_hi, diff_pp, diff_lo, diff_hi, n]``. No rows without a layer-0 row."""
    cols = ["quantity", "layer0", "layer0_lo", "layer0_hi", "layer1", "layer1_lo", "layer1_hi", "diff_pp", "diff_lo", "diff_hi", "n"]
    keys = ["item", "position"] if "position" in ppg.columns else ["item"]
    z = ppg[ppg["layer"] == EMBEDDING_LAYER].set_index(keys)
    o = ppg[ppg["layer"] == FIRST_LAYER].set_index(keys)
    both = z.index.intersection(o.index)
    rows = []
    for col, name in L0_QUANTITIES.items():
        if not len(both) or col not in ppg.columns:
            continue
        a, b = z.loc[both, col].to_numpy(), o.loc[both, col].to_numpy()
        s0 = stats.bootstrap_ci(a == 1, n_boot=n_boot, seed=seed)
        s1 = stats.bootstrap_ci(b == 1, n_boot=n_boot, seed=seed)
        d = stats.bootstrap_ci((b - a) * 100, n_boot=n_boot, seed=seed)
        rows.append((name, *s0[:3], *s1[:3], *d[:3], d.n))
    return pd.DataFrame(rows, columns=cols)


def layer0_table(comp: pd.DataFrame) -> pd.DataFrame:
    """:func:`layer0_vs_layer1` for display."""
    return pd.DataFrame(
        {
            "quantity": comp["quantity"],
            "layer 0 (embeddings) [95 % CI]": [narrate.share(*r) for r in comp[["layer0", "layer0_lo", "layer0_hi"]].to_numpy()],
            "layer 1 [95 % CI]": [narrate.share(*r) for r in comp[["layer1", "layer1_lo", "layer1_hi"]].to_numpy()],
            "layer 1 − layer 0, paired [95 % CI]": [
                _pp(*r) for r in comp[["diff_pp", "diff_lo", "diff_hi"]].to_numpy()
            ],
            "prompts": comp["n"].astype(int),
        }
    )


# Per quantity of L0_QUANTITIES: how a sentence names it, and the subject of its difference.
_L0_WORDS = {
    "top10": ("the Top-10 share", "Top-10 shares at layer 1"),
    "bigram": ("the share equal to the bigram guess", "shares equal to the bigram guess at layer 1"),
    "unigram": ("the share equal to the unigram guess", "shares equal to the unigram guess at layer 1"),
}


def layer0_sentence(comp: pd.DataFrame) -> str:
    """Whether layer 1 differs clearly from layer 0 (the embeddings alone), per quantity."""
    if not len(comp):
        return "Layer 0 (the embedding row) was not decoded, so layer 1 cannot be set against it here."
    c = comp.set_index("quantity")
    parts = []
    for col, name in L0_QUANTITIES.items():
        if name not in c.index:
            continue
        r = c.loc[name]
        what, subject = _L0_WORDS[col]
        parts.append(
            f"{what} is {narrate.share(r['layer0'], r['layer0_lo'], r['layer0_hi'], digits=0)} at layer 0 and "
            f"{narrate.share(r['layer1'], r['layer1_lo'], r['layer1_hi'], digits=0)} at layer 1: "
            + narrate.difference(r["diff_pp"], r["diff_lo"], r["diff_hi"], more="higher", less="lower",
                                 than="at layer 0", subject=subject, unit="percentage points")
        )
    verdict = ""
    if L0_QUANTITIES["top10"] in c.index:
        top = c.loc[L0_QUANTITIES["top10"]]
        if not narrate.excludes_zero(top["diff_lo"], top["diff_hi"], digits=1):
            verdict = ("Layer 1 does not differ clearly from layer 0 in its Top-10 share: as far as this run can tell, the "
                       "frequent-token guess at layer 1 is what the embeddings alone already give through the lens.")
        else:
            word = "higher" if top["diff_pp"] > 0 else "lower"
            verdict = (f"Layer 1 differs clearly from layer 0: its Top-10 share is {word} than what the embeddings alone "
                       "give through the lens, so the layer-1 guess is not the embeddings' guess alone.")
    return f"Layer 1 against layer 0 (the embedding row, before any block; paired over prompts): {'; '.join(parts)}. {verdict}".strip()
