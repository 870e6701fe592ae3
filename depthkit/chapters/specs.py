"""The book's chapter registry: each chapter's notebook, title, question and
parameter spec (one spec, used by the notebook, the command line and Python alike),
with its smoke-run values; looking a chapter up and reading the defaults from its
notebook's parameters cell."""

from __future__ import annotations

import ast
import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from depthkit.chapters.cross_checks import _k_grid_has_one, _patch_tasks
from depthkit.chapters.param_sets import (
    LENS_PARAMS,
    MAX_TOKENS,
    MCQ_TASKS,
    MODEL_PARAMS,
    N_TEXTS,
    RESULTS_PARAM,
    SHARED,
    UPDATE_STATS,
    UPOS_TAGS,
)
from depthkit.core.params import Param

# Chapter 00's smoke run: its down-weighted lenses continue from the smoke lens for a few
# steps, on the smoke lens's positions, so the smoke run takes the "finetune" path.
SMOKE_FINETUNE = "train_tokens=384,heldout_tokens=64,seq_len=64,batch_positions=16,init=lens,steps=3,lr=3e-4"

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"

Check = Callable[[dict[str, Any]], str | None]


@dataclass(frozen=True)
class Chapter:
    id: str  # two digits, e.g. "01"
    slug: str  # results folder name and notebook stem, e.g. "01_guess_then_refine"
    title: str
    params: dict[str, Param] = field(default_factory=dict)
    smoke: dict[str, Any] = field(default_factory=dict)
    # Checks across parameters: each returns None or what is wrong.
    checks: tuple[Check, ...] = ()
    # Reads other chapters' saved results (re-run whenever they change).
    reads_results: bool = False
    # The question the chapter asks, and the parameters that size its run: both shown
    # in the box at the top of the chapter's page (depthkit.book.pages).
    asks: str = ""
    key_params: tuple[str, ...] = ()

    @property
    def notebook(self) -> Path:
        return NOTEBOOK_DIR / f"{self.slug}.ipynb"

    @property
    def takes_model(self) -> bool:
        return "model" in self.params


def _model_chapter(*, lens: bool = True, shared: tuple[str, ...] = ("seed", "n_boot", "batch_size"), **own: Param) -> dict[str, Param]:
    """The spec of a chapter that loads a model: model and lens parameters, its own,
    then the ``shared`` ones (in the notebooks' order), then the results folder."""
    return {**MODEL_PARAMS, **(LENS_PARAMS if lens else {}), **own, **{k: SHARED[k] for k in shared}, **RESULTS_PARAM}


CHAPTERS: dict[str, Chapter] = {
    c.id: c
    for c in [
        Chapter(
            "00",
            "00_lenses",
            "Logit lens and tuned lens",
            asks="How faithful are the logit lens and a tuned lens to the model's final prediction, and is the early preference for frequent tokens the model's or the lens's?",
            key_params=("model", "lens_budget", "bias_budget", "n_eval", "n_explore"),
            params=_model_chapter(
                lens=False,
                shared=("seed",),
                lens_budget=LENS_PARAMS["lens_budget"],
                bias_budget=replace(LENS_PARAMS["lens_budget"], example="finetune",
                                    help="budget of the down-weighted lenses: 'finetune' (continue from the tuned lens) or like lens_budget"),
                convention=LENS_PARAMS["convention"],
                n_eval=Param(int, min=10, max=5000, help="prompts of the prompt-level comparison"),
                example_prompts=Param(list, min=1, max=10),
                top_k=Param(int, min=1, max=20),
                n_explore=Param(int, min=1, max=12, help="prompts in the page's offline explorer (the page embeds their grids)"),
            ),
            # The bias lenses continue from the smoke lens, on its positions.
            smoke={"lens_budget": "smoke", "bias_budget": SMOKE_FINETUNE, "n_eval": 20, "n_explore": 4},
        ),
        Chapter(
            "01",
            "01_guess_then_refine",
            "Guess, then refine",
            asks="Do early layers guess a frequent token that later layers overturn?",
            key_params=("model", "lens", "n_prompts", "dataset"),
            params=_model_chapter(
                n_prompts=Param(int, min=10, max=50_000, help="number of prompts"),
                dataset=Param(str, help="'embedded', 'hf:wikipedia' or a file of prompt records"),
            ),
            smoke={"n_prompts": 12, "n_boot": 50, "lens_budget": "smoke"},
        ),
        Chapter(
            "02",
            "02_mcq_collection_vs_reasoning",
            "Multiple choice: collecting options, then choosing",
            asks="When does a model gather the answer options, and when does it choose between them?",
            key_params=("model", "lens", "tasks", "n_examples", "shots", "n_pairs"),
            params=_model_chapter(
                shared=("seed", "n_boot"),
                tasks=Param(list, choices=MCQ_TASKS, min=1),
                n_examples=Param(int, min=2, help="prompts per task"),
                shots=Param(int, min=0, max=5),
                option_labels=Param(str, choices=("default", "letters", "symbols")),
                controls=Param(list, choices=("symbols", "permuted"), min=0),
                control_task=Param(str, choices=MCQ_TASKS),
                dataset=Param(str, optional=True, help="path of a JSON/JSONL file of {prompt, options, answer} records"),
                patch_source=Param(str, help="an embedded task, or your dataset by its file name"),
                patch_target=Param(str, help="an embedded task, or your dataset by its file name"),
                patch_control=Param(str, help="task of the random-source control: embedded, or your dataset by its file name"),
                n_pairs=Param(int, min=2),
                patch_layer_step=Param(int, min=1),
            ),
            smoke={
                "tasks": ["mmlu", "sst2"], "n_examples": 4, "shots": 1, "controls": ["symbols"], "n_pairs": 2,
                "patch_layer_step": 10, "n_boot": 50, "lens_budget": "smoke",
            },
            checks=(_patch_tasks,),
        ),
        Chapter(
            "03",
            "03_fact_recall",
            "Multi-token fact recall",
            asks="How much depth does each token of a multi-token factual answer need?",
            key_params=("model", "lens", "dataset", "n_examples", "n_trivia"),
            params=_model_chapter(
                shared=("seed", "n_boot"),
                dataset=Param(str, help="'curated', 'trivia_qa' or a file path"),
                n_examples=Param(int, min=1),
                n_trivia=Param(int, min=0),
                max_tokens=Param(int, min=1, max=5),
                k_grid=Param(list, item=int, min=1),
            ),
            smoke={"n_examples": 12, "n_trivia": 4, "k_grid": [1, 10, 100], "n_boot": 50, "lens_budget": "smoke"},
            checks=(_k_grid_has_one,),
        ),
        Chapter(
            "04",
            "04_pos_onset",
            "Part of speech and depth",
            asks="Do function words reach rank 1 at fewer layers than content words?",
            key_params=("model", "lens", "tags", "n_per_tag"),
            params=_model_chapter(
                tags=Param(list, choices=UPOS_TAGS, min=1, help="universal POS tags"),
                n_candidates=Param(int, min=1, max=5_000, help="examples per tag before filtering"),
                n_per_tag=Param(int, min=1, max=5_000, help="kept examples per tag"),
                min_prefix_words=Param(int, min=0, max=200),
                max_k=Param(int, min=1, max=1_000_000),
                k_per_decade=Param(int, min=1, max=20),
                dataset=Param(str, help="'embedded', 'hf:wikipedia', a passage file or a folder of per-tag files"),
            ),
            smoke={"n_candidates": 8, "n_per_tag": 4, "max_k": 1000, "k_per_decade": 2, "n_boot": 50, "lens_budget": "smoke"},
        ),
        Chapter(
            "05",
            "05_residual_phase_change",
            "A phase change in the residual stream",
            asks="Where does the residual stream change regime, and what does removing one block do?",
            key_params=("model", "lens", "n_texts", "max_tokens", "n_skip_texts"),
            params=_model_chapter(
                n_texts=replace(N_TEXTS, min=4),
                max_tokens=MAX_TOKENS,
                n_skip_texts=Param(int, min=1, max=3000, help="passages for the layer-skipping experiment"),
                phase_curve=Param(str, choices=UPDATE_STATS),
                top_tol=Param(float, min=0.001, max=0.5),
            ),
            smoke={"n_texts": 4, "max_tokens": 32, "n_skip_texts": 1, "n_boot": 20, "lens_budget": "smoke"},
        ),
        Chapter(
            "06",
            "06_depth_score",
            "Depth scores and early exit",
            asks="How deep does each predicted token need to go, and how many blocks can an early exit save?",
            key_params=("model", "lens", "n_texts", "max_tokens", "target_agreement"),
            params=_model_chapter(
                n_texts=N_TEXTS,
                max_tokens=MAX_TOKENS,
                rho=Param(float, min=0.05, max=1.0),
                target_agreement=Param(float, min=0.5, max=1.0),
                verify_taus=Param(list, item=float, min=0, max=10),
                n_verify_texts=Param(int, min=1, max=3000),
                min_group=Param(int, min=1),
            ),
            smoke={"n_texts": 4, "max_tokens": 32, "n_verify_texts": 1, "min_group": 3, "n_boot": 20, "lens_budget": "smoke"},
        ),
        Chapter(
            "07",
            "07_across_models",
            "Across models",
            asks="Where do the headline depths of every chapter sit, model by model, on normalised depth ℓ/L?",
            key_params=("models",),
            params={
                "models": Param(
                    list, min=0, example=["smollm2-135m", "gemma3-270m"], help="model names to compare; empty for all"
                ),
                **RESULTS_PARAM,
            },
            reads_results=True,
        ),
    ]
}


def chapter(key: str) -> Chapter:
    """Look a chapter up by id ("04") or slug ("04_pos_onset")."""
    key = str(key).strip()
    if key in CHAPTERS:
        return CHAPTERS[key]
    for c in CHAPTERS.values():
        if key == c.slug:
            return c
    close = difflib.get_close_matches(key, [c.slug for c in CHAPTERS.values()], n=1)
    guess = f" Did you mean {close[0].split('_', 1)[0]!r} ({close[0]})?" if close else ""
    raise KeyError(f"No chapter {key!r}.{guess} Chapters: {', '.join(f'{c.id} ({c.slug})' for c in CHAPTERS.values())}.")


def available_chapters() -> list[Chapter]:
    """Chapters whose notebook exists, in book order."""
    return [c for c in CHAPTERS.values() if c.notebook.is_file()]


def notebook_defaults(ch: Chapter) -> dict[str, Any]:
    """The values of the chapter notebook's parameters cell (plain literals)."""
    nb = json.loads(ch.notebook.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            source = "".join(cell["source"])
            out: dict[str, Any] = {}
            for node in ast.parse(source).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    out[node.targets[0].id] = ast.literal_eval(node.value)
            return out
    raise ValueError(f"{ch.notebook} has no cell tagged 'parameters'.")
