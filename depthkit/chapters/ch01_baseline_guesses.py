"""Chapter 01's baseline guesses: the unigram guess (the corpus's most frequent token)
and the bigram guess (the most frequent successor of the last input token), and how
often the lens's top-1 equals them, layer by layer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from depthkit.analyses import frequency, summaries
from depthkit.chapters.ch01_quantities import FIRST_LAYER


def reference_guesses(
    tok: Any, steps: pd.DataFrame, final: pd.DataFrame, last: pd.DataFrame, baseline_texts: list[str] | None
) -> tuple[pd.DataFrame, int]:
    """Per prompt, the unigram guess (the corpus's most frequent token), the bigram
    guess and the model's own prediction, as ``[item, position, guess, token_id]``;
    and the unigram token id. ``last``: :func:`last_input_tokens`."""
    bigram = frequency.bigram_successors(tok, baseline_texts)
    unigram_id = int(frequency.token_frequencies(tok, baseline_texts).sort_values("rank")["token_id"].iloc[0])
    return guesses_from(steps, final, last, bigram, unigram_id), unigram_id


def guesses_from(
    steps: pd.DataFrame, final: pd.DataFrame, last: pd.DataFrame, bigram: pd.DataFrame, unigram_id: int
) -> pd.DataFrame:
    """The guesses of :func:`reference_guesses` from the bigram table
    (:func:`depthkit.analyses.frequency.bigram_successors`). The bigram guess is the most
    frequent successor of the prompt's last input token; where that token is never
    followed by anything in the counting corpus it backs off to the unigram guess
    (``backoff`` True), so that every prompt has every guess and every agreement
    share has the same denominator: all prompts."""
    succ = pd.Series(bigram["next_id"].to_numpy(), index=bigram["prev_id"].to_numpy())
    keys = final[["item", "position"]].drop_duplicates().sort_values("item").reset_index(drop=True)
    nxt = keys[["item"]].merge(last[["item", "last_id"]], on="item", how="left", validate="one_to_one")["last_id"]
    bi = succ.reindex(nxt.to_numpy()).to_numpy()
    backoff = np.isnan(bi.astype(float))
    return pd.concat(
        [
            keys.assign(guess="unigram", token_id=unigram_id, backoff=False),
            keys.assign(guess="bigram", token_id=np.where(backoff, unigram_id, bi).astype(np.int64), backoff=backoff),
            summaries.final_top1(steps, final).rename(columns={"final_id": "token_id"}).assign(guess="final", backoff=False),
        ],
        ignore_index=True,
    )


def per_prompt_guesses(pp: pd.DataFrame, steps: pd.DataFrame, guesses: pd.DataFrame) -> pd.DataFrame:
    """``pp`` (:func:`per_prompt`) with, per (prompt, layer), whether the top-1 equals
    the bigram and the unigram guess (columns ``bigram``, ``unigram``: 1.0 or 0.0)."""
    g = guesses[guesses["guess"].isin(["bigram", "unigram"])].pivot(index="item", columns="guess", values="token_id")
    top = steps[["item", "layer", "top1_id"]].merge(g.reset_index(), on="item", how="left", validate="many_to_one")
    for name in ("bigram", "unigram"):
        top[name] = (top["top1_id"].to_numpy() == top[name].to_numpy()).astype(float)
    return pp.merge(top[["item", "layer", "bigram", "unigram"]], on=["item", "layer"], how="left", validate="one_to_one")


def shown_layers(L: int) -> list[int]:
    return sorted({FIRST_LAYER, max(1, L // 4), L // 2, (3 * L) // 4, L})


def agreement_table(agreement: pd.DataFrame, L: int) -> pd.DataFrame:
    a = agreement[agreement["layer"].isin(shown_layers(L))]
    return a.pivot(index="layer", columns="guess", values="share").map(lambda v: f"{v:.1%}")


def bigram_note(agreement: pd.DataFrame, guesses: pd.DataFrame, tok: Any, unigram_id: int, L: int) -> str:
    """The unigram guess, how many bigram guesses back off to it, and the bigram
    guess's agreement with the model's own prediction, over all prompts (the same
    denominator as every share of the agreement table and chart)."""
    bi = guesses[guesses["guess"] == "bigram"]
    n, n_back = len(bi), int(bi["backoff"].sum())
    at_l = agreement[(agreement["layer"] == L) & (agreement["guess"] == "bigram")]
    same = (f"{at_l['share'].iloc[0]:.1%} ({int(at_l['n_agree'].iloc[0])} of {int(at_l['n'].iloc[0])} prompts)"
            if len(at_l) else "—")
    return (
        f"Unigram guess: {tok.decode([unigram_id])!r}. The bigram guess is the most frequent successor of the prompt's last "
        f"input token in the counting corpus; for {n_back} of {n} prompts that token is never followed by anything there "
        f"and the guess backs off to the unigram guess. Every agreement share is over all {n} prompts. The bigram guess "
        f"equals the model's own prediction for {same}."
    )
