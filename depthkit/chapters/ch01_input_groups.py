"""Chapter 01's sensitivity check: prompts grouped by their last *input* token
(whitespace-led or not), a split fixed before the model runs, so that it cannot
select on what the model predicts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from depthkit import stats
from depthkit.chapters.ch01_quantities import FIRST_LAYER, Q_FINAL, Q_L1, _pp
from depthkit.stats import narrate

# The two groups of prompts by their last *input* token (known before the model runs).
WS_LED, NOT_WS_LED = "last input token whitespace-led", "last input token not whitespace-led"


def last_input_tokens(net: Any, prompts: pd.DataFrame) -> pd.DataFrame:
    """Per prompt (``item`` = its row in ``prompts``), the last *input* token and
    whether it is whitespace-led (its text begins with a space or newline: a whole
    word such as ``" city"``) or not (a word piece or punctuation such as ``"ing"``,
    ``","``): ``[item, last_id, last_token, whitespace_led]``. Known before the model
    runs, so groups made from it do not select on the model's output."""
    from depthkit.lens.trajectories import encode

    tok = net.tokenizer
    ids = [encode(net, t, on_overflow="truncate")[-1] for t in prompts["prompt"]]
    return last_token_frame(ids, [tok.decode([i]) for i in ids])


def last_token_frame(ids: list[int], texts: list[str]) -> pd.DataFrame:
    """:func:`last_input_tokens` from the ids and their decoded texts."""
    return pd.DataFrame(
        {
            "item": np.arange(len(ids)),
            "last_id": np.asarray(ids, dtype=np.int64),
            "last_token": list(texts),
            "whitespace_led": [bool(t) and t[0].isspace() for t in texts],
        }
    )


def input_groups(pp: pd.DataFrame, last: pd.DataFrame, *, n_boot: int, seed: int) -> pd.DataFrame:
    """The layer-1 and the output Top-10 share in the two groups of prompts made by
    their last input token (:func:`last_input_tokens`), and the difference between
    the groups (whitespace-led minus not; prompts resampled within each group):
    ``[quantity, group, estimate, lo, hi, n]``, shares as fractions."""
    g = last[["item", "whitespace_led"]].assign(group=lambda d: np.where(d["whitespace_led"], WS_LED, NOT_WS_LED))
    # One row per prompt: its layer-1 flags (``final_top10`` is the same on every layer's row).
    at = pp[pp["layer"] == FIRST_LAYER].merge(g, on="item", validate="one_to_one")
    rows = []
    for quantity, col in ((Q_L1, "top10"), (Q_FINAL, "final_top10")):
        for name in (WS_LED, NOT_WS_LED):
            ci = stats.bootstrap_ci(at.loc[at["group"] == name, col].to_numpy() == 1, n_boot=n_boot, seed=seed)
            rows.append({"quantity": quantity, "group": name, **ci._asdict()})
        d = stats.stratified_difference(
            at.assign(all="all"), col, "group", "all", NOT_WS_LED, WS_LED, n_boot=n_boot, seed=seed, min_per_cell=1
        ).iloc[-1]
        rows.append({"quantity": quantity, "group": "difference (whitespace-led − not)", "estimate": d["diff"],
                     "lo": d["lo"], "hi": d["hi"], "n": int(d["n_a"] + d["n_b"])})
    return pd.DataFrame(rows, columns=["quantity", "group", "estimate", "lo", "hi", "n"])


def input_group_table(groups: pd.DataFrame) -> pd.DataFrame:
    """:func:`input_groups` for display: shares and the difference in percentage points."""
    def shown(r: pd.Series) -> str:
        if r["group"].startswith("difference"):
            return _pp(r["estimate"] * 100, r["lo"] * 100, r["hi"] * 100)
        return narrate.share(r["estimate"], r["lo"], r["hi"])

    return groups.assign(**{"value [95 % CI]": groups.apply(shown, axis=1)})[["quantity", "group", "value [95 % CI]", "n"]]


def input_group_sentence(groups: pd.DataFrame) -> str:
    """The sensitivity bullet: both groups' layer-1 Top-10 shares and whether they differ."""
    at1 = groups[groups["quantity"] == Q_L1].set_index("group")
    ws, other = at1.loc[WS_LED], at1.loc[NOT_WS_LED]
    d = at1.iloc[-1]
    diff = narrate.difference(
        d["estimate"] * 100, d["lo"] * 100, d["hi"] * 100, more="higher", less="lower",
        than="those after other last tokens", subject="layer-1 Top-10 shares after a whitespace-led last token",
        unit="percentage points",
    )
    return (
        f"Split by the prompt's last *input* token (fixed before the model runs, so the split does not select on what "
        f"the model predicts): after a whitespace-led token (a whole word, {int(ws['n'])} prompts) the layer-1 Top-10 "
        f"share is {narrate.share(ws['estimate'], ws['lo'], ws['hi'], digits=0)}; after a word piece or punctuation "
        f"({int(other['n'])} prompts) {narrate.share(other['estimate'], other['lo'], other['hi'], digits=0)}: {diff}."
    )
