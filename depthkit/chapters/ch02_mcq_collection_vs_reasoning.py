"""Chapter 02 (multiple choice: collecting options, then choosing): the chapter's
computations beyond the analysis modules (:mod:`depthkit.analyses.mcq`,
:mod:`depthkit.analyses.patching`, :mod:`depthkit.analyses.early_exit`), its generated prose, its
headline quantities and the paper's reference rows.

The notebook reads everything as ``ch.X`` from this module. The prompts, the
collection and decision layers, the test of the two-stage claim, the label controls,
patching and the early exit live in the ``ch02_*`` modules beside it and are
re-exported here."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from depthkit.chapters import HEADLINE_COLUMNS, PAPER_COLUMNS
from depthkit.chapters.ch02_controls import _control_accuracy as _control_accuracy
from depthkit.chapters.ch02_controls import control_summary as control_summary
from depthkit.chapters.ch02_controls import control_table as control_table
from depthkit.chapters.ch02_controls import controls as controls
from depthkit.chapters.ch02_controls import symbol_reading as symbol_reading
from depthkit.chapters.ch02_early_exit import early_exit_summary as early_exit_summary
from depthkit.chapters.ch02_early_exit import early_exits as early_exits
from depthkit.chapters.ch02_layers import COLLECT_LEVEL as COLLECT_LEVEL
from depthkit.chapters.ch02_layers import DECIDE_LEVEL as DECIDE_LEVEL
from depthkit.chapters.ch02_layers import _collection as _collection
from depthkit.chapters.ch02_layers import _decision as _decision
from depthkit.chapters.ch02_layers import _est_layer as _est_layer
from depthkit.chapters.ch02_layers import _layer as _layer
from depthkit.chapters.ch02_layers import _matrices as _matrices
from depthkit.chapters.ch02_layers import _units as _units
from depthkit.chapters.ch02_layers import clears_baseline as clears_baseline
from depthkit.chapters.ch02_layers import demo_note as demo_note
from depthkit.chapters.ch02_layers import order_difference as order_difference
from depthkit.chapters.ch02_layers import share_ci as share_ci
from depthkit.chapters.ch02_layers import transition_difference as transition_difference
from depthkit.chapters.ch02_patching import FOLLOWS as FOLLOWS
from depthkit.chapters.ch02_patching import TRANSITION
from depthkit.chapters.ch02_patching import _tr_layer as _tr_layer
from depthkit.chapters.ch02_patching import class_shares as class_shares
from depthkit.chapters.ch02_patching import clean_runs as clean_runs
from depthkit.chapters.ch02_patching import control_direction as control_direction
from depthkit.chapters.ch02_patching import patching_summary as patching_summary
from depthkit.chapters.ch02_patching import patching_sweeps as patching_sweeps
from depthkit.chapters.ch02_patching import transition_marks as transition_marks
from depthkit.chapters.ch02_patching import transitions as transitions
from depthkit.chapters.ch02_prompts import SPARE as SPARE
from depthkit.chapters.ch02_prompts import all_prompts as all_prompts
from depthkit.chapters.ch02_prompts import prompt_summary as prompt_summary
from depthkit.chapters.ch02_prompts import prompt_table as prompt_table
from depthkit.chapters.ch02_prompts import task_prompts as task_prompts
from depthkit.chapters.ch02_testability import CLAIM as CLAIM
from depthkit.chapters.ch02_testability import LENS_FLOOR as LENS_FLOOR
from depthkit.chapters.ch02_testability import ONE_ANSWER_MAX as ONE_ANSWER_MAX
from depthkit.chapters.ch02_testability import _answer_name as _answer_name
from depthkit.chapters.ch02_testability import layer_summary as layer_summary
from depthkit.chapters.ch02_testability import testability as testability
from depthkit.stats import narrate

# The paper gives halves of the depth for all four models, not layers.
PAPER = pd.DataFrame(
    [
        ("MCQ options collected", "all four models", math.nan, 0.0, 0.5),
        ("MCQ answer settled", "all four models", math.nan, 0.5, 1.0),
    ],
    columns=PAPER_COLUMNS,
)


def model_note(info: Any, lens_name: str, convention: str) -> str:
    return narrate.model_note(info, lens_name, convention)


def paper_table(est: pd.DataFrame, model_label: str, n_blocks: int) -> pd.DataFrame:
    ref = pd.DataFrame([{"source": "paper (reference)", "model": "GPT2-XL, Pythia-6.9B, Llama-2-7B, Llama-3-8B", "task": "MMLU, SST-2, MRPC, RTE",
                         "collection (fraction of depth)": "first half", "decision (fraction of depth)": "second half"}])

    def frac(v: float) -> str:
        return f"{v / n_blocks:.2f}" if np.isfinite(v) else "not reached"

    ours = pd.DataFrame([{"source": "this run", "model": model_label, "task": r.task, "collection (fraction of depth)": frac(r.collection_layer),
                          "decision (fraction of depth)": frac(r.decision_layer)} for r in est.itertuples()])
    return pd.concat([ref, ours], ignore_index=True)


def headlines(run) -> pd.DataFrame:
    """Per task the collection and decision layers (``layer_estimates``) and per
    direction the patching transition (``patching_transitions``). The task or
    direction is part of the quantity: a run has one row per quantity. ``censored``:
    the share of resamples in which the layer is reached only at the output row L
    ("not before the output"; NaN where the run has no interval or predates it)."""
    rows = []
    for r in run["layer_estimates"].itertuples():
        n = float(r.n)
        for name, what in (("MCQ options collected", "collection"), ("MCQ answer settled", "decision")):
            rows.append((f"{name} ({r.task})", getattr(r, f"{what}_layer"), getattr(r, f"{what}_lo"), getattr(r, f"{what}_hi"), n,
                         "layer", getattr(r, f"{what}_censored_share", math.nan)))
    pt = run["patching_transitions"]
    for r in pt[pt["what"] == TRANSITION].itertuples():
        rows.append((f"patching transition ({r.direction})", r.transition_layer, r.lo, r.hi, float(r.n_pairs), "layer",
                     getattr(r, "censored_share", math.nan)))
    out = pd.DataFrame(rows, columns=[*HEADLINE_COLUMNS, "censored"])
    return out.astype({c: float for c in ("value", "lo", "hi", "n", "censored")})
