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

Where each part lives (every name is re-exported here): the chapter registry in
:mod:`depthkit.chapters.specs`, built from the shared parameters of
:mod:`depthkit.chapters.param_sets` and the checks across parameters of
:mod:`depthkit.chapters.cross_checks`; checking values before a run in
:mod:`depthkit.chapters.param_checks`; the headlines and paper rows read across
chapters in :mod:`depthkit.chapters.headline_tables`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from depthkit.chapters.cross_checks import _k_grid_has_one as _k_grid_has_one
from depthkit.chapters.cross_checks import _patch_tasks as _patch_tasks
from depthkit.chapters.headline_tables import HEADLINE_COLUMNS as HEADLINE_COLUMNS
from depthkit.chapters.headline_tables import PAPER_COLUMNS as PAPER_COLUMNS
from depthkit.chapters.headline_tables import chapter_module as chapter_module
from depthkit.chapters.headline_tables import headlines as headlines
from depthkit.chapters.headline_tables import paper_reference as paper_reference
from depthkit.chapters.headline_tables import run_headlines as run_headlines
from depthkit.chapters.param_checks import _check
from depthkit.chapters.param_checks import _lens_choice as _lens_choice
from depthkit.chapters.param_checks import validate_run as validate_run
from depthkit.chapters.param_sets import BATCH_SIZE as BATCH_SIZE
from depthkit.chapters.param_sets import LENS_PARAMS as LENS_PARAMS
from depthkit.chapters.param_sets import MAX_TOKENS as MAX_TOKENS
from depthkit.chapters.param_sets import MCQ_TASKS as MCQ_TASKS
from depthkit.chapters.param_sets import MODEL_PARAMS as MODEL_PARAMS
from depthkit.chapters.param_sets import N_BOOT as N_BOOT
from depthkit.chapters.param_sets import N_TEXTS as N_TEXTS
from depthkit.chapters.param_sets import RESULTS_PARAM as RESULTS_PARAM
from depthkit.chapters.param_sets import SEED as SEED
from depthkit.chapters.param_sets import SHARED as SHARED
from depthkit.chapters.param_sets import UPDATE_STATS as UPDATE_STATS
from depthkit.chapters.param_sets import UPOS_TAGS as UPOS_TAGS
from depthkit.chapters.specs import CHAPTERS as CHAPTERS
from depthkit.chapters.specs import NOTEBOOK_DIR as NOTEBOOK_DIR
from depthkit.chapters.specs import Chapter as Chapter
from depthkit.chapters.specs import Check as Check
from depthkit.chapters.specs import _model_chapter as _model_chapter
from depthkit.chapters.specs import available_chapters as available_chapters
from depthkit.chapters.specs import chapter
from depthkit.chapters.specs import notebook_defaults as notebook_defaults
from depthkit.core.params import Param as Param
from depthkit.core.params import ParameterError as ParameterError
from depthkit.core.params import check_params as check_params
from depthkit.core.params import rerun_hint as rerun_hint


def check_chapter_params(chapter_id: str, namespace: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a chapter's parameters from the notebook's namespace (``globals()``):
    the values of every name in the chapter's spec, converted to their types.
    Raises :class:`ParameterError` saying what is wrong and how to re-run.

    >>> import depthkit as dk
    >>> from depthkit.chapters import chapter, notebook_defaults
    >>> namespace = {**notebook_defaults(chapter("01")), "model": "tiny-llama", "n_prompts": 50}  # as globals()
    >>> p = dk.check_chapter_params("01", namespace)
    >>> p["model"], p["n_prompts"], p["lens"]
    ('tiny-llama', 50, 'tuned')
    >>> dk.check_chapter_params("01", {**namespace, "n_prompts": 5})
    Traceback (most recent call last):
    depthkit.core.params.ParameterError: n_prompts (number of prompts) must be an integer between 10 and 50000, got 5 (int). ...
    """
    ch = chapter(chapter_id)
    return _check(ch, {name: namespace[name] for name in ch.params if name in namespace})


def model_options(p: Mapping[str, Any]) -> dict[str, Any]:
    """The checked chapter parameters that :func:`depthkit.load_model` takes besides
    the name: ``dk.load_model(p["model"], **dk.model_options(p))``.

    >>> import depthkit as dk
    >>> p = {"model": "tiny-llama", "dtype": None, "device": "cpu", "device_map": None}  # checked parameters
    >>> dk.model_options(p)
    {'dtype': 'float32', 'device': 'cpu', 'device_map': None, 'backend': 'bridge', 'remote': False}
    >>> model = dk.load_model(p["model"], **dk.model_options(p))
    >>> dk.model_info(model).source
    'tiny'
    """
    remote = str(p.get("remote") or "false").lower()
    return {
        "dtype": p.get("dtype") or "float32", "device": p.get("device"), "device_map": p.get("device_map"),
        "backend": p.get("backend") or "bridge", "remote": {"true": True, "false": False}.get(remote, remote),
    }  # fmt: skip
