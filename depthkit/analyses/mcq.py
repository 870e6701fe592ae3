"""Constrained choice: few-shot multiple-choice prompts and the per-layer analysis of
*option collection* and *option reasoning* (the paper's multiple-choice analysis).

The prompts are built in :mod:`depthkit.analyses.mcq_prompts` (:func:`build_prompts`
for the embedded tasks, :func:`load_mcq_file` for a user's file). The option token of
each option is the first token of ``" " + label`` as it follows the prompt
(:func:`depthkit.lens.trajectories.answer_token_ids`).

:func:`option_ranks`, here, decodes every layer through a lens and keeps rank and
probability of every option token; the pure functions of
:mod:`depthkit.analyses.mcq_layers` turn that frame into per-layer shares.
*Collected* at layer ℓ: every option sits in the top-|O| of the whole vocabulary.
*Choice* at ℓ: the most probable option; the model's *answer* is the choice at
ℓ = L.

The names that lived here before the split are re-exported, so ``mcq.X`` still reaches them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# The ``X as X`` imports were used here before the prompts
# and the pure analysis moved out; they stay reachable as ``mcq.X``.
import numpy as np
import pandas as pd

from depthkit import data as dkdata  # noqa: F401
from depthkit.analyses.mcq_layers import _RANK_COLUMNS as _RANK_COLUMNS
from depthkit.analyses.mcq_layers import _check as _check
from depthkit.analyses.mcq_layers import _collection_layer as _collection_layer
from depthkit.analyses.mcq_layers import _decision_layer as _decision_layer
from depthkit.analyses.mcq_layers import _demo_units as _demo_units
from depthkit.analyses.mcq_layers import accuracy as accuracy
from depthkit.analyses.mcq_layers import collection_reasoning as collection_reasoning
from depthkit.analyses.mcq_layers import first_layer_reaching as first_layer_reaching
from depthkit.analyses.mcq_layers import layer_estimates as layer_estimates
from depthkit.analyses.mcq_layers import majority_baseline as majority_baseline
from depthkit.analyses.mcq_layers import per_item as per_item
from depthkit.analyses.mcq_prompts import _GLUE as _GLUE
from depthkit.analyses.mcq_prompts import LETTERS as LETTERS
from depthkit.analyses.mcq_prompts import SYMBOLS as SYMBOLS
from depthkit.analyses.mcq_prompts import TASKS as TASKS
from depthkit.analyses.mcq_prompts import WORD_TASKS as WORD_TASKS
from depthkit.analyses.mcq_prompts import WORDS as WORDS
from depthkit.analyses.mcq_prompts import Example as Example
from depthkit.analyses.mcq_prompts import Labels as Labels
from depthkit.analyses.mcq_prompts import _distinct_first_words as _distinct_first_words
from depthkit.analyses.mcq_prompts import _glue_examples as _glue_examples
from depthkit.analyses.mcq_prompts import _label_set as _label_set
from depthkit.analyses.mcq_prompts import _mmlu_examples as _mmlu_examples
from depthkit.analyses.mcq_prompts import build_prompts as build_prompts
from depthkit.analyses.mcq_prompts import load_mcq_file as load_mcq_file
from depthkit.analyses.mcq_prompts import render as render
from depthkit.data import choice_sets  # noqa: F401
from depthkit.lens.base import DEFAULT_LENS, Lens
from depthkit.lens.registry import get_lens
from depthkit.lens.trajectories import Trajectories, answer_token_ids, trajectories
from depthkit.stats import LEVEL as LEVEL
from depthkit.stats import MIN_N as MIN_N

if TYPE_CHECKING:
    from depthkit.analyses.patching import CleanRuns
    from depthkit.engine.handle import Model


def add_option_ids(model: Model, prompts: pd.DataFrame, *, drop_shared: bool = False) -> pd.DataFrame:
    """Add ``option_ids``: the first token of each option as it follows its prompt.
    Two options of a prompt that share their first token cannot be told apart: that
    raises, or with ``drop_shared`` the prompt is dropped (their number is in
    ``attrs["dropped_shared_first_token"]``, per task)."""
    ids, keep, dropped = [], [], {}
    for prompt, opts, task in zip(prompts["prompt"], prompts["options"], prompts["task"]):
        first = [answer_token_ids(model, prompt, o)[0] for o in opts]
        shared = len(set(first)) < len(first)
        if shared and not drop_shared:
            raise ValueError(
                f"Options {list(opts)} share a first token ({first}) after this prompt, so their ranks cannot be told "
                "apart. Choose labels whose first tokens differ (e.g. labels='letters')."
            )
        keep.append(not shared)
        if shared:
            dropped[task] = dropped.get(task, 0) + 1
        else:
            ids.append(first)
    out = prompts[np.array(keep, dtype=bool)].copy()
    out["option_ids"] = ids
    if drop_shared:
        out = out.reset_index(drop=True)
    out.attrs["dropped_shared_first_token"] = dropped
    return out


def option_ranks(
    model: Model,
    prompts: pd.DataFrame,
    *,
    lens: str | Lens = DEFAULT_LENS,
    convention: str = "canonical",
    batch_size: int = 8,
    progress: bool = True,
    return_trajectories: bool = False,
    clean: CleanRuns | None = None,
    **lens_kwargs,
) -> pd.DataFrame | tuple[pd.DataFrame, dict[str, Trajectories]]:
    """Rank and probability of every option token at every layer.

    ``prompts``: frame of :func:`build_prompts` / :func:`load_mcq_file` (option ids
    are added if missing). Returns DataFrame[task, item, example, layer, option,
    token_id, rank, prob, is_gold, top1_is_option]; ``item`` is the row of
    ``prompts``; ``top1_is_option``: the lens top-1 token is one of the options.
    With ``return_trajectories``, also the :class:`Trajectories` of each task (targets
    ``opt0``.. and ``gold``; its ``item`` is the position within the task), e.g. for
    :func:`depthkit.analyses.early_exit.early_exit_table`. A ``demo_set`` column of
    ``prompts`` is carried along. ``clean``: a :class:`depthkit.analyses.patching.CleanRuns`
    that keeps every prompt's last-position residuals (and the contexts of its
    patching targets), so that patching sweeps over these prompts do not run them again.
    """
    if "option_ids" not in prompts.columns:
        prompts = add_option_ids(model, prompts)
    prompts = prompts.reset_index(drop=True)
    lens_obj = get_lens(model, lens, **lens_kwargs)
    frames, trajs = [], {}
    for (task, k), group in prompts.groupby([prompts["task"], prompts["option_ids"].map(len)], sort=False):
        names = [f"opt{j}" for j in range(k)]
        targets = {nm: [ids[j] for ids in group["option_ids"]] for j, nm in enumerate(names)}
        targets["gold"] = [ids[g] for ids, g in zip(group["option_ids"], group["gold"])]
        traj = trajectories(
            model, list(group["prompt"]), lens=lens_obj, convention=convention, targets=targets,
            top_k=1, batch_size=batch_size, progress=progress, keep=None if clean is None else clean.keep, keep_contexts=clean,
        )  # fmt: skip
        t = traj.targets[traj.targets["target"].isin(names)].copy()
        rows = group.index.to_numpy()
        t["item"] = rows[t["item"].to_numpy()]
        t["option"] = t["target"].str[3:].astype(np.int64)
        top1 = traj.steps[["item", "layer", "top1_id"]].copy()
        top1["item"] = rows[top1["item"].to_numpy()]
        t = t.merge(top1, on=["item", "layer"])
        opt_sets = {r: set(prompts.at[r, "option_ids"]) for r in rows}
        t["top1_is_option"] = [tid in opt_sets[r] for tid, r in zip(t["top1_id"], t["item"])]
        frames.append(t)
        # A user file may mix option counts within a task: one trajectory set per count.
        trajs[str(task) if str(task) not in trajs else f"{task} ({k} options)"] = traj
    out = pd.concat(frames, ignore_index=True)
    out["task"] = prompts.loc[out["item"], "task"].to_numpy()
    out["example"] = prompts.loc[out["item"], "example"].to_numpy()
    out["is_gold"] = out["option"].to_numpy() == prompts.loc[out["item"], "gold"].to_numpy()
    cols = ["task", "item", "example", "layer", "option", "token_id", "rank", "prob", "is_gold", "top1_is_option"]
    if "demo_set" in prompts.columns:
        out["demo_set"] = prompts.loc[out["item"], "demo_set"].to_numpy()
        cols.append("demo_set")
    out = out[cols].sort_values(["item", "layer", "option"], kind="stable").reset_index(drop=True)
    return (out, trajs) if return_trajectories else out
