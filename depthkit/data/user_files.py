"""A user's data set as records: a JSON array of objects or JSON Lines, read
strictly, with errors that name the file, the record and its line."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd


class DataError(ValueError):
    """A data set cannot be found, read, or used as given."""


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _parse_json_array(text: str, where: str) -> list[tuple[int, Any]]:
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(
            f"{where}, line {e.lineno}, column {e.colno}: not valid JSON ({e.msg}). Fix the file there."
        ) from None
    decoder = json.JSONDecoder()
    records: list[tuple[int, Any]] = []
    ws = re.compile(r"[\s,]*")
    pos = ws.match(text, text.index("[") + 1).end()
    # The document is valid JSON (checked above), so walking its top-level array with
    # raw_decode cannot fail; it only recovers the line each record starts on.
    while text[pos] != "]":
        value, end = decoder.raw_decode(text, pos)
        records.append((_line_of(text, pos), value))
        pos = ws.match(text, end).end()
    return records


def _parse_jsonl(text: str, where: str) -> list[tuple[int, Any]]:
    records: list[tuple[int, Any]] = []
    # Split on "\n" only: str.splitlines would also split on U+2028 and friends, which
    # JSON allows raw inside strings.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError as e:
            whole = None
            if not records:
                try:
                    whole = json.loads(text)
                except json.JSONDecodeError:
                    pass
            if isinstance(whole, dict):
                raise DataError(
                    f"{where} holds a single JSON object spread over several lines. Write one record per line "
                    "(JSONL), or put the records in a JSON array: [{...}, {...}]."
                ) from None
            raise DataError(
                f"{where}, line {number}: not valid JSON ({e.msg} at column {e.colno}). Each line of a JSONL file "
                "must be one complete JSON object; fix or remove that line."
            ) from None
    return records


def _json_kind(value: Any) -> str:
    kinds = {str: "string", list: "array", dict: "object", bool: "boolean", int: "number", float: "number"}
    return kinds.get(type(value), "null" if value is None else type(value).__name__)


def _is_empty(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, (list, tuple, dict)):
        return len(value) == 0
    return False


def file_set_name(path: str | os.PathLike[str], taken: Sequence[str] = ()) -> str:
    """The name a user's file goes by in tables and parameters: its file name without
    the extension (``my_quiz.jsonl`` -> ``my_quiz``), with ``_file`` appended when it
    would read as one of the ``taken`` (embedded) names."""
    stem = re.sub(r"[^0-9A-Za-z_.-]+", "_", Path(path).name.split(".")[0]).strip("_") or "file"
    return f"{stem}_file" if stem in taken else stem


def load_records(path: str | os.PathLike[str], required: Sequence[str] = ("prompt", "answer")) -> pd.DataFrame:
    """A user's data set: a JSON array of objects, or JSON Lines (one object per line).

    The format is told from the content (a file starting with ``[`` is an array),
    not from the extension. Every record must carry the ``required`` fields, not
    empty; ``prompt``, when present, must be a string; ``options`` (multiple choice),
    when present, a list of at least two strings, and an integer ``answer`` then
    indexes it. Other fields are kept as columns. Errors name the file, the record
    and its line.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(f"No data file {str(file)!r}. Give the path of a JSON or JSONL file of records.")
    where = str(file)
    try:
        text = file.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{where} is not UTF-8 text (byte {e.start}); save it as UTF-8 JSON or JSONL.") from None
    if not text.strip():
        raise DataError(f"{where}: dataset is empty. Put at least one record in it.")
    records = _parse_json_array(text, where) if text.lstrip().startswith("[") else _parse_jsonl(text, where)
    if not records:
        raise DataError(f"{where}: dataset is empty (the JSON array has no records). Put at least one record in it.")
    for index, (line, record) in enumerate(records, start=1):
        at = f"{where}, record {index} (line {line})"
        if not isinstance(record, dict):
            raise DataError(f"{at} is a JSON {_json_kind(record)}, not an object with fields {', '.join(required)}.")
        for name in required:
            if name not in record:
                present = ", ".join(map(repr, record)) or "no fields"
                raise DataError(
                    f"{at} has no field {name!r} (it has {present}). "
                    f"Every record needs {', '.join(map(repr, required))}."
                )
            if _is_empty(record[name]):
                raise DataError(f"{at}: field {name!r} is empty. Give it a value or remove the record.")
        if "prompt" in record and not isinstance(record["prompt"], str):
            raise DataError(
                f"{at}: 'prompt' must be a string, got {type(record['prompt']).__name__} {record['prompt']!r}."
            )
        if "options" in record:
            options = record["options"]
            if not isinstance(options, list) or len(options) < 2 or not all(isinstance(o, str) and o for o in options):
                raise DataError(f"{at}: 'options' must be a list of at least two non-empty strings, got {options!r}.")
            answer = record.get("answer")
            if isinstance(answer, int) and not isinstance(answer, bool) and not 0 <= answer < len(options):
                raise DataError(
                    f"{at}: answer index {answer} is outside the {len(options)} options (indices start at 0)."
                )
    frame = pd.DataFrame([record for _, record in records])
    frame.attrs["source"] = "file"
    frame.attrs["path"] = where
    return frame
