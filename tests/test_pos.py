"""The part-of-speech dataset and its correctness filter."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch

import depthkit as dk
from depthkit.analyses import part_of_speech, part_of_speech_filter

TEXT = "The museum in the old town of Bern has a large collection of clocks, and it opened in 1901."
PASSAGES = [
    TEXT,
    "Rivers in the north of the country freeze for several months, so  boats stay in the harbour until spring.",
    "A small village lies near the border with France and it has a church built by monks in the tenth century.",
    TEXT,  # a duplicate: must not be sampled twice
    "Short text.",
]


@pytest.fixture(scope="module")
def nlp():
    return part_of_speech.load_spacy()


def test_first_tag_examples_by_hand(nlp):
    ex = {e["tag"]: e for e in part_of_speech.first_tag_examples(nlp(TEXT), part_of_speech.TAGS, min_prefix_words=8)}
    # 8 words before the answer: "The museum in the old town of Bern" (spaCy tags "has" AUX)
    assert ex["DET"]["prompt"] == "The museum in the old town of Bern has"
    assert ex["DET"]["answer"] == " a"
    assert ex["ADJ"]["answer"] == " large"
    assert ex["NOUN"]["answer"] == " collection"
    assert ex["ADP"]["answer"] == " of"
    assert ex["ADP"]["prompt"] == "The museum in the old town of Bern has a large collection"
    assert ex["PUNCT"]["answer"] == ","  # no space before the comma: spacing kept
    assert ex["PUNCT"]["prompt"].endswith("of clocks")
    assert ex["VERB"]["answer"] == " opened"
    # with no minimum, the first DET is the passage's first word, which has no prompt
    first = {e["tag"]: e for e in part_of_speech.first_tag_examples(nlp(TEXT), ["DET", "ADP"], min_prefix_words=0)}
    assert first["DET"]["prompt"] == "" and first["ADP"]["answer"] == " in"
    # a tag that does not occur gives nothing
    assert part_of_speech.first_tag_examples(nlp(TEXT), ["INTJ"]) == []


def test_original_spacing_is_kept(nlp):
    text = PASSAGES[1]  # has a double space before "boats"
    for e in part_of_speech.first_tag_examples(nlp(text), part_of_speech.TAGS, min_prefix_words=8):
        assert text.startswith(e["prompt"] + e["answer"])
        assert e["char_start"] == len(e["prompt"]) + len(e["answer"]) - len(e["answer"].lstrip())
    noun = {e["tag"]: e for e in part_of_speech.first_tag_examples(nlp(text), ["NOUN"], min_prefix_words=12)}["NOUN"]
    assert noun["answer"] == "  boats"


def test_max_prompt_chars_limits_prompt_length(nlp):
    assert part_of_speech.first_tag_examples(nlp(TEXT), ["VERB"], max_prompt_chars=40) == []


def test_pos_dataset_deterministic_and_cached(nlp, tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHKIT_CACHE", str(tmp_path))
    a = part_of_speech.pos_dataset(2, ["DET", "NOUN"], seed=0, passages=PASSAGES, nlp=nlp, progress=False)
    assert list(a.columns) == part_of_speech.COLUMNS
    assert a["tag"].tolist() == ["DET", "DET", "NOUN", "NOUN"]
    assert set(a["word_class"]) == {"function", "content"}
    assert a.groupby("tag")["passage_id"].apply(lambda s: s.is_unique).all()
    assert 3 not in set(a["passage_id"])  # the duplicate of passage 0
    for _, r in a.iterrows():
        assert PASSAGES[r.passage_id].startswith(r.prompt + r.answer)
    files = list((tmp_path / "pos").glob("pos-*.parquet"))
    assert len(files) == 1
    b = part_of_speech.pos_dataset(2, ["DET", "NOUN"], seed=0, passages=PASSAGES, nlp=nlp, progress=False)
    pd.testing.assert_frame_equal(a, b)
    # the cache is really read: a file edited on disk comes back as edited
    pd.read_parquet(files[0]).assign(answer="X").to_parquet(files[0], index=False)
    assert (part_of_speech.pos_dataset(2, ["DET", "NOUN"], seed=0, passages=PASSAGES, nlp=nlp, progress=False)["answer"] == "X").all()
    # other parameters get another file; another seed another order
    orders = {
        tuple(part_of_speech.pos_dataset(3, ["DET"], seed=s, passages=PASSAGES, nlp=nlp, cache=False, progress=False)["passage_id"])
        for s in range(6)
    }
    assert len(orders) > 1
    assert all(sorted(o) == [0, 1, 2] for o in orders)  # three distinct passages have a DET
    no_cache = part_of_speech.pos_dataset(2, ["DET", "NOUN"], seed=0, passages=PASSAGES, nlp=nlp, cache=False, progress=False)
    pd.testing.assert_frame_equal(no_cache, a)
    assert len(list((tmp_path / "pos").glob("pos-*.parquet"))) == 1


def test_pos_dataset_bad_input(nlp):
    with pytest.raises(ValueError, match="UPOS"):
        part_of_speech.pos_dataset(2, ["DETERMINER"], passages=PASSAGES, nlp=nlp)
    with pytest.raises(ValueError, match="n_per_tag"):
        part_of_speech.pos_dataset(0, ["DET"], passages=PASSAGES, nlp=nlp)
    with pytest.raises(ValueError, match="passages"):
        part_of_speech.pos_dataset(2, ["DET"], passages=[], nlp=nlp)


def test_load_pos_files(tmp_path):
    (tmp_path / "DET.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [{"prompt": "He sat on", "answer": " the"}, {"prompt": "I saw", "answer": " a"}])
    )
    (tmp_path / "NOUN.json").write_text(json.dumps([{"prompt": "He sat on the", "answer": " mat"}]))
    df = part_of_speech.load_pos_files(tmp_path)
    assert df["tag"].tolist() == ["DET", "DET", "NOUN"]
    assert df["word_class"].tolist() == ["function", "function", "content"]
    assert df.loc[2, "answer"] == " mat"
    same = part_of_speech.load_pos_files({"det": tmp_path / "DET.jsonl", "NOUN": os.fspath(tmp_path / "NOUN.json")})
    pd.testing.assert_frame_equal(df, same)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        part_of_speech.load_pos_files(tmp_path / "nope")
    (tmp_path / "BAD.jsonl").write_text("{}")
    with pytest.raises(ValueError, match="BAD"):
        part_of_speech.load_pos_files(tmp_path)


def test_correctness_filter_hand_checked(tiny_llama):
    model = tiny_llama
    tok = model.tokenizer
    prompts = ["The cat sat on the", "Water boils at", "A quick brown"]
    greedy = []
    for p in prompts:  # independently of depthkit: the model's own logits
        with torch.no_grad():
            logits = model(torch.tensor([dk.encode(model, p)]))
        greedy.append(int(logits[0, -1].argmax()))
    right = tok.decode([greedy[0]])
    assert dk.answer_token_ids(model, prompts[0], right)[0] == greedy[0]  # precondition of the case
    wrong_id = (greedy[1] + 1) % len(tok)
    wrong = tok.decode([wrong_id])
    assert dk.answer_token_ids(model, prompts[1], wrong)[0] != greedy[1]
    right2 = tok.decode([greedy[2]])
    examples = pd.DataFrame(
        {"tag": ["DET", "DET", "NOUN"], "prompt": prompts, "answer": [right, wrong, right2]}
    )
    res = part_of_speech_filter.correctness_filter(model, examples, batch_size=2, progress=False)
    assert res.checked["greedy_id"].tolist() == greedy
    assert res.checked["correct"].tolist() == [True, False, dk.answer_token_ids(model, prompts[2], right2)[0] == greedy[2]]
    rep = res.report.set_index("tag")
    word = part_of_speech_filter.is_word_token("DET", right)  # a random model's greedy token need not be a word
    assert res.checked["word_token"].iloc[0] == word
    assert rep.loc["DET", "candidates"] == 2 and rep.loc["DET", "kept"] == int(word) and rep.loc["DET", "kept_share"] == word / 2
    assert (res.kept["prompt"].iloc[0] == prompts[0]) if word else (prompts[0] not in set(res.kept["prompt"]))
    assert (res.kept["answer_id"] == res.kept["greedy_id"]).all()
    with pytest.raises(ValueError, match="lack column"):
        part_of_speech_filter.correctness_filter(model, examples.drop(columns="answer"))


def test_greedy_next_tokens_independent_of_batching(tiny_llama):
    prompts = ["The cat sat on the", "Water boils at", "A quick brown fox jumps over", "In"]
    one = part_of_speech_filter.greedy_next_tokens(tiny_llama, prompts, batch_size=1, progress=False)
    many = part_of_speech_filter.greedy_next_tokens(tiny_llama, prompts, batch_size=3, progress=False)
    np.testing.assert_array_equal(one, many)


def test_pos_examples_from_a_folder_or_a_passage_file(nlp, tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHKIT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "tags"
    folder.mkdir()
    (folder / "NOUN.jsonl").write_text("\n".join(json.dumps({"prompt": f"p{i}", "answer": f" a{i}"}) for i in range(3)))
    (folder / "DET.jsonl").write_text(json.dumps({"prompt": "I saw", "answer": " a"}))
    df = part_of_speech.pos_examples(folder, 2, ["DET", "NOUN", "ADJ"])
    assert df["tag"].tolist() == ["DET", "NOUN", "NOUN"]  # requested order, capped, ADJ has no file
    with pytest.raises(ValueError, match="none of the requested"):
        part_of_speech.pos_examples(folder, 2, ["VERB"])
    passages = tmp_path / "passages.jsonl"
    passages.write_text("\n".join(json.dumps({"passage": p}) for p in PASSAGES))
    got = part_of_speech.pos_examples(passages, 2, ["DET", "NOUN"], progress=False)
    want = part_of_speech.pos_dataset(2, ["DET", "NOUN"], passages=PASSAGES, nlp=nlp, cache=False, progress=False)
    pd.testing.assert_frame_equal(got, want)


@pytest.mark.integration
def test_correctness_filter_on_smollm2(smollm2):
    ex = pd.DataFrame(
        {"tag": ["PROPN", "PROPN"], "prompt": ["The capital of France is"] * 2, "answer": [" Paris", " London"]}
    )
    res = part_of_speech_filter.correctness_filter(smollm2, ex, progress=False)
    assert res.checked["correct"].tolist() == [True, False]
    assert res.checked["greedy_token"].iloc[0] == " Paris"


# ---- per-tag files in the common format: bare-word answers, prompts without a trailing space

BARE = {
    "DET": [("He sat on", "the"), ("I saw ", "a"), ("She opened", " the")],
    "PUNCT": [("He sat down", ","), ("It rained all day", "."), ("The song", "(")],
    "NOUN": [("He sat on the", "mat"), ("A red\n", "car")],
}
# what running text gives: the text the model reads, and where the prompt ends in it
RUNNING = {
    "DET": [("He sat on the", "He sat on"), ("I saw a", "I saw"), ("She opened the", "She opened")],
    "PUNCT": [("He sat down,", "He sat down"), ("It rained all day.", "It rained all day"), ("The song (", "The song")],
    "NOUN": [("He sat on the mat", "He sat on the"), ("A red\ncar", "A red\n")],
}


def _write_bare_folder(folder):
    folder.mkdir(exist_ok=True)
    for tag, pairs in BARE.items():
        (folder / f"{tag}.jsonl").write_text("\n".join(json.dumps({"prompt": q, "answer": a}) for q, a in pairs))
    return folder


def test_running_text_pair():
    assert part_of_speech.running_text_pair("He sat on", "the") == ("He sat on", " the")
    assert part_of_speech.running_text_pair("He sat on", "New York") == ("He sat on", " New York")
    assert part_of_speech.running_text_pair("He sat", ",") == ("He sat", ",")
    assert part_of_speech.running_text_pair("He sat", ".") == ("He sat", ".")
    assert part_of_speech.running_text_pair("the book", ")") == ("the book", ")")
    assert part_of_speech.running_text_pair("John", "'s") == ("John", "'s")
    assert part_of_speech.running_text_pair("He sang", "(") == ("He sang", " (")  # an opener takes a space
    assert part_of_speech.running_text_pair("He sat on", " the") == ("He sat on", " the")  # already spaced
    assert part_of_speech.running_text_pair("He sat on", "  the") == ("He sat on", "  the")
    assert part_of_speech.running_text_pair("He sat on ", "the") == ("He sat on", " the")  # the space moves
    assert part_of_speech.running_text_pair("He sat on  ", "the") == ("He sat on", "  the")
    assert part_of_speech.running_text_pair("He sat on ", " the") == ("He sat on ", " the")  # both: left alone
    assert part_of_speech.running_text_pair("A list:\n", "item") == ("A list:\n", "item")  # newlines stay
    assert part_of_speech.running_text_pair("", "The") == ("", "The")
    # no space after an opener or a hyphen straight after a word
    assert part_of_speech.running_text_pair("a well-", "known") == ("a well-", "known")
    assert part_of_speech.running_text_pair("the series (", "2001") == ("the series (", "2001")
    assert part_of_speech.running_text_pair("called ``", "Bee") == ("called ``", "Bee")
    assert part_of_speech.running_text_pair('called "', "Bee") == ('called "', "Bee")
    assert part_of_speech.running_text_pair('he said "go"', "home") == ('he said "go"', " home")  # a closing quote
    assert part_of_speech.running_text_pair("the students'", "books") == ("the students'", " books")
    assert part_of_speech.running_text_pair("one -", "two") == ("one -", " two")  # a spaced dash


def test_bare_word_files_are_joined_as_running_text(tmp_path):
    df = part_of_speech.load_pos_files(_write_bare_folder(tmp_path / "tags"))
    got = {t: list(zip(g["prompt"], g["answer"])) for t, g in df.groupby("tag", sort=False)}
    assert got == {
        "DET": [("He sat on", " the"), ("I saw", " a"), ("She opened", " the")],
        "PUNCT": [("He sat down", ","), ("It rained all day", "."), ("The song", " (")],
        "NOUN": [("He sat on the", " mat"), ("A red\n", "car")],
    }
    for t, rows in got.items():
        assert [q + a for q, a in rows] == [text for text, _ in RUNNING[t]]


def _running_text_ids(model, tag):
    """The id of the token after the prompt, from encoding the running text itself."""
    out = []
    for text, prompt in RUNNING[tag]:
        ids, pids = dk.encode(model, text), dk.encode(model, prompt)
        assert ids[: len(pids)] == pids  # the prompt's tokens are a prefix of the text's
        out.append(ids[len(pids)])
    return out


def _check_answer_ids(model, folder):
    res = part_of_speech_filter.correctness_filter(model, part_of_speech.pos_examples(folder, 10, ["DET", "PUNCT", "NOUN"]), batch_size=4, progress=False)
    for tag in BARE:
        assert res.checked.loc[res.checked["tag"] == tag, "answer_id"].tolist() == _running_text_ids(model, tag), tag
    # the greedy prediction is read after the prompt running text has (no trailing space)
    assert "I saw" in res.checked["prompt"].tolist()
    # the bare word as given would have asked for another token
    assert dk.answer_token_ids(model, "He sat on", "the")[0] != _running_text_ids(model, "DET")[0]
    return res


def test_bare_word_folder_gives_running_text_answer_ids(tiny_llama, tmp_path):
    _check_answer_ids(tiny_llama, _write_bare_folder(tmp_path / "tags"))


@pytest.mark.integration
def test_bare_word_folder_gives_running_text_answer_ids_smollm2(smollm2, tmp_path):
    res = _check_answer_ids(smollm2, _write_bare_folder(tmp_path / "tags"))
    tok = smollm2.tokenizer
    words = [tok.decode([int(i)]) for i in res.checked["answer_id"]]
    assert words == [" the", " a", " the", ",", ".", " (", " mat", "car"]


# ---- what the correctness filter kept, and whether the classes can be compared


def _checked(counts):
    """A checked frame: ``counts`` maps tag -> (candidates, kept)."""
    rows = [(t, i < k) for t, (n, k) in counts.items() for i in range(n)]
    return pd.DataFrame(rows, columns=["tag", "correct"])


def test_filter_table_counts():
    checked = _checked({"DET": (10, 3), "NOUN": (8, 8), "ADP": (5, 0), "PROPN": (4, 1), "VERB": (2, 1)})
    analysed = checked[checked["correct"]].groupby("tag").head(2)
    t = part_of_speech_filter.filter_table(checked, analysed)
    assert list(t.columns) == ["level", "group", "word_class", "candidates", "not_word", "kept", "kept_share", "analysed"]
    assert t[["level", "group", "word_class"]].values.tolist() == [
        ["tag", "DET", "function"], ["tag", "NOUN", "content"], ["tag", "ADP", "function"],
        ["tag", "PROPN", "other"], ["tag", "VERB", "content"],
        ["class", "function", "function"], ["class", "content", "content"], ["class", "other", "other"],
    ]
    assert t["candidates"].tolist() == [10, 8, 5, 4, 2, 15, 10, 4]
    assert t["kept"].tolist() == [3, 8, 0, 1, 1, 3, 9, 1]
    np.testing.assert_allclose(t["kept_share"], [0.3, 1.0, 0.0, 0.25, 0.5, 0.2, 0.9, 0.25])
    assert t["analysed"].tolist() == [2, 2, 0, 1, 1, 2, 3, 1]
    assert "analysed" not in part_of_speech_filter.filter_table(checked).columns
    with pytest.raises(ValueError, match="correct"):
        part_of_speech_filter.filter_table(checked.drop(columns="correct"))


def test_first_tokens_that_are_no_word_are_told_apart():
    assert part_of_speech_filter.is_word_token("NOUN", " mat") and part_of_speech_filter.is_word_token("ADJ", "th")
    assert not part_of_speech_filter.is_word_token("ADJ", "1")  # "13th" split into digits
    assert not part_of_speech_filter.is_word_token("NOUN", "-") and not part_of_speech_filter.is_word_token("DET", " ")
    assert part_of_speech_filter.is_word_token("PUNCT", ",") and not part_of_speech_filter.is_word_token("PUNCT", " and")
    assert part_of_speech_filter.is_word_token("NUM", " 13") and not part_of_speech_filter.is_word_token("NUM", " thirteen")


def test_filter_table_counts_correct_predictions_that_are_no_word_apart():
    checked = _checked({"DET": (10, 4), "NOUN": (6, 3)})
    checked["word_token"] = True
    checked.loc[[0, 10], "word_token"] = False  # one correct DET, one correct NOUN: digits, hyphens
    checked.loc[9, "word_token"] = False  # a wrong prediction counts as not kept, not as no word
    t = part_of_speech_filter.filter_table(checked).set_index("group")
    assert t.loc["DET", ["candidates", "not_word", "kept"]].tolist() == [10, 1, 3]
    assert t.loc["content", ["candidates", "not_word", "kept"]].tolist() == [6, 1, 2]
    s = part_of_speech_filter.filter_sentence(t.reset_index())
    assert "kept 5 of 16" in s and "A further 2 correct predictions were dropped" in s


def test_filter_sentence_says_what_was_kept():
    s = part_of_speech_filter.filter_sentence(part_of_speech_filter.filter_table(_checked({"DET": (800, 5), "NOUN": (800, 4)})))
    assert "kept 9 of 1,600" in s and "function words 5 of 800 (0.6 %)" in s and "DET 5/800" in s


def test_class_comparison_thresholds():
    assert part_of_speech_filter.MIN_KEPT_PER_CLASS == 30 and part_of_speech_filter.MIN_KEPT_SHARE == 0.10
    ok = part_of_speech_filter.class_comparison(part_of_speech_filter.filter_table(_checked({"DET": (300, 30), "NOUN": (300, 30)})))
    assert ok == (True, "")  # exactly at both thresholds
    few = part_of_speech_filter.class_comparison(part_of_speech_filter.filter_table(_checked({"DET": (145, 29), "NOUN": (300, 30)})))
    assert not few.ok and "29 of 145 function-word" in few.reason and "(20 %; at least 30 examples needed)" in few.reason and "content-word" not in few.reason
    rare = part_of_speech_filter.class_comparison(part_of_speech_filter.filter_table(_checked({"DET": (300, 30), "VERB": (301, 30)})))
    assert not rare.ok and "30 of 301 content-word candidates passed" in rare.reason and "(9.9 %; at least 10 % needed)" in rare.reason
    both = part_of_speech_filter.class_comparison(part_of_speech_filter.filter_table(_checked({"DET": (800, 5), "NOUN": (800, 4)})))
    assert not both.ok and "5 of 800 function-word" in both.reason and "4 of 800 content-word" in both.reason
    assert "(0.6 %; at least 30 examples and 10 % needed)" in both.reason and "gap" in both.reason
    # per tag it is the class that counts: two function tags of 15 make 30
    assert part_of_speech_filter.class_comparison(part_of_speech_filter.filter_table(_checked({"DET": (40, 15), "ADP": (40, 15), "NOUN": (40, 30)}))).ok
    # too few analysed (n_per_tag caps them), though enough were kept
    checked = _checked({"DET": (100, 40), "NOUN": (100, 40)})
    capped = part_of_speech_filter.class_comparison(part_of_speech_filter.filter_table(checked, checked[checked["correct"]].groupby("tag").head(10)))
    assert not capped.ok and "10 function-word examples are analysed" in capped.reason
    one_class = part_of_speech_filter.class_comparison(part_of_speech_filter.filter_table(_checked({"DET": (100, 90)})))
    assert not one_class.ok and "no content-word candidates" in one_class.reason
    # other thresholds can be passed
    assert part_of_speech_filter.class_comparison(part_of_speech_filter.filter_table(_checked({"DET": (145, 29), "NOUN": (150, 30)})), min_kept=20).ok
