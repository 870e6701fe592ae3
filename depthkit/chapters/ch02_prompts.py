"""Chapter 02's prompts: a task's multiple-choice prompts with their option token ids
(questions whose options share a first token replaced from spare draws), the user's
own file beside them, and their summary and saved form."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd

from depthkit.analyses import mcq
from depthkit.lens.trajectories import encode

if TYPE_CHECKING:
    from depthkit.engine.handle import Model

# Extra questions drawn for written-out options, of which a few may be dropped
# (options sharing a first token) before ``n_examples`` are kept.
SPARE = 1.1


def task_prompts(model: Model, task: str, p: Mapping[str, Any], *, labels: str | None = None, permute: bool = False) -> pd.DataFrame:
    """``n_examples`` prompts of one task with their option ids. Questions whose
    options share a first token (possible with written-out options) are dropped and
    replaced from spare draws; ``attrs["dropped_shared_first_token"]`` counts them."""
    n = int(p["n_examples"])
    frame = mcq.build_prompts(task, math.ceil(n * SPARE), shots=p["shots"], labels=labels or p["option_labels"], seed=p["seed"], permute=permute)
    frame = mcq.add_option_ids(model, frame, drop_shared=True)
    dropped = frame.attrs["dropped_shared_first_token"]
    if len(frame) > n:
        frame = frame.sample(n, random_state=p["seed"]).sort_index().reset_index(drop=True)
    frame.attrs["dropped_shared_first_token"] = dropped
    return frame


def all_prompts(model: Model, p: Mapping[str, Any]) -> pd.DataFrame:
    frames = [task_prompts(model, t, p) for t in p["tasks"]]
    if p["dataset"]:
        frames.append(mcq.add_option_ids(model, mcq.load_mcq_file(p["dataset"])))
    out = pd.concat(frames, ignore_index=True)
    out.attrs["dropped_shared_first_token"] = {k: v for f in frames for k, v in f.attrs.get("dropped_shared_first_token", {}).items()}
    return out


def prompt_summary(model: Model, prompts: pd.DataFrame) -> pd.DataFrame:
    """Prompts per task, their mean length in tokens, the majority baseline and the
    questions dropped (and replaced) because two options shared a first token."""
    n_tokens = prompts["prompt"].map(lambda s: len(encode(model, s)))
    out = prompts.assign(tokens=n_tokens).groupby("task", sort=False).agg(prompts=("prompt", "size"), mean_tokens=("tokens", "mean")).round(0)
    out["majority_baseline"] = mcq.majority_baseline(prompts).round(3)
    dropped = prompts.attrs.get("dropped_shared_first_token", {})
    out["dropped_shared_first_token"] = [int(dropped.get(t, 0)) for t in out.index]
    return out


def prompt_table(prompts: pd.DataFrame) -> pd.DataFrame:
    """The prompts with list columns joined into strings (parquet-friendly)."""
    return prompts.drop(columns=["options", "option_ids"]).assign(
        options=prompts["options"].map("|".join), option_ids=prompts["option_ids"].map(lambda o: ",".join(map(str, o))))
