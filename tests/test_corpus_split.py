"""One split of the embedded corpus: tuned lenses train on the lens quarter, every
chapter analyses only the rest, and each chapter's prompts are checked against the
passages a lens sidecar says it was trained on."""

from __future__ import annotations

import json

import pytest

from depthkit import data
from depthkit.analyses import part_of_speech
from depthkit.chapters import NOTEBOOK_DIR, ch00_lenses, ch01_guess_then_refine
from depthkit.lens import get_tuned_lens


@pytest.fixture(scope="module")
def lens_digests(tiny_models, tmp_path_factory):
    """The passages a lens trained with the defaults (embedded text) reads."""
    lens = get_tuned_lens(tiny_models["llama"], budget="smoke", cache_dir=tmp_path_factory.mktemp("lenses"), progress=False)
    digests = set(lens.meta["train_passage_digests"])
    assert len(digests) == len(lens.meta["train_passages"]) > 0
    return digests


def _digests(texts):
    return {data.passage_digest(t) for t in texts}


def test_the_split_partitions_the_corpus_by_text():
    every, lens, rest = (data.wikipedia_passages(s) for s in ("all", "lens", "analysis"))
    assert not _digests(lens) & _digests(rest) and len(lens) + len(rest) == len(every)
    assert 0.2 < len(lens) / len(every) < 0.3  # the lens quarter
    assert all(data.corpus_split(t) == "lens" for t in lens[:50])
    with pytest.raises(data.DataError, match="Unknown corpus split"):
        data.wikipedia_passages("train")


def test_a_default_lens_trains_only_on_the_lens_split(lens_digests):
    assert lens_digests <= _digests(data.wikipedia_passages("lens"))


def _sources(prompts, passages):
    """The passage each prompt was cut from; checks that the prompt is its prefix."""
    out = []
    for prompt, pid in zip(prompts["prompt"], prompts["passage_id"]):
        assert passages[pid].startswith(prompt)
        out.append(passages[pid])
    return out


def test_chapter_01_prompts_avoid_lens_training_text(lens_digests):
    prompts, baseline = ch01_guess_then_refine.load_prompts("embedded", 400, 0)
    assert not _digests(_sources(prompts, data.wikipedia_passages("analysis"))) & lens_digests


def test_chapter_00_evaluation_prompts_avoid_every_lens(lens_digests):
    class Fake:  # a lens trained on the analysis split itself: its passages must be left out
        meta = {"train_passage_digests": sorted(_digests(data.wikipedia_passages("analysis")[:300]))}

    prompts = ch00_lenses.eval_prompts(200, 0, [Fake()])
    used = _digests(_sources(prompts, data.wikipedia_passages("analysis")))
    assert len(prompts) > 0 and not used & lens_digests and not used & set(Fake.meta["train_passage_digests"])


def test_chapter_04_passages_avoid_lens_training_text(lens_digests, tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHKIT_CACHE", str(tmp_path))
    ex = part_of_speech.pos_examples("embedded", 20, ["DET", "NOUN"], progress=False)
    passages = data.wikipedia_passages("analysis")
    sources = [passages[i] for i in ex["passage_id"]]
    assert all(s[c:].lstrip().startswith(a.strip()) or a.strip() in s for s, c, a in zip(sources, ex["char_start"], ex["answer"]))
    assert not _digests(sources) & lens_digests


@pytest.mark.parametrize("slug", ["05_residual_phase_change", "06_depth_score"])
def test_passage_chapters_read_the_analysis_split(slug):
    code = "".join("".join(c["source"]) for c in json.loads((NOTEBOOK_DIR / f"{slug}.ipynb").read_text())["cells"] if c["cell_type"] == "code")
    assert 'wikipedia_passages("analysis")' in code and "wikipedia_passages()" not in code
