"""The full sets from the Hugging Face hub (needs network and the ``datasets``
package), converted to the embedded loaders' shapes; offline, a clear error that
points to the embedded sets.
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

from depthkit.data.eval_sets import _GLUE_LABELS, _GLUE_TEXT, GLUE_TASKS, _choose, _trivia_frame
from depthkit.data.user_files import DataError

__all__ = ["HF_SETS", "hf_dataset"]

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
