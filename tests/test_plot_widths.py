"""Every chart of the book fits the book's content column at its natural size.

The page scales a wider chart down to the column (plots._FIT_CSS), which keeps it
inside the page but shrinks its text: so each chart function is drawn here, on a
small frame shaped like the chapter's and with labels as long as the chapters' own,
through vl-convert (the same Vega that draws the book's charts), and its SVG width
must be at most plots.COLUMN_WIDTH.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import altair as alt
import numpy as np
import pandas as pd
import pytest

from depthkit import plots
from depthkit.chapters import ch07_across_models as across
from depthkit.plots._common import COLUMN_WIDTH

L = 30
LAYERS = range(L + 1)
TASKS = ["mmlu", "mrpc", "rte", "sst2"]
LENSES = ["logit", "tuned", "tuned, ' the' down-weighted", "tuned, Top-10 down-weighted"]
BUCKETS = ["Top 1-10", "11-100", "101-1000", "rest"]
TAGS = ["DET", "ADP", "PUNCT", "NOUN", "VERB", "ADJ"]


def natural_width(chart: alt.TopLevelMixin) -> float:
    import vl_convert as vlc

    svg = vlc.vegalite_to_svg(chart.to_dict())
    return float(re.search(r'<svg[^>]* width="([\d.]+)"', svg).group(1))


def _grid(**columns: Any) -> pd.DataFrame:
    index = pd.MultiIndex.from_product(list(columns.values()), names=list(columns))
    return index.to_frame(index=False)


def _band(df: pd.DataFrame, col: str) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    v = rng.uniform(0.1, 0.9, len(df))
    return df.assign(**{col: v, "lo": v - 0.05, "hi": v + 0.05, "n": 40})


def _examples() -> pd.DataFrame:
    df = _grid(item=range(3), lens=["logit", "tuned"], layer=LAYERS, k=range(1, 6))
    return df.assign(token=" dissemin", prob=0.3)


def _explorer() -> pd.DataFrame:
    df = _grid(prompt=range(8), position=range(40, 50), layer=LAYERS)
    return df.assign(
        label="…the first prompt that ends with a long Wikipedia sentence",
        column=[f"' Einstein' ·{p}" for p in df["position"]],
        top1="' disseminated'", prob=0.4, top3="' a' 40%  ' b' 20%  ' c' 5%",
    )


def _option_shares(variants: list[str]) -> pd.DataFrame:
    df = _grid(task=TASKS, variant=variants, layer=LAYERS)
    return df.assign(collected_share=0.5, mass=0.4, final_share=0.3, gold_share=0.2)


def _option_estimates() -> pd.DataFrame:
    return pd.DataFrame({"task": TASKS, "variant": "prompts", "collection_layer": 20.0, "decision_layer": 25.0})


def _residual_curves() -> pd.DataFrame:
    panels = {"‖Δ‖/‖h‖": ["attn_rel", "block_rel", "mlp_rel"], "cos(Δ, h)": ["cos_attn", "cos_mlp", "cos_update"],
              "KL(p_L ‖ q_ℓ), nats": ["KL, logit lens", "KL, tuned lens"], "top-1 in Top-10": ["Top-10 share, tuned lens"]}
    frames = [_grid(x=range(L), stat=stats).assign(panel=panel) for panel, stats in panels.items()]
    return pd.concat(frames).assign(mean=0.5, lo=0.4, hi=0.6)


TRANSITIONS = pd.DataFrame(
    {"name": ["ℓ* (two-segment fit, log block_rel)", "KL knee (tuned lens)", "Top-10 share reaches its final level",
              "patching transition (sst2 → mmlu)"], "estimate": [3.0, 18, 29, 24], "lo": [2.0, 17, 21, 20], "hi": [4.0, 20, 30, 27]}
)


def _across() -> pd.DataFrame:
    ours = pd.DataFrame(
        [(q, m, 0.5, 0.4, 0.6, 20, "layer", across.OURS, c)
         for m in ("smollm2-135m", "gemma3-270m")
         for q, c in [("MCQ options collected (mmlu)", "02"), ("MCQ answer settled (mmlu)", "02"),
                      ("fact recall rank-1 onset, answer token 1 (trivia_qa)", "03"), ("rank-1 onset, function words", "04"),
                      ("ℓ* (two-segment fit, log block_rel)", "05"), ("patching transition (sst2 → mmlu)", "02"),
                      ("patching transition (sst2 → mmlu)", "05")]],
        columns=across.TABLE_COLUMNS,
    )
    paper = pd.DataFrame(
        [("MCQ options collected", "all four models", np.nan, 0.0, 0.5, np.nan, "layer", across.PAPER_SOURCE, "02"),
         ("rank-1 onset, function words", "main figure (32 blocks)", 0.16, np.nan, np.nan, np.nan, "layer", across.PAPER_SOURCE, "04")],
        columns=across.TABLE_COLUMNS,
    )
    return across.depth_rows(pd.concat([ours, paper], ignore_index=True))


TITLE = "smollm2-135m, tuned lens: a title as long as the chapters' own"
CHARTS: dict[str, Callable[[], alt.TopLevelMixin]] = {
    "00 lens fidelity": lambda: plots.lens_fidelity_chart(
        _grid(layer=LAYERS, lens=["logit", "tuned", "tuned (ridge start)"]).assign(kl=1.0, top1_agreement=0.5), title=TITLE
    ),
    "00 examples": lambda: plots.lens_examples_chart(
        _examples(), ["The capital of France is", "In 1905, Albert Einstein published", "She poured the milk into the"]
    ),
    "00 one example": lambda: plots.lens_topk_chart(_examples().query("item == 0"), title="'The capital of France is'"),
    "00 top-10 share": lambda: plots.top10_share_chart(_grid(layer=LAYERS, lens=LENSES).assign(share=0.5), title=TITLE),
    "00 explorer": lambda: plots.lens_explorer_chart(_explorer(), title=TITLE),
    "01 buckets": lambda: plots.bucket_share_chart(
        _band(_grid(layer=LAYERS, bucket=BUCKETS), "share").assign(n_total=400), title=TITLE
    ),
    "01 flips": lambda: plots.flip_rate_chart(_band(_grid(layer=LAYERS, bucket=BUCKETS), "flip_rate"), title=TITLE),
    "01 agreement": lambda: plots.agreement_chart(_band(_grid(layer=LAYERS, guess=["unigram", "bigram", "final"]), "share"), title=TITLE),
    "02 options": lambda: plots.option_layers_chart(_option_shares(["prompts"]), _option_estimates()),
    "02 controls": lambda: plots.option_layers_chart(
        _option_shares(["original", "symbols", "permuted"]).query("task == 'mmlu'"), _option_estimates().head(1),
        title="mmlu: original, relabelled and permuted options",
    ),
    "02 patching": lambda: plots.patching_chart(
        _grid(direction=["sst2 → mmlu", "mmlu → sst2"], layer=range(0, L + 1, 3), **{"class": ["target-option", "source-option", "other"]}).assign(share=1 / 3, n=4),
        marks=pd.DataFrame({"direction": ["sst2 → mmlu", "mmlu → sst2"], "layer": [24.0, 21], "what": ["patching transition", "lens collection layer"]}),
    ),
    "02 early exit": lambda: plots.early_exit_chart(
        _grid(task=TASKS, layer=LAYERS).assign(compute_fraction=lambda d: d["layer"] / L, agreement=0.5, choice_agreement=0.5,
                                               choice_accuracy=0.4, accuracy=0.3)
    ),
    "03 fact onsets": lambda: plots.fact_onset_chart(
        _grid(token=[1, 2, 3], group=["correct = False", "correct = True", "answer of 1 tokens", "answer of 2 tokens",
                                      "answer of 3 tokens", "answer of 4+ tokens"], k=[1, 10, 100, 1000]).assign(mean_onset=10.0, n_reached=5, n_items=6)
    ),
    "04 onset curves": lambda: plots.onset_curve_chart(
        _band(_grid(tag=TAGS, k=[1, 10, 100, 1000, 10000]), "mean_onset").assign(
            n_reached=50, n_items=60, word_class=lambda d: np.where(d["tag"].isin(["DET", "ADP", "PUNCT"]), "function", "content")
        ), n_layers=L, title=TITLE,
    ),
    "04 onset distribution": lambda: plots.onset_distribution_chart(
        _grid(tag=TAGS, i=range(20)).assign(onset=5, answer=" the", prompt_end="…of"),
        pd.DataFrame({"tag": TAGS, "estimate": 5.0, "lo": 4.0, "hi": 6.0, "n": 20}), n_layers=L, title=TITLE,
    ),
    "04 matched onset": lambda: plots.matched_onset_chart(
        _grid(freq_bin=["1-10", "11-30", "31-100", "101-300", "301-1000", "1001-3000", ">3000"], word_class=["function", "content"]).assign(
            estimate=5.0, lo=4.0, hi=6.0, n=20
        ), n_layers=L, title=TITLE,
    ),
    "05 transitions": lambda: plots.transition_chart(TRANSITIONS, n_blocks=L, title="smollm2-135m: transition layers"),
    "05 residual curves": lambda: plots.residual_curves_chart(
        _residual_curves(), marks=TRANSITIONS.rename(columns={"estimate": "layer"})[["name", "layer"]]
    ),
    "05 skip effect": lambda: plots.skip_effect_chart(
        _grid(skipped=range(L), layer=range(L)).assign(rel_change=0.1),
        pd.DataFrame({"skipped": range(L), "kl": 0.5, "top1_agreement": 0.9}),
        title="smollm2-135m: removing one block's update (1,234 positions)",
    ),
    "06 histogram": lambda: plots.depth_histogram_chart(
        _grid(measure=["d1_norm", "d_sat_norm"], i=range(50)).assign(value=0.5),
        title="smollm2-135m, tuned lens: onset and saturation depth of 4,416 predicted tokens",
    ),
    "06 by group": lambda: plots.depth_by_group_chart(
        _grid(pos=["ADJ", "ADP", "AUX", "DET", "NOUN", "NUM", "PART", "PROPN"], measure=["d1_norm", "d_sat_norm"]).assign(
            estimate=0.5, lo=0.4, hi=0.6, n=30
        ), group="pos", title="smollm2-135m: depth by part of speech of the predicted token",
    ),
    "06 exit frontier": lambda: plots.exit_frontier_chart(
        _grid(policy=["confidence", "fixed", "oracle (d_1)", "oracle (d_sat)"], param=range(8)).assign(agreement=0.9, frac_layers=0.5),
        title="smollm2-135m, tuned lens: early exit on 1,234 held-out tokens",
    ),
    "07 across models": lambda: plots.across_models_chart(_across(), title="Headline depths on ℓ/L"),
}


@pytest.mark.parametrize("name", list(CHARTS))
def test_chart_fits_the_column_at_its_natural_width(name: str) -> None:
    width = natural_width(CHARTS[name]())
    assert width <= COLUMN_WIDTH, f"{name}: {width:.0f} px wide, the column is {COLUMN_WIDTH} px"


def test_every_chart_function_is_checked() -> None:
    import inspect

    source = "\n".join(inspect.getsource(f) for f in CHARTS.values())
    assert {n for n in plots.__all__ if n.endswith("_chart") and f"plots.{n}(" not in source} == set()
