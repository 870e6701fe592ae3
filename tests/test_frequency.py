"""Token frequencies, ranks, buckets and the bigram baseline, checked against hand counts."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from depthkit.analyses import frequency as F
from depthkit.data import token_counts


@pytest.fixture(scope="module")
def word_tokenizer():
    """A word-level tokenizer whose ids are known by hand; it adds <s> by default, so a
    count that included special tokens would show."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "<unk>": 1, "a": 2, "b": 3, "c": 4, "d": 5, "e": 6, "f": 7}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", unk_token="<unk>")
    assert tok("a b")["input_ids"] == [0, 2, 3]
    return tok


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from transformers import AutoTokenizer

    from depthkit.engine.models import tiny_tokenizer_dir

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir())


def test_hand_count_with_ties_and_unseen(word_tokenizer, tmp_path):
    # a:3  b:2  d:2  c:1  e:1  <unk>:1 (the word "zz")  -> f and <s> unseen
    texts = ["a b a", "d c a", "b d e zz"]
    freq = F.token_frequencies(word_tokenizer, texts, cache_dir=tmp_path)
    assert list(freq.columns) == ["token_id", "count", "rank", "share"]
    assert freq["token_id"].tolist() == list(range(8))
    assert freq["count"].tolist() == [0, 1, 3, 2, 1, 2, 1, 0]
    # ties broken by token id: b(3) before d(5); <unk>(1) < c(4) < e(6); unseen <s>(0) < f(7) come last
    assert freq["rank"].tolist() == [7, 4, 1, 2, 5, 3, 6, 8]
    assert np.allclose(freq["share"], np.array([0, 1, 3, 2, 1, 2, 1, 0]) / 10)


def test_ranks_match_an_independent_count_with_the_tiny_bpe(tiny_tokenizer, tmp_path):
    texts = ["The cat sat on the mat.", "The dog lay by the door, and the cat sat.", "Water boils at 100 degrees."]
    freq = F.token_frequencies(tiny_tokenizer, texts, cache_dir=tmp_path)
    size = len(tiny_tokenizer)
    assert len(freq) == size
    counts = Counter(i for t in texts for i in tiny_tokenizer.encode(t, add_special_tokens=False))
    expected_rank = {tid: r for r, tid in enumerate(sorted(range(size), key=lambda i: (-counts[i], i)), start=1)}
    assert freq["count"].tolist() == [counts[i] for i in range(size)]
    assert freq["rank"].tolist() == [expected_rank[i] for i in range(size)]
    seen = freq[freq["count"] > 0]
    assert seen["rank"].max() == len(seen) < size  # unseen tokens all rank after the seen ones
    assert freq["share"].sum() == pytest.approx(1.0)


def test_default_corpus_is_the_embedded_wikipedia(word_tokenizer, tmp_path):
    freq = F.token_frequencies(word_tokenizer, cache_dir=tmp_path)
    from depthkit.data.embedded import wikipedia_passages

    words = Counter(w for p in wikipedia_passages() for w in p.split())
    assert freq.loc[2, "count"] == words["a"]  # the WordLevel tokenizer splits on whitespace only


def test_cache_is_reused_and_keyed_by_tokenizer_and_corpus(word_tokenizer, tiny_tokenizer, tmp_path, monkeypatch):
    texts = ["a b a", "c"]
    first = F.token_frequencies(word_tokenizer, texts, cache_dir=tmp_path)
    files = sorted((tmp_path / "frequency").iterdir())
    assert len(files) == 1 and files[0].suffix == ".parquet"

    def no_encoding(*args, **kwargs):
        raise AssertionError("the cache should have been used")

    with monkeypatch.context() as m:
        m.setattr(token_counts, "_encode", no_encoding)
        pd.testing.assert_frame_equal(F.token_frequencies(word_tokenizer, texts, cache_dir=tmp_path), first)
    other_corpus = F.token_frequencies(word_tokenizer, ["a b a", "c c"], cache_dir=tmp_path)
    assert other_corpus.loc[4, "count"] == 2
    other_tokenizer = F.token_frequencies(tiny_tokenizer, texts, cache_dir=tmp_path)
    assert len(other_tokenizer) == len(tiny_tokenizer)
    assert len(list((tmp_path / "frequency").glob("*.parquet"))) == 3
    assert not list((tmp_path / "frequency").glob(".*"))  # no temporary files left


def test_cache_dir_defaults_to_env(word_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHKIT_CACHE", str(tmp_path / "cache"))
    F.token_frequencies(word_tokenizer, ["a"])
    assert len(list((tmp_path / "cache" / "frequency").glob("unigram-*.parquet"))) == 1


@pytest.mark.parametrize("damage", ["garbage", "wrong_counts"])
def test_damaged_cache_is_recomputed_with_a_warning(word_tokenizer, tmp_path, damage):
    texts = ["a b a", "c"]
    good = F.token_frequencies(word_tokenizer, texts, cache_dir=tmp_path)
    (path,) = (tmp_path / "frequency").glob("unigram-*.parquet")
    if damage == "garbage":
        path.write_bytes(b"PAR1 not really parquet")
    else:
        good.assign(rank=1).to_parquet(path)
    with pytest.warns(UserWarning, match="damaged"):
        again = F.token_frequencies(word_tokenizer, texts, cache_dir=tmp_path)
    pd.testing.assert_frame_equal(again, good)
    pd.testing.assert_frame_equal(pd.read_parquet(path), good)  # repaired on disk


def test_bad_texts(word_tokenizer, tmp_path):
    with pytest.raises(TypeError, match="not one string"):
        F.token_frequencies(word_tokenizer, "a b", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="empty"):
        F.token_frequencies(word_tokenizer, [], cache_dir=tmp_path)


def test_bucket_of_edges():
    ranks = [1, 10, 11, 100, 101, 1000, 1001, 49152]
    assert F.bucket_of(ranks).tolist() == [
        "Top 1-10",
        "Top 1-10",
        "11-100",
        "11-100",
        "101-1000",
        "101-1000",
        "rest",
        "rest",
    ]
    assert F.BUCKETS == ("Top 1-10", "11-100", "101-1000", "rest")
    with pytest.raises(ValueError, match="start at 1"):
        F.bucket_of([0])
    with pytest.raises(ValueError, match="NaN"):
        F.bucket_of([1.0, np.nan])


def hand_freq(counts):
    """A frequency table from counts listed by token id."""
    return token_counts._frequency_frame(np.asarray(counts, dtype=np.int64))


def test_equal_mass_edges_on_hand_counts():
    # by rank: 40 20 10 10 10 5 5 (total 100); token ids shuffled on purpose
    freq = hand_freq([10, 5, 40, 10, 20, 5, 10])
    assert freq.sort_values("rank")["count"].tolist() == [40, 20, 10, 10, 10, 5, 5]
    edges = F.equal_mass_buckets(freq, n=4)
    # 25 % reached at rank 1 (40), 50 % at rank 2 (60), 75 % at rank 4 (80)
    assert edges.tolist() == [0, 1, 2, 4, 7]
    assert F.mass_bucket_labels(edges) == ("Top 1-1", "2-2", "3-4", "5+")
    assert F.bucket_of_mass([1, 2, 3, 4, 5, 7, 9], edges).tolist() == ["Top 1-1", "2-2", "3-4", "3-4", "5+", "5+", "5+"]
    # exactly at the boundary: by rank 30 20 20 20 10, half the mass is reached at rank 2
    assert F.equal_mass_buckets(hand_freq([20, 30, 10, 20, 20]), n=2).tolist() == [0, 2, 5]


def test_equal_mass_edges_are_pushed_apart_when_one_token_dominates():
    edges = F.equal_mass_buckets(hand_freq([90, 4, 3, 2, 1]), n=4)
    assert edges.tolist() == [0, 1, 2, 3, 5]
    with pytest.raises(ValueError):
        F.equal_mass_buckets(hand_freq([1, 1]), n=3)
    with pytest.raises(ValueError, match="increase"):
        F.bucket_of_mass([1], [0, 2, 2, 5])


def test_corpus_share_of_top():
    freq = hand_freq([10, 5, 40, 10, 20, 5, 10])
    share = F.corpus_share_of_top(freq, ks=(1, 2, 5, 100))
    assert share["top_k"].tolist() == [1, 2, 5, 100]
    assert share["share"].tolist() == pytest.approx([0.4, 0.6, 0.9, 1.0])


def test_ranks_of_handles_ids_beyond_the_table():
    freq = hand_freq([1, 3, 2])
    assert F.ranks_of(freq, [0, 1, 2, 3, 10]).tolist() == [3, 1, 2, 4, 4]


def test_bigram_successors_by_hand(word_tokenizer, tmp_path):
    # pairs inside passages only: (a,b) x2, (b,a), (a,c), (d,e), (e,d), (d,a); never (c,a) across passages
    texts = ["a b a c", "a b", "d e d a"]
    big = F.bigram_successors(word_tokenizer, texts, cache_dir=tmp_path)
    assert list(big.columns) == ["prev_id", "next_id", "count", "total"]
    rows = {r.prev_id: (r.next_id, r.count, r.total) for r in big.itertuples()}
    assert rows == {
        2: (3, 2, 3),  # a -> b twice (and c once)
        3: (2, 1, 1),  # b -> a
        5: (2, 1, 2),  # d -> e once and d -> a once: tie, smallest id (a=2) wins
        6: (5, 1, 1),  # e -> d
    }
    assert big["prev_id"].tolist() == [2, 3, 5, 6]
    assert len(list((tmp_path / "frequency").glob("bigram-*.parquet"))) == 1
    pd.testing.assert_frame_equal(F.bigram_successors(word_tokenizer, texts, cache_dir=tmp_path), big)


@pytest.mark.integration
def test_smollm2_corpus_shares_are_in_the_papers_range(smollm2, tmp_path):

    tok = smollm2.tokenizer
    freq = F.token_frequencies(tok, cache_dir=tmp_path)
    assert len(freq) == len(tok) == 49152
    share = F.corpus_share_of_top(freq).set_index("top_k")["share"]
    # The paper: 23 / 47 / 69 % for Llama-2 on Wikipedia; another BPE on other Wikipedia text lands nearby.
    assert 0.15 < share[10] < 0.35 and 0.35 < share[100] < 0.6 and 0.55 < share[1000] < 0.8
    top = tok.convert_ids_to_tokens(freq.sort_values("rank")["token_id"].head(10).tolist())
    assert {",", ".", "Ġthe"} <= set(top)
