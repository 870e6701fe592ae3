"""The book's chapters: which notebook, what it is called, which parameters it
takes (one spec, used by the notebook, the command line and Python alike), and the
small parameter set of smoke runs. The defaults themselves live in each notebook's
parameters cell, where a reader of the notebook sees them.

Each chapter NN also has a module ``depthkit.chapters.chNN_<name>`` holding what
its notebook would otherwise compute inline: the summary prose (generated from the
numbers, through :mod:`depthkit.stats.narrate`), its headline quantities and the paper's
reference rows. Chapter 07 reads every chapter's headlines through
:func:`headlines`, never by table schema. A chapter module defines:

* ``headlines(run: depthkit.core.results.Run) -> pd.DataFrame`` with
  :data:`HEADLINE_COLUMNS` (``scale`` is "layer" for a layer index, to be divided by
  the model's L for comparisons across models, or "share" / "other");
* ``PAPER``: a DataFrame of the paper's reference values with
  :data:`PAPER_COLUMNS` (layers already divided by the paper model's depth).

A notebook validates its parameters in one line, right after its parameters cell::

    p = dk.check_chapter_params("01", globals())

and ``depthkit run`` / :func:`validate_run` check the same spec, defaults
included, before a kernel starts, so a typo costs seconds, not a run.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from depthkit.core.params import Param, ParameterError, check_params, rerun_hint

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"

# Kept here rather than imported from the analysis modules, so that checking a
# command line does not import torch; tests hold the two lists equal.
MCQ_TASKS = (
    "mmlu", "sst2", "mrpc", "rte", "arc_easy", "arc_challenge", "sciq", "openbookqa", "piqa",
    "arc_easy_words", "arc_challenge_words", "sciq_words", "openbookqa_words",
)
UPOS_TAGS = tuple(sorted("ADJ ADP ADV AUX CCONJ DET INTJ NOUN NUM PART PRON PROPN PUNCT SCONJ SYM VERB X".split()))
UPDATE_STATS = ("norm_h", "attn_rel", "mlp_rel", "block_rel", "cos_attn", "cos_mlp", "cos_update", "block_influence")

# Parameters of every chapter that loads a model: which model, in what precision, where.
MODEL_PARAMS: dict[str, Param] = {
    "model": Param(str, example="smollm2-135m", help="embedded name (smollm2-135m, gemma3-270m), hub id or local folder"),
    "dtype": Param(str, choices=("float32", "bfloat16", "float16"), help="precision of the model's weights"),
    "device": Param(str, optional=True, help="'cpu', 'cuda', 'cuda:1', ...; None picks a GPU if there is one"),
    "device_map": Param(str, optional=True, help="transformers device_map for hub models, e.g. 'auto'"),
}
LENS_PARAMS: dict[str, Param] = {
    "lens": Param(str, example="tuned", help="'tuned', 'logit' or the path of a saved lens (.safetensors)"),
    "lens_budget": Param(
        str, example="default",
        help="tuned-lens budget if none is cached: 'default', 'smoke' or fields such as 'steps=200'",
    ),
    "convention": Param(str, choices=("canonical", "authors"), help="layer convention"),
}
RESULTS_PARAM: dict[str, Param] = {"results_root": Param(str, optional=True, help="folder of the result tables")}
# Parameters many chapters share, with one meaning and one range everywhere.
SEED = Param(int, min=0)
N_BOOT = Param(int, min=10, max=100_000, help="bootstrap resamples of the 95 % intervals")
BATCH_SIZE = Param(int, min=1, max=512)
N_TEXTS = Param(int, min=2, max=3000, help="number of passages")
MAX_TOKENS = Param(int, min=16, max=4096, help="tokens per passage")

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


SHARED = {"seed": SEED, "n_boot": N_BOOT, "batch_size": BATCH_SIZE}


def _model_chapter(*, lens: bool = True, shared: tuple[str, ...] = ("seed", "n_boot", "batch_size"), **own: Param) -> dict[str, Param]:
    """The spec of a chapter that loads a model: model and lens parameters, its own,
    then the ``shared`` ones (in the notebooks' order), then the results folder."""
    return {**MODEL_PARAMS, **(LENS_PARAMS if lens else {}), **own, **{k: SHARED[k] for k in shared}, **RESULTS_PARAM}


def _patch_tasks(p: dict[str, Any]) -> str | None:
    """Patching reads two distinct tasks, each embedded or the user's ``dataset``
    (named after its file)."""
    from depthkit.data.user_files import file_set_name

    own = file_set_name(p["dataset"], MCQ_TASKS) if p.get("dataset") else None
    known = (*MCQ_TASKS, *([own] if own else []))
    for key in ("patch_source", "patch_target", "patch_control"):
        if p[key] not in known:
            close = difflib.get_close_matches(str(p[key]), known, n=1)
            yours = f"{own!r} (your dataset) or " if own else ""
            return (
                f"{key}={p[key]!r} is not a task here{f'; did you mean {close[0]!r}?' if close else ''} Choose "
                f"{yours}one of {', '.join(MCQ_TASKS)}"
                + ("" if own else "; a file of your own is patched after `-p dataset=PATH`, under the file's name")
                + f". Re-run with e.g. `depthkit run 02 -p {key}={own or 'mmlu'}`."
            )
    if p["patch_source"] == p["patch_target"]:
        return (
            f"patch_source and patch_target are both {p['patch_source']!r}; patching needs two tasks. "
            "Re-run with e.g. `depthkit run 02 -p patch_source=sst2 -p patch_target=mmlu`."
        )
    return None


def _k_grid_has_one(p: dict[str, Any]) -> str | None:
    if min(p["k_grid"]) < 1 or 1 not in p["k_grid"]:
        return (
            f"k_grid must hold positive integers including 1 (the headline), got {p['k_grid']}. "
            "Re-run with e.g. `depthkit run 03 -p k_grid=[1,10,100]`."
        )
    return None


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
                bias_budget=replace(LENS_PARAMS["lens_budget"], help="budget of the down-weighted lenses: like lens_budget"),
                convention=LENS_PARAMS["convention"],
                n_eval=Param(int, min=10, max=5000, help="prompts of the prompt-level comparison"),
                example_prompts=Param(list, min=1, max=10),
                top_k=Param(int, min=1, max=20),
                n_explore=Param(int, min=1, max=12, help="prompts in the page's offline explorer (the page embeds their grids)"),
            ),
            smoke={"lens_budget": "smoke", "bias_budget": "smoke", "n_eval": 20, "n_explore": 4},
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


HEADLINE_COLUMNS = ["quantity", "value", "lo", "hi", "n", "scale"]
PAPER_COLUMNS = ["quantity", "model", "value", "lo", "hi"]


def chapter_module(ch: Chapter):
    """``depthkit.chapters.chNN_<name>`` of a chapter (imported on first use: checking
    parameters never needs it)."""
    return importlib.import_module(f"depthkit.chapters.ch{ch.slug}")


def headlines(model: str, key: str, results_root: str | Path | None = None) -> Any:
    """The headline quantities of one chapter's saved run of ``model``:
    :data:`HEADLINE_COLUMNS` plus ``model``, ``chapter``, ``n_blocks`` and
    ``value_norm``/``lo_norm``/``hi_norm`` (layers divided by the model's L, other
    quantities as they are). Raises depthkit.core.results.ResultsError when the run is
    missing or incomplete."""
    from depthkit.core.results import load_run

    ch = chapter(key)
    return run_headlines(load_run(model, ch.slug, root=results_root), ch).assign(model=model)


def run_headlines(run: Any, ch: Chapter) -> Any:
    """:func:`headlines` of a run already loaded (without ``model``)."""
    import numpy as np

    out = chapter_module(ch).headlines(run)
    missing = [c for c in HEADLINE_COLUMNS if c not in out.columns]
    if missing:
        raise ValueError(f"Chapter {ch.id}'s headlines lack columns {missing}.")
    n_blocks = int(run.model["n_blocks"])
    scale = np.where(out["scale"] == "layer", 1.0 / n_blocks, 1.0)
    return out[HEADLINE_COLUMNS].assign(
        chapter=ch.id, n_blocks=n_blocks,
        value_norm=out["value"] * scale, lo_norm=out["lo"] * scale, hi_norm=out["hi"] * scale,
    )


def paper_reference() -> Any:
    """The paper's reference values of every chapter that has some (layers as ℓ/L)."""
    import pandas as pd

    frames = []
    for ch in CHAPTERS.values():
        try:
            module = chapter_module(ch)
        except ModuleNotFoundError:
            continue
        paper = getattr(module, "PAPER", None)
        if paper is not None and len(paper):
            frames.append(paper[PAPER_COLUMNS].assign(chapter=ch.id))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*PAPER_COLUMNS, "chapter"])


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


def _lens_choice(ch: Chapter, p: dict[str, Any]) -> str | None:
    """``lens`` is a kind or an existing lens file; a budget is a name or valid
    TrainConfig fields (checked by the config itself, which imports torch only when
    a budget other than the two names is given)."""
    from depthkit.lens.registry import is_lens_path, kind_names

    lens = p.get("lens")
    if lens is not None and lens not in kind_names():
        if not is_lens_path(str(lens)):
            kinds = ", ".join(repr(k) for k in kind_names())
            return (f"lens={lens!r}: choose {kinds} or the path of a saved lens file (.safetensors). "
                    f"Re-run with e.g. `depthkit run {ch.id} -p lens=tuned`.")
        if not Path(str(lens)).expanduser().with_suffix(".safetensors").is_file():
            return (f"lens={lens!r}: no such lens file. Save one with depthkit.lens.save_lens, or re-run with "
                    f"e.g. `depthkit run {ch.id} -p lens=tuned`.")
    for key in ("lens_budget", "bias_budget"):
        budget = p.get(key)
        if budget is None or budget in ("default", "smoke"):
            continue
        from depthkit.lens.training_data import resolve_config

        try:
            resolve_config(budget)
        except (TypeError, ValueError) as err:
            return f"{key}={budget!r}: {err} Re-run with e.g. `depthkit run {ch.id} -p {key}=steps=200`."
    return None


def _check(ch: Chapter, values: Mapping[str, Any]) -> dict[str, Any]:
    p = check_params(dict(values), chapter=ch.id, **ch.params)
    problem = _lens_choice(ch, p)
    if problem:
        raise ParameterError(problem)
    for check in ch.checks:
        problem = check(p)
        if problem:
            raise ParameterError(problem)
    return p


def check_chapter_params(chapter_id: str, namespace: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a chapter's parameters from the notebook's namespace (``globals()``):
    the values of every name in the chapter's spec, converted to their types.
    Raises :class:`ParameterError` saying what is wrong and how to re-run."""
    ch = chapter(chapter_id)
    return _check(ch, {name: namespace[name] for name in ch.params if name in namespace})


def model_options(p: Mapping[str, Any]) -> dict[str, Any]:
    """The checked chapter parameters that :func:`depthkit.load_model` takes besides
    the name: ``dk.load_model(p["model"], **dk.model_options(p))``."""
    return {"dtype": p.get("dtype") or "float32", "device": p.get("device"), "device_map": p.get("device_map")}


def validate_run(ch: Chapter, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``overrides`` of a chapter run before anything runs: unknown names (with
    "did you mean"), then every value, the notebook's defaults filling the rest.
    Returns the overrides, converted to their declared types."""
    unknown = [k for k in overrides if k not in ch.params]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, list(ch.params), n=1)
        guess = f" Did you mean {close[0]!r}?" if close else ""
        example = ""
        if close:
            param = ch.params[close[0]]
            try:
                suggest = check_params({close[0]: overrides[name]}, **{close[0]: param})[close[0]]
            except ParameterError:
                suggest = None  # the value does not fit the likely name either: show a valid one
            example = rerun_hint(close[0], param, ch.id, suggest)
        raise ParameterError(
            f"Chapter {ch.id} has no parameter {name!r}.{guess} It takes: {', '.join(ch.params)}." + (f" {example}" if example else "")
        )
    merged = {**notebook_defaults(ch), **overrides}
    checked = _check(ch, merged)
    return {k: checked[k] for k in overrides}
