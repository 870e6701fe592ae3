"""Embedded sets, Wikipedia prefixes, users' files, online loaders (offline path)."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from depthkit import data
from depthkit.data.embedded import DataError

# ---------------------------------------------------------------- embedded sets


def test_wikipedia_passages_are_deduplicated_stable_copies():
    passages = data.wikipedia_passages()
    assert len(passages) == 2938  # 3,270 BoolQ questions over 2,938 distinct paragraphs
    assert len(set(passages)) == len(passages)
    assert all(isinstance(p, str) and p for p in passages)
    assert passages[0].startswith("All biomass goes through at least some of these steps")
    passages.clear()
    assert len(data.wikipedia_passages()) == 2938


def test_mmlu_subjects_and_frame():
    subjects = data.mmlu_subjects()
    assert len(subjects) == 57 and subjects == sorted(subjects) and "anatomy" in subjects
    frame = data.mmlu("anatomy")
    assert list(frame.columns) == ["question", "choices", "answer", "subject"]
    assert len(frame) == 135 and set(frame["subject"]) == {"anatomy"}
    assert all(isinstance(c, list) and len(c) == 4 and all(isinstance(x, str) for x in c) for c in frame["choices"])
    assert frame["answer"].between(0, 3).all() and frame["answer"].dtype == "int64"
    dev = data.mmlu(["anatomy", "virology"], split="dev")
    assert len(dev) == 10 and dev["subject"].tolist() == ["anatomy"] * 5 + ["virology"] * 5
    assert len(data.mmlu(split="test")) == 14042


def test_mmlu_returns_copies():
    first = data.mmlu("anatomy", split="dev")
    first.loc[0, "question"] = "changed"
    first["choices"][1].append("extra")
    again = data.mmlu("anatomy", split="dev")
    assert again.loc[0, "question"] != "changed" and len(again["choices"][1]) == 4


def test_mmlu_errors():
    with pytest.raises(DataError, match="Did you mean 'anatomy'"):
        data.mmlu("anatomyy")
    with pytest.raises(DataError, match="Unknown MMLU split 'train'"):
        data.mmlu("anatomy", split="train")
    with pytest.raises(DataError, match="selects nothing"):
        data.mmlu([])


@pytest.mark.parametrize(
    ("task", "rows", "columns", "names"),
    [
        ("sst2", 872, ["sentence", "label", "idx", "label_name"], {"negative", "positive"}),
        ("mrpc", 408, ["sentence1", "sentence2", "label", "idx", "label_name"], {"not_equivalent", "equivalent"}),
        ("rte", 277, ["sentence1", "sentence2", "label", "idx", "label_name"], {"entailment", "not_entailment"}),
    ],
)
def test_glue(task, rows, columns, names):
    frame = data.glue(task)
    assert len(frame) == rows and list(frame.columns) == columns
    assert set(frame["label"]) == {0, 1} and set(frame["label_name"]) == names


def test_glue_errors():
    with pytest.raises(DataError, match="Unknown GLUE task 'cola'"):
        data.glue("cola")
    with pytest.raises(DataError, match="Only the validation split"):
        data.glue("rte", split="train")


def test_trivia_qa():
    frame = data.trivia_qa()
    assert len(frame) == 7993 and list(frame.columns) == ["question", "answer", "aliases", "question_id"]
    first = frame.iloc[0]
    assert first["answer"] == "Sunset Boulevard" and "Sunset Blvd" in first["aliases"]
    assert all(isinstance(a, list) and a for a in frame["aliases"])
    assert data.trivia_qa(5)["question_id"].tolist() == frame["question_id"].head(5).tolist()
    with pytest.raises(DataError, match="positive integer"):
        data.trivia_qa(0)


def test_licences_cover_every_embedded_set():
    assert data.LICENCES["mmlu"]["licence"] == "MIT"
    assert data.LICENCES["wikipedia"]["licence"] == "CC BY-SA 3.0"
    assert data.LICENCES["trivia_qa"]["licence"] == "Apache 2.0"
    for task in data.GLUE_TASKS:
        assert data.LICENCES[f"glue/{task}"]["licence"]
    assert all({"name", "source", "licence", "url"} <= set(v) for v in data.LICENCES.values())


# ---------------------------------------------------------------- prefixes


def test_wikipedia_prefixes_follow_the_recipe():
    passages = data.wikipedia_passages("analysis")  # the default passages of wikipedia_prefixes
    frame = data.wikipedia_prefixes(300, seed=0)
    assert list(frame.columns) == ["prompt", "passage_id", "next_word", "cut"]
    assert len(frame) == 300 and frame["passage_id"].is_unique  # one cut per paragraph while they last
    for row in frame.itertuples():
        text = passages[row.passage_id]
        assert len(text) > 200
        assert row.prompt == text[: row.cut] and len(row.prompt) >= 17
        assert not row.prompt[-1].isspace() and text[row.cut].isspace()
        assert row.next_word == text[row.cut :].split()[0]


def test_wikipedia_prefixes_are_deterministic_per_seed():
    a = data.wikipedia_prefixes(50, seed=3)
    pd.testing.assert_frame_equal(a, data.wikipedia_prefixes(50, seed=3))
    assert not a.equals(data.wikipedia_prefixes(50, seed=4))
    # the first prompts do not depend on how many are asked for
    pd.testing.assert_frame_equal(data.wikipedia_prefixes(20, seed=3), a.head(20))


def test_wikipedia_prefixes_on_own_passages():
    long = "word " * 60  # 300 characters
    passages = ["too short to use", long.strip(), "x" * 250]  # the last has no word boundary
    frame = data.wikipedia_prefixes(5, seed=1, min_chars=17, passages=passages)
    assert set(frame["passage_id"]) == {1}  # reused once the only usable paragraph is spent
    assert frame["cut"].is_unique and (frame["cut"] >= 17).all()
    assert all(re.fullmatch(r"word( word)*", p) for p in frame["prompt"])
    assert (frame["next_word"] == "word").all()


def test_wikipedia_prefixes_errors():
    with pytest.raises(DataError, match="n must be an integer >= 1"):
        data.wikipedia_prefixes(0)
    with pytest.raises(DataError, match="no passage is longer than 200"):
        data.wikipedia_prefixes(1, passages=["short text here"])
    with pytest.raises(DataError, match="allow only"):
        data.wikipedia_prefixes(10_000, passages=["word " * 60])


# ---------------------------------------------------------------- users' files


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_jsonl_and_json_array_are_told_by_content(tmp_path):
    records = [{"prompt": "The capital of France is", "answer": " Paris", "id": 1}, {"prompt": "2+2=", "answer": "4"}]
    jsonl = write(tmp_path, "a.json", "\n".join(json.dumps(r) for r in records) + "\n\n")
    array = write(tmp_path, "b.jsonl", json.dumps(records, indent=2))
    for path in (jsonl, array):
        frame = data.load_records(path)
        assert frame["prompt"].tolist() == ["The capital of France is", "2+2="]
        assert frame["answer"].tolist() == [" Paris", "4"]
        assert "id" in frame.columns  # extra fields kept
        assert frame.attrs["source"] == "file"


def test_mcq_options_are_kept_and_checked(tmp_path):
    good = write(tmp_path, "mcq.jsonl", json.dumps({"prompt": "Q?", "options": ["A", "B"], "answer": 1}))
    assert data.load_records(good)["options"][0] == ["A", "B"]
    bad = write(tmp_path, "bad.jsonl", json.dumps({"prompt": "Q?", "options": ["A", "B"], "answer": 2}))
    with pytest.raises(DataError, match="answer index 2 is outside the 2 options"):
        data.load_records(bad)
    one = write(tmp_path, "one.jsonl", json.dumps({"prompt": "Q?", "options": ["A"], "answer": 0}))
    with pytest.raises(DataError, match="at least two non-empty strings"):
        data.load_records(one)


def test_malformed_jsonl_line_is_named(tmp_path):
    path = write(tmp_path, "x.jsonl", '{"prompt": "a", "answer": "b"}\n\n{"prompt": "c", "answer": }\n')
    with pytest.raises(DataError) as e:
        data.load_records(path)
    assert str(path) in str(e.value) and "line 3" in str(e.value)


def test_malformed_json_array_line_is_named(tmp_path):
    path = write(tmp_path, "x.json", '[\n {"prompt": "a", "answer": "b"},\n {"prompt": "c" "answer": "d"}\n]')
    with pytest.raises(DataError, match=r"x.json, line 3, column"):
        data.load_records(path)


def test_missing_and_empty_fields_name_the_record_and_line(tmp_path):
    path = write(tmp_path, "x.json", '[\n {"prompt": "a", "answer": "b"},\n\n {"prompt": "c"}\n]')
    with pytest.raises(DataError, match=r"record 2 \(line 4\) has no field 'answer'"):
        data.load_records(path)
    path = write(tmp_path, "y.jsonl", '{"prompt": "a", "answer": "b"}\n{"prompt": "  ", "answer": "d"}\n')
    with pytest.raises(DataError, match=r"record 2 \(line 2\): field 'prompt' is empty"):
        data.load_records(path)
    path = write(tmp_path, "z.jsonl", '{"text": "a"}\n')
    assert data.load_records(path, required=("text",))["text"].tolist() == ["a"]


def test_non_string_prompt_and_non_object_record(tmp_path):
    path = write(tmp_path, "x.jsonl", '{"prompt": 42, "answer": "b"}\n')
    with pytest.raises(DataError, match="'prompt' must be a string, got int 42"):
        data.load_records(path)
    path = write(tmp_path, "y.json", '[\n  "The capital of France is",\n  "2+2="\n]')
    with pytest.raises(DataError, match=r"record 1 \(line 2\) is a JSON string, not an object"):
        data.load_records(path)
    path = write(tmp_path, "z.jsonl", '{"prompt": "a", "answer": "b"}\n42\n')
    with pytest.raises(DataError, match=r"record 2 \(line 2\) is a JSON number"):
        data.load_records(path)


def test_empty_files(tmp_path):
    for name, text in (("a.jsonl", ""), ("b.jsonl", " \n\n"), ("c.json", "[]")):
        with pytest.raises(DataError, match="dataset is empty"):
            data.load_records(write(tmp_path, name, text))


def test_single_pretty_object_gets_a_hint(tmp_path):
    path = write(tmp_path, "x.json", json.dumps({"prompt": "a", "answer": "b"}, indent=2))
    with pytest.raises(DataError, match="single JSON object spread over several lines"):
        data.load_records(path)


def test_bom_unicode_and_missing_file(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(
        "\ufeff".encode() + json.dumps({"prompt": "caf\u00e9 \u2028 x", "answer": "b"}, ensure_ascii=False).encode()
    )
    assert data.load_records(path)["prompt"][0] == "caf\u00e9 \u2028 x"
    with pytest.raises(DataError, match="No data file"):
        data.load_records(tmp_path / "nope.jsonl")
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"prompt": "caf\xe9", "answer": "b"}'.encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8"):
        data.load_records(latin)


# ---------------------------------------------------------------- online and chapter parameter


def test_hf_dataset_offline_points_to_embedded(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, config in (("wikipedia", None), ("mmlu", None), ("glue", "rte"), ("cais/mmlu", "anatomy")):
        with pytest.raises(DataError) as e:
            data.hf_dataset(name, config)
        assert "offline" in str(e.value) and "embedded" in str(e.value)
    with pytest.raises(DataError, match="Unknown Hugging Face data set 'imagenet'"):
        data.hf_dataset("imagenet")
    with pytest.raises(DataError, match="GLUE task"):
        data.hf_dataset("glue", "cola")


def test_resolve_dataset(tmp_path, monkeypatch):
    wiki = data.resolve_dataset("embedded")
    assert list(wiki.columns) == ["passage"] and len(wiki) == len(data.wikipedia_passages("analysis")) == 2159  # of 2,938: the lens quarter is left out
    assert wiki.attrs == {"source": "embedded", "name": "wikipedia"}
    assert len(data.resolve_dataset("embedded", default="trivia_qa")) == 7993
    rte = data.resolve_dataset("embedded:glue:rte")
    assert len(rte) == 277 and rte.attrs["name"] == "glue:rte"
    path = write(tmp_path, "mine.jsonl", json.dumps({"prompt": "a", "answer": "b"}))
    mine = data.resolve_dataset(str(path))
    assert mine.attrs["source"] == "file" and mine["answer"].tolist() == ["b"]
    assert data.resolve_dataset(path, required=("prompt",))["prompt"].tolist() == ["a"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="offline"):
        data.resolve_dataset("hf:glue:rte")
    with pytest.raises(DataError, match="nor an existing file"):
        data.resolve_dataset("wikipedai")
    with pytest.raises(DataError, match="Unknown embedded data set 'mmlux'"):
        data.resolve_dataset("embedded:mmlux")
    with pytest.raises(DataError, match="hf:<name>"):
        data.resolve_dataset("hf:")


@pytest.fixture
def fake_hub(monkeypatch):
    """``datasets.load_dataset`` replaced by in-memory sets shaped like the hub's, to
    check the conversion code without a network."""
    import datasets

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    calls = []

    def load_dataset(hub_id, config, split, streaming):
        calls.append((hub_id, config, split, streaming))
        if hub_id == "cais/mmlu":
            return datasets.Dataset.from_dict(
                {"question": ["Q?"], "subject": ["anatomy"], "choices": [["w", "x", "y", "z"]], "answer": [2]}
            )
        if hub_id == "nyu-mll/glue":
            return datasets.Dataset.from_dict({"sentence1": ["s1"], "sentence2": ["s2"], "label": [1], "idx": [0]})
        if hub_id == "mandarjoshi/trivia_qa":
            answer = {"value": "Paris", "aliases": ["Paris", "Paree"], "normalized_value": "paris"}
            return datasets.Dataset.from_dict({"question": ["Capital?"], "question_id": ["q1"], "answer": [answer]})
        if hub_id == "wikimedia/wikipedia":
            return iter([{"title": "T", "text": "short\n" + "long paragraph " * 20 + "\n\n" + "second one " * 30}])
        raise ConnectionError("no route to host")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_hf_dataset_conversions(fake_hub):
    mm = data.hf_dataset("mmlu")
    assert list(mm.columns) == ["question", "choices", "answer", "subject"] and mm["choices"][0] == ["w", "x", "y", "z"]
    assert mm.attrs["source"] == "hf" and fake_hub[-1] == ("cais/mmlu", "all", "test", False)
    rte = data.hf_dataset("glue", "rte", split="train")
    assert rte["label_name"].tolist() == ["not_entailment"] and fake_hub[-1] == ("nyu-mll/glue", "rte", "train", False)
    tq = data.hf_dataset("trivia_qa")
    assert tq.iloc[0][["question", "answer"]].tolist() == ["Capital?", "Paris"] and tq["aliases"][0] == [
        "Paris",
        "Paree",
    ]
    wiki = data.hf_dataset("wikipedia", n=5)
    assert list(wiki.columns) == ["passage", "title"] and len(wiki) == 2 and (wiki["passage"].str.len() > 200).all()
    assert fake_hub[-1] == ("wikimedia/wikipedia", "20231101.en", "train", True)


def test_hf_dataset_network_failure_becomes_data_error(fake_hub, monkeypatch):
    monkeypatch.setitem(data.HF_SETS, "mmlu", {**data.HF_SETS["mmlu"], "hub_id": "unreachable/mmlu"})
    with pytest.raises(DataError, match="ConnectionError: no route to host.*embedded"):
        data.hf_dataset("mmlu")
