"""Text and evaluation sets: the embedded sets (:mod:`~depthkit.data.embedded`), the one
split of the Wikipedia corpus (:mod:`~depthkit.data.corpus`), a user's own JSON/JSONL/
Parquet files (:mod:`~depthkit.data.user_files`) and multiple-choice option sets
(:mod:`~depthkit.data.choice_sets`).

>>> from depthkit import data
>>> sorted(data.GLUE_TASKS)
['mrpc', 'rte', 'sst2']
"""

from depthkit.data.corpus import corpus_split, passage_digest
from depthkit.data.embedded import (
    EMBEDDED_SETS,
    GLUE_TASKS,
    HF_SETS,
    LICENCES,
    MMLU_SPLITS,
    embedded_dir,
    glue,
    hf_dataset,
    mmlu,
    mmlu_subjects,
    resolve_dataset,
    trivia_qa,
    wikipedia_passages,
    wikipedia_prefixes,
)
from depthkit.data.user_files import DataError, file_set_name, load_records

__all__ = [
    "DataError",
    "EMBEDDED_SETS",
    "GLUE_TASKS",
    "HF_SETS",
    "LICENCES",
    "MMLU_SPLITS",
    "corpus_split",
    "embedded_dir",
    "file_set_name",
    "glue",
    "hf_dataset",
    "load_records",
    "mmlu",
    "mmlu_subjects",
    "passage_digest",
    "resolve_dataset",
    "trivia_qa",
    "wikipedia_passages",
    "wikipedia_prefixes",
]
