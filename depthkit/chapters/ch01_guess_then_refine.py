"""Chapter 01 (guess, then refine): the tables, prose, headline quantities and the
paper's reference rows of the frequency-bucket and decision-flip analyses.

The unit of every interval is a prompt: each prompt contributes one prediction
(its last position), and the layers of one prompt are not independent, so paired
quantities (layer 1 against layer 0 or the output) are differenced within the prompt
first. Groups of prompts are made from their input only, never from what the model predicts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from depthkit import stats
from depthkit.analyses import frequency, summaries
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.stats import narrate

TOP = frequency.BUCKETS[0]
# The embedding row (no block has run) and the residual after block 0, in both layer conventions.
EMBEDDING_LAYER = 0
FIRST_LAYER = 1
PAPER_SOURCE = "paper (reference)"
NAN = float("nan")

Q_PEAK = "Top-10 share of the lens top-1 peaks at"
Q_L0 = "layer-0 (embedding) top-1 in Top 1-10"
Q_L1 = "layer-1 top-1 in Top 1-10"
Q_FINAL = "final top-1 in Top 1-10"
Q_FLIP = "layer-1 Top 1-10 guesses later overturned"
Q_EARLY_FLIP = "early high-frequency guesses later overturned"

# The two groups of prompts by their last *input* token (known before the model runs).
WS_LED, NOT_WS_LED = "last input token whitespace-led", "last input token not whitespace-led"
# What the layer-0/layer-1 comparison compares (per-prompt columns of :func:`per_prompt_guesses`).
L0_QUANTITIES = {"top10": "top-1 in Top 1-10", "bigram": "top-1 = bigram guess", "unigram": "top-1 = unigram guess"}

# Shares are fractions; a bound alone ("> 75 %") is a range lo..hi with no value.
PAPER = pd.DataFrame(
    [
        (Q_L1, "Pythia-6.9B", NAN, 0.75, 1.0),
        (Q_FINAL, "Pythia-6.9B", 0.33, NAN, NAN),
        (Q_FLIP, "Pythia-6.9B", 0.80, NAN, NAN),
        (Q_EARLY_FLIP, "all four models", NAN, 0.70, 1.0),
        ("corpus share of the Top-10 tokens", "Llama-2 tokenizer, Wikipedia", 0.23, NAN, NAN),
        ("corpus share of the Top-100 tokens", "Llama-2 tokenizer, Wikipedia", 0.47, NAN, NAN),
        ("corpus share of the Top-1000 tokens", "Llama-2 tokenizer, Wikipedia", 0.69, NAN, NAN),
    ],
    columns=PAPER_COLUMNS,
)
# How the headline table words the paper's rows (the paper gives bounds, not intervals).
_PAPER_TEXT = {
    Q_L1: ("Pythia-6.9B", "> 75 %"),
    Q_FINAL: ("Pythia-6.9B", "≈ 33 %"),
    Q_EARLY_FLIP: ("all four models", "> 70 % (≈ 80 % Pythia layer 1)"),
}


def load_prompts(dataset: str, n_prompts: int, seed: int) -> tuple[pd.DataFrame, list[str] | None]:
    """The prompts and the texts the baseline guesses are counted on (None: the
    embedded Wikipedia paragraphs)."""
    from depthkit import data

    source = data.resolve_dataset(dataset, default="wikipedia", required=("prompt",))
    if "passage" not in source.columns:
        prompts = source.sample(n=min(n_prompts, len(source)), random_state=seed)[["prompt"]].reset_index(drop=True)
        return prompts, None
    passages = source["passage"].tolist()
    prompts = data.wikipedia_prefixes(n_prompts, seed=seed, passages=passages)
    # The baselines must not have counted the continuation of the very passages the
    # prompts are cut from.
    used = set(prompts["passage_id"])
    return prompts, [t for i, t in enumerate(passages) if i not in used]


def model_note(info: Any, lens_name: str, convention: str) -> str:
    return narrate.model_note(info, lens_name, convention)


def per_prompt(steps: pd.DataFrame, final: pd.DataFrame, freq: pd.DataFrame) -> pd.DataFrame:
    """One row per (prompt, layer): whether the top-1 is a Top-10 token (``top10``),
    differs from the model's own prediction (``flip``), and whether that final
    prediction is a Top-10 token (``final_top10``)."""
    lab = summaries.label_buckets(steps, freq)
    fin = summaries.final_top1(steps, final)
    keys = [c for c in fin.columns if c != "final_id"]
    fin["final_top10"] = frequency.bucket_of(frequency.ranks_of(freq, fin["final_id"].to_numpy())) == TOP
    out = lab.merge(fin, on=keys, how="left", validate="many_to_one")
    out["top10"] = (out["bucket"] == TOP).astype(float)
    out["flip"] = (out["top1_id"] != out["final_id"]).astype(float)
    out["final_top10"] = out["final_top10"].astype(float)
    return out[[*keys, "layer", "bucket", "top10", "flip", "final_top10"]]


def bucket_tables(
    steps: pd.DataFrame, final: pd.DataFrame, freq: pd.DataFrame, L: int, *, n_boot: int, seed: int
) -> dict[str, pd.DataFrame]:
    """Bucket shares per layer, the model's own prediction bucketed the same way
    (at layer ``L``), and flip rates per layer and bucket."""
    final_steps = summaries.final_top1(steps, final).rename(columns={"final_id": "top1_id"}).assign(layer=L)
    return {
        "shares": summaries.bucket_shares(steps, freq, n_boot=n_boot, seed=seed),
        "final_share": summaries.bucket_shares(final_steps, freq, n_boot=n_boot, seed=seed),
        "flips": summaries.flip_rates(steps, freq, final=final, n_boot=n_boot, seed=seed),
    }


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


def _pp(diff: float, lo: float, hi: float) -> str:
    """A difference in percentage points with its interval, signed as
    :func:`depthkit.stats.narrate.difference` writes it ("+3.1 pp (95 % CI -1.0 to +7.2)")."""
    if not np.isfinite(diff):
        return "—"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{diff:+.1f} pp ({narrate.NO_INTERVAL})"
    return f"{diff:+.1f} pp ({narrate.CI_LABEL} {lo:+.1f} to {hi:+.1f})"


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


def _pick(df: pd.DataFrame, layer: int, bucket: str = TOP) -> pd.Series:
    return df[(df["layer"] == layer) & (df["bucket"].astype(str) == bucket)].iloc[0]


def headline_table(t: dict[str, pd.DataFrame], L: int, source: str) -> pd.DataFrame:
    """This run's headline shares (the embedding row, layer 1, the output and the
    layer-1 flips) beside the paper's (reference) values."""
    l1, fin, fl1 = _pick(t["shares"], FIRST_LAYER), _pick(t["final_share"], L), _pick(t["flips"], FIRST_LAYER)
    paper = {q: (f"{PAPER_SOURCE}: {model}", text, "") for q, (model, text) in _PAPER_TEXT.items()}

    def ours(q: str, r: pd.Series) -> tuple:
        return (q, source, narrate.share(r["share"], r["lo"], r["hi"]), f"{int(r['n'])} of {int(r['n_total'])}")

    rows = []
    if (t["shares"]["layer"] == EMBEDDING_LAYER).any():
        rows.append(ours(Q_L0, _pick(t["shares"], EMBEDDING_LAYER)))
    rows += [
        ours(Q_L1, l1),
        (Q_L1, *paper[Q_L1]),
        ours(Q_FINAL, fin),
        (Q_FINAL, *paper[Q_FINAL]),
        (Q_FLIP, source, narrate.share(fl1["flip_rate"], fl1["lo"], fl1["hi"]), f"{int(fl1['n_flipped'])} of {int(fl1['n'])}"),
        (Q_EARLY_FLIP, *paper[Q_EARLY_FLIP]),
    ]
    return pd.DataFrame(rows, columns=["result", "source", "value [95 % CI]", "count"])


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
        if not narrate.excludes_zero(top["diff_lo"], top["diff_hi"]):
            verdict = ("Layer 1 does not differ clearly from layer 0 in its Top-10 share: as far as this run can tell, the "
                       "frequent-token guess at layer 1 is what the embeddings alone already give through the lens.")
        else:
            word = "higher" if top["diff_pp"] > 0 else "lower"
            verdict = (f"Layer 1 differs clearly from layer 0: its Top-10 share is {word} than what the embeddings alone "
                       "give through the lens, so the layer-1 guess is not the embeddings' guess alone.")
    return f"Layer 1 against layer 0 (the embedding row, before any block; paired over prompts): {'; '.join(parts)}. {verdict}".strip()


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


def corpus_table(freq: pd.DataFrame, source: str) -> pd.DataFrame:
    """Share of corpus tokens covered by the Top-10/100/1000 tokens, here and in the paper."""
    ref = PAPER[PAPER["quantity"].str.startswith("corpus share")]
    paper = pd.DataFrame(
        {
            "top_k": ref["quantity"].str.extract(r"Top-(\d+)")[0].astype(int).to_numpy(),
            "share": ref["value"].to_numpy(),
            "source": f"{PAPER_SOURCE}: {ref['model'].iloc[0]}",
        }
    )
    both = pd.concat([frequency.corpus_share_of_top(freq).assign(source=source), paper], ignore_index=True)
    return both.pivot(index="source", columns="top_k", values="share").map(lambda v: f"{v:.0%}")


def _argmax_layer(x: np.ndarray, y: np.ndarray) -> float:
    return float(x[int(np.nanargmax(y))])


def peak_layer(pp: pd.DataFrame, *, n_boot: int, seed: int) -> pd.DataFrame:
    """Layer (from layer 1: layer 0 is the embedding through the lens, no depth) where
    the Top-10 share of the lens top-1 peaks, resampling prompts:
    ``[quantity, estimate, lo, hi, n, mode_share, step, censored_share]`` (the last
    three as in :class:`depthkit.stats.LayerCI`; the output row is the last layer)."""
    depth = pp[pp["layer"] >= FIRST_LAYER]
    est = stats.curve_estimate(
        depth.rename(columns={"top10": "value"}), "value", _argmax_layer, by="layer", n_boot=n_boot, seed=seed,
        censor_at=float(depth["layer"].max()),
    )
    keep = ("estimate", "lo", "hi", "n", "mode_share", "step", "censored_share")
    return pd.DataFrame([{"quantity": Q_PEAK, **{k: getattr(est, k) for k in keep}}])


def _grid(row: pd.Series) -> dict[str, float]:
    """The peak's LayerCI extras that the saved row has (older runs lack them)."""
    return {k: float(row[k]) for k in ("mode_share", "step", "censored_share") if k in row and np.isfinite(row[k])}


def summary(
    pp: pd.DataFrame,
    t: dict[str, pd.DataFrame],
    peak: pd.DataFrame,
    agreement: pd.DataFrame,
    *,
    L: int,
    source: str,
    weights: str,
    minutes: float,
    n_boot: int,
    seed: int,
    layer0: pd.DataFrame | None = None,
    groups: pd.DataFrame | None = None,
) -> str:
    """The chapter's closing prose, every number with its interval over prompts."""
    l1 = _pick(t["shares"], FIRST_LAYER)
    fin = _pick(t["final_share"], L)
    fl1 = _pick(t["flips"], FIRST_LAYER)
    pk = peak.iloc[0]
    tops = t["shares"][t["shares"]["bucket"].astype(str) == TOP].set_index("layer")["share"]
    peak_share = tops[tops.index >= FIRST_LAYER].max()
    at1 = pp[pp["layer"] == FIRST_LAYER]
    change = stats.bootstrap_ci((at1["final_top10"] - at1["top10"]).to_numpy() * 100, n_boot=n_boot, seed=seed)
    trend = narrate.difference(
        *change[:3], more="higher", less="lower", than="at layer 1", subject="Top-10 shares at the output",
        unit="percentage points",
    )
    early = list(range(1, max(2, L // 4) + 1))
    flips_early = stats.unit_mean(
        pp[pp["layer"].isin(early) & (pp["top10"] == 1)], "flip", "item", n_boot=n_boot, seed=seed
    )
    fe = flips_early.iloc[0] if len(flips_early) else pd.Series({"estimate": NAN, "lo": NAN, "hi": NAN})
    a1 = agreement[agreement["layer"] == FIRST_LAYER].set_index("guess")["share"]
    n_prompts = int(pp["item"].nunique())
    # every guess has every prompt (see guesses_from), so one denominator
    denominator = int(agreement.loc[agreement["layer"] == FIRST_LAYER, "n"].max()) if "n" in agreement else n_prompts
    extra = ""
    if layer0 is not None:
        extra += f"\n* {layer0_sentence(layer0)}"
    if groups is not None and len(groups):
        extra += f"\n* {input_group_sentence(groups)}"
    return f"""
On {n_prompts} Wikipedia prefixes, read through the {source}:

* At layer 1, **{narrate.share(l1["share"], l1["lo"], l1["hi"], digits=0)}** of top-1 predictions are one of the
  ten most frequent tokens; the Top-10 share peaks at {narrate.layer(pk["estimate"], pk["lo"], pk["hi"], n_blocks=L, **_grid(pk))}
  ({peak_share:.0%}) and the model's own predictions have **{narrate.share(fin["share"], fin["lo"], fin["hi"], digits=0)}**
  in the Top 10: from layer 1 to the output (paired over prompts), {trend}.
* **{narrate.share(fl1["flip_rate"], fl1["lo"], fl1["hi"], digits=0)}** of layer-1 Top-10 guesses differ from the final
  prediction; over layers 1–{early[-1]}, {narrate.share(fe["estimate"], fe["lo"], fe["hi"], digits=0)} of Top-10
  guesses do (prompts resampled as wholes).
* At layer 1 the top-1 equals the unigram guess for {a1.get("unigram", np.nan):.0%} and the bigram guess for
  {a1.get("bigram", np.nan):.0%} of all {denominator} prompts (the bigram guess backs off to the unigram guess where the last
  input token has no successor in the counting corpus, so both shares have the same denominator).{extra}
* The paper reports > 75 % Top-10 at layer 1, ≈ 33 % at the output and > 70 % overturned for 7-8B models; these are
  {weights} weights of a much smaller model, and the numbers above are this run's alone.

Run time: {minutes:.1f} min.
"""


def headlines(run: Any) -> pd.DataFrame:
    """The peak layer of the Top-10 share (with its interval where the run saved
    ``peak_layer``), and the layer-1, final and layer-1 flip shares."""
    shares = run["bucket_shares"]
    top = shares[shares["bucket"].astype(str) == TOP]
    rows = []
    try:
        pk = run["peak_layer"].iloc[0]
        rows.append((Q_PEAK, pk["estimate"], pk["lo"], pk["hi"], pk["n"], "layer"))
    except Exception:  # runs saved before the peak had an interval
        depth = top[top["layer"] >= FIRST_LAYER]
        best = depth.loc[depth["share"].idxmax()]
        rows.append((Q_PEAK, best["layer"], NAN, NAN, best["n_total"], "layer"))
    l1 = top[top["layer"] == FIRST_LAYER].iloc[0]
    rows.append((Q_L1, l1["share"], l1.get("lo", NAN), l1.get("hi", NAN), l1["n_total"], "share"))
    fs = run["final_bucket_shares"]
    fin = fs[fs["bucket"].astype(str) == TOP].iloc[0]
    rows.append((Q_FINAL, fin["share"], fin.get("lo", NAN), fin.get("hi", NAN), fin["n_total"], "share"))
    fl = run["flip_rates"]
    fl1 = fl[(fl["layer"] == FIRST_LAYER) & (fl["bucket"].astype(str) == TOP)]
    if len(fl1):
        r = fl1.iloc[0]
        rows.append((Q_FLIP, r["flip_rate"], r.get("lo", NAN), r.get("hi", NAN), r["n"], "share"))
    out = pd.DataFrame(rows, columns=HEADLINE_COLUMNS)
    for c in ("value", "lo", "hi", "n"):
        out[c] = out[c].astype(float)
    return out
