"""Chapter 01 (guess, then refine): the tables, prose, headline quantities and the
paper's reference rows of the frequency-bucket and decision-flip analyses.

The unit of every interval is a prompt: each prompt contributes one prediction
(its last position), and the layers of one prompt are not independent, so paired
quantities (layer 1 against layer 0 or the output) are differenced within the prompt
first. Groups of prompts are made from their input only, never from what the model predicts.

The notebook reads everything as ``ch.X`` from this module; the named quantities, the
input-token groups, the baseline guesses and the layer-0 comparison live in the
``ch01_*`` modules beside it and are re-exported here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from depthkit import stats
from depthkit.analyses import frequency, summaries
from depthkit.chapters import HEADLINE_COLUMNS
from depthkit.chapters import PAPER_COLUMNS as PAPER_COLUMNS
from depthkit.chapters.ch01_baseline_guesses import agreement_table as agreement_table
from depthkit.chapters.ch01_baseline_guesses import bigram_note as bigram_note
from depthkit.chapters.ch01_baseline_guesses import guesses_from as guesses_from
from depthkit.chapters.ch01_baseline_guesses import per_prompt_guesses as per_prompt_guesses
from depthkit.chapters.ch01_baseline_guesses import reference_guesses as reference_guesses
from depthkit.chapters.ch01_baseline_guesses import shown_layers as shown_layers
from depthkit.chapters.ch01_input_groups import NOT_WS_LED as NOT_WS_LED
from depthkit.chapters.ch01_input_groups import WS_LED as WS_LED
from depthkit.chapters.ch01_input_groups import input_group_sentence
from depthkit.chapters.ch01_input_groups import input_group_table as input_group_table
from depthkit.chapters.ch01_input_groups import input_groups as input_groups
from depthkit.chapters.ch01_input_groups import last_input_tokens as last_input_tokens
from depthkit.chapters.ch01_input_groups import last_token_frame as last_token_frame
from depthkit.chapters.ch01_layer0_vs_layer1 import _L0_WORDS as _L0_WORDS
from depthkit.chapters.ch01_layer0_vs_layer1 import L0_QUANTITIES as L0_QUANTITIES
from depthkit.chapters.ch01_layer0_vs_layer1 import layer0_sentence
from depthkit.chapters.ch01_layer0_vs_layer1 import layer0_table as layer0_table
from depthkit.chapters.ch01_layer0_vs_layer1 import layer0_vs_layer1 as layer0_vs_layer1
from depthkit.chapters.ch01_quantities import (
    _PAPER_TEXT,
    FIRST_LAYER,
    NAN,
    PAPER,
    PAPER_SOURCE,
    Q_FINAL,
    Q_FLIP,
    Q_L0,
    Q_L1,
    Q_PEAK,
    TOP,
)
from depthkit.chapters.ch01_quantities import EMBEDDING_LAYER as EMBEDDING_LAYER
from depthkit.chapters.ch01_quantities import Q_EARLY_FLIP as Q_EARLY_FLIP
from depthkit.chapters.ch01_quantities import _pp as _pp
from depthkit.stats import narrate


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
