"""Chapter 01 (guess, then refine): the tables, prose, headline quantities and the
paper's reference rows of the frequency-bucket and decision-flip analyses.

The unit of every interval is a prompt: each prompt contributes one prediction
(its last position), and the layers of one prompt are not independent, so paired
quantities (layer 1 against the output) are differenced within the prompt first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from depthkit import frequency, metrics, narrate, stats
from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS

TOP = frequency.BUCKETS[0]
# The residual after block 0 in both layer conventions.
FIRST_LAYER = 1
PAPER_SOURCE = "paper (reference)"
NAN = float("nan")

Q_PEAK = "Top-10 share of the lens top-1 peaks at"
Q_L1 = "layer-1 top-1 in Top 1-10"
Q_FINAL = "final top-1 in Top 1-10"
Q_FLIP = "layer-1 Top 1-10 guesses later overturned"
Q_EARLY_FLIP = "early high-frequency guesses later overturned"

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
    lab = metrics.label_buckets(steps, freq)
    fin = metrics.final_top1(steps, final)
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
    final_steps = metrics.final_top1(steps, final).rename(columns={"final_id": "top1_id"}).assign(layer=L)
    return {
        "shares": metrics.bucket_shares(steps, freq, n_boot=n_boot, seed=seed),
        "final_share": metrics.bucket_shares(final_steps, freq, n_boot=n_boot, seed=seed),
        "flips": metrics.flip_rates(steps, freq, final=final, n_boot=n_boot, seed=seed),
    }


def whitespace_items(steps: pd.DataFrame) -> np.ndarray:
    """The prompts whose top-1 is a whitespace token (the bare space, a newline) at
    some layer from layer 1 on. The bare space is one of the most frequent tokens, so
    such predictions inflate the early Top-10 share; the authors re-ran such prompts."""
    s = steps[steps["layer"] >= FIRST_LAYER]
    blank = s["top1_token"].astype(str).str.strip() == ""
    return np.sort(s.loc[blank, "item"].unique())


def drop_items(frame: pd.DataFrame, items: np.ndarray) -> pd.DataFrame:
    return frame[~frame["item"].isin(items)].reset_index(drop=True)


def _pick(df: pd.DataFrame, layer: int, bucket: str = TOP) -> pd.Series:
    return df[(df["layer"] == layer) & (df["bucket"].astype(str) == bucket)].iloc[0]


def headline_table(
    t: dict[str, pd.DataFrame], L: int, source: str, no_blank: dict[str, pd.DataFrame] | None = None, n_blank: int = 0
) -> pd.DataFrame:
    """This run's three headline shares beside the paper's (reference) values, and
    (``no_blank``: :func:`bucket_tables` without :func:`whitespace_items`) the
    layer-1 and final shares without the prompts with whitespace predictions."""
    l1, fin, fl1 = _pick(t["shares"], FIRST_LAYER), _pick(t["final_share"], L), _pick(t["flips"], FIRST_LAYER)
    paper = {q: (f"{PAPER_SOURCE}: {model}", text, "") for q, (model, text) in _PAPER_TEXT.items()}
    rows = [
        (Q_L1, source, narrate.share(l1["share"], l1["lo"], l1["hi"]), f"{int(l1['n'])} of {int(l1['n_total'])}"),
        (Q_L1, *paper[Q_L1]),
        (Q_FINAL, source, narrate.share(fin["share"], fin["lo"], fin["hi"]), f"{int(fin['n'])} of {int(fin['n_total'])}"),
        (Q_FINAL, *paper[Q_FINAL]),
        (Q_FLIP, source, narrate.share(fl1["flip_rate"], fl1["lo"], fl1["hi"]), f"{int(fl1['n_flipped'])} of {int(fl1['n'])}"),
        (Q_EARLY_FLIP, *paper[Q_EARLY_FLIP]),
    ]
    if no_blank is not None:
        without = f"{source}, without the {n_blank} prompts with a whitespace prediction"
        for q, frame, layer in ((Q_L1, no_blank["shares"], FIRST_LAYER), (Q_FINAL, no_blank["final_share"], L)):
            r = _pick(frame, layer)
            rows.append((q, without, narrate.share(r["share"], r["lo"], r["hi"]), f"{int(r['n'])} of {int(r['n_total'])}"))
    return pd.DataFrame(rows, columns=["result", "source", "value [95 % CI]", "count"])


def reference_guesses(
    net: Any, tok: Any, steps: pd.DataFrame, final: pd.DataFrame, prompts: pd.DataFrame, baseline_texts: list[str] | None
) -> tuple[pd.DataFrame, int]:
    """Per prompt, the unigram guess (the corpus's most frequent token), the bigram
    guess (most frequent successor of the prompt's last token) and the model's own
    prediction, as ``[item, position, guess, token_id]``; and the unigram token id."""
    from depthkit.trajectories import encode

    bigram = frequency.bigram_successors(tok, baseline_texts)
    unigram_id = int(frequency.token_frequencies(tok, baseline_texts).sort_values("rank")["token_id"].iloc[0])
    last_ids = np.array([encode(net, t, on_overflow="truncate")[-1] for t in prompts["prompt"]])
    succ = pd.Series(bigram["next_id"].to_numpy(), index=bigram["prev_id"].to_numpy())
    keys = final[["item", "position"]].drop_duplicates().sort_values("item").reset_index(drop=True)
    guesses = pd.concat(
        [
            keys.assign(guess="unigram", token_id=unigram_id),
            keys.assign(guess="bigram", token_id=succ.reindex(last_ids).to_numpy()),
            metrics.final_top1(steps, final).rename(columns={"final_id": "token_id"}).assign(guess="final"),
        ],
        ignore_index=True,
    )
    return guesses, unigram_id


def shown_layers(L: int) -> list[int]:
    return sorted({FIRST_LAYER, max(1, L // 4), L // 2, (3 * L) // 4, L})


def agreement_table(agreement: pd.DataFrame, L: int) -> pd.DataFrame:
    a = agreement[agreement["layer"].isin(shown_layers(L))]
    return a.pivot(index="layer", columns="guess", values="share").map(lambda v: f"{v:.1%}")


def bigram_note(guesses: pd.DataFrame, tok: Any, unigram_id: int) -> str:
    g = guesses.set_index(["item", "guess"])["token_id"].unstack()
    same = float((g["bigram"] == g["final"]).mean())
    return (
        f"Unigram guess: {tok.decode([unigram_id])!r}. The bigram guess equals the model's final prediction "
        f"for {same:.1%} of prompts."
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
    no_blank: dict[str, pd.DataFrame] | None = None,
    n_blank: int = 0,
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
    blank = ""
    if no_blank is not None and n_blank:
        b1 = _pick(no_blank["shares"], FIRST_LAYER)
        blank = (
            f"\n* Leaving out the {n_blank} prompts whose top-1 is a whitespace token at some layer (the bare space is "
            f"a Top-10 token), the layer-1 Top-10 share is {narrate.share(b1['share'], b1['lo'], b1['hi'], digits=0)} "
            f"of {int(b1['n_total'])} prompts."
        )
    elif no_blank is not None:
        blank = "\n* No prompt has a whitespace token as its top-1 at any layer, so none is left out."
    return f"""
On {n_prompts} Wikipedia prefixes, read through the {source}:

* At layer 1, **{narrate.share(l1["share"], l1["lo"], l1["hi"], digits=0)}** of top-1 predictions are one of the
  ten most frequent tokens; the Top-10 share peaks at {narrate.layer(pk["estimate"], pk["lo"], pk["hi"], n_blocks=L, **_grid(pk))}
  ({peak_share:.0%}) and the model's own predictions have **{narrate.share(fin["share"], fin["lo"], fin["hi"], digits=0)}**
  in the Top 10: from layer 1 to the output (paired over prompts), {trend}.
* **{narrate.share(fl1["flip_rate"], fl1["lo"], fl1["hi"], digits=0)}** of layer-1 Top-10 guesses differ from the final
  prediction; over layers 1–{early[-1]}, {narrate.share(fe["estimate"], fe["lo"], fe["hi"], digits=0)} of Top-10
  guesses do (prompts resampled as wholes).
* At layer 1 the top-1 equals the unigram guess for {a1.get("unigram", np.nan):.0%} of prompts and the bigram guess for
  {a1.get("bigram", np.nan):.0%}.{blank}
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
