"""The exercises for instructors: every exercise notebook runs to the end with the
solutions filled in and stops at its first check with the blanks; every checker
accepts the reference solution and names the usual mistakes; the solutions agree
with depthkit; the book shows each notebook as a page with the stub visible and
the solution folded."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import ToyChapter, book_root_copy, toy_notebook

import depthkit as dk
from depthkit.analyses import frequency, summaries
from depthkit.book import runner as book
from depthkit.exercises import CHECKS, ExerciseError, pages, practice_model, solutions
from depthkit.exercises import check_flip_rate as flips
from depthkit.exercises import check_frequency_bucket as buckets
from depthkit.exercises import check_logit_lens as lens
from depthkit.exercises import check_onset_layer as onsets
from depthkit.exercises import check_patched_logit_diff as patch
from depthkit.exercises import check_readout as readouts
from depthkit.exercises.frequency_checks import _synthetic_steps

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = pages.exercise_notebooks()
S = solutions

# --------------------------------------------------------------------------- the notebooks


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run many times faster on one thread than on two busy cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("OMP_NUM_THREADS", "1")  # the kernels' tiny models too (the checks set it themselves)
    with book._kernel_of_this_interpreter(tmp_path_factory.mktemp("kernel")) as name:
        yield name
    mp.undo()


def _execute(nb: Any, tmp: Path, kernel: str, real_model: str | None) -> tuple[Any, str | None, str]:
    """Run ``nb`` with papermill; (executed notebook, error name or None, error text)."""
    import papermill

    src, out = tmp / "in.ipynb", tmp / "out.ipynb"
    nbformat.write(nb, src)
    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(src), str(out), parameters={"real_model": real_model}, kernel_name=kernel, progress_bar=False, cwd=str(tmp)
        )
        error = (None, "")
    except papermill.PapermillExecutionError as err:
        error = (err.ename, err.evalue)
    print(f"\n{tmp.name}: {time.perf_counter() - start:.1f} s")
    return nbformat.read(out, as_version=4), *error


def _stdout(nb: Any) -> str:
    return "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stdout")


def _stubs(nb: Any) -> list[str]:
    return [pages.stub_name(c.source) for c in nb.cells if "exercise" in c.metadata.get("tags", [])]


def test_there_is_an_exercise_notebook_for_chapters_00_01_02_04() -> None:
    assert [p.name[:2] for p in NOTEBOOKS] == ["00", "01", "02", "04"]
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        names = _stubs(nb)
        assert names and set(names) <= set(CHECKS), path.name
        for cell in nb.cells:
            if "exercise" in cell.metadata.get("tags", []):
                assert 'raise NotImplementedError("write me")' in cell.source
                assert not cell.get("outputs")
        # Every stub is followed by its check.
        sources = [c.source for c in nb.cells]
        for name in names:
            assert any(f"check_{name}({name})" in s for s in sources) or any(
                f"{CHECKS[name].__name__}({name})" in s for s in sources
            ), name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_solved_notebook_runs_and_every_check_passes(path: Path, kernel: str, tmp_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    # "tiny-llama" as the real model runs the last section's code in seconds.
    out, ename, evalue = _execute(pages.solved(nb), tmp_path, kernel, real_model="tiny-llama")
    assert ename is None, f"{ename}: {evalue}"
    text = _stdout(out)
    for name in _stubs(nb):
        assert f"✔ {name} is right" in text, text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_blank_notebook_stops_at_the_first_check_with_its_message(path: Path, kernel: str, tmp_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    _, ename, evalue = _execute(nb, tmp_path, kernel, real_model=None)
    first = _stubs(nb)[0]
    assert ename == "ExerciseError"
    assert f"`{first}` is not written yet" in evalue and "NotImplementedError" in evalue


# --------------------------------------------------------------------------- checkers: the reference passes


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_each_check_accepts_the_reference_solution(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    CHECKS[name](S.SOLUTIONS[name])
    assert capsys.readouterr().out.startswith(f"✔ {name} is right")


def test_a_check_says_when_it_was_given_no_function() -> None:
    with pytest.raises(ExerciseError, match="Pass the function itself"):
        readouts("readout")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- checkers: usual mistakes


def _fails(check: Callable[[Any], None], fn: Callable[..., Any], *fragments: str) -> None:
    with pytest.raises(ExerciseError) as info:
        check(fn)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def _name(layer: int, n: int) -> str:
    return f"blocks.{layer}.hook_resid_pre" if layer < n else f"blocks.{n - 1}.hook_resid_post"


READOUT_MISTAKES: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "stub": (lambda m, h: (_ for _ in ()).throw(NotImplementedError("write me")), ("`readout` is not written yet",)),
    "no norm": (lambda m, h: m.unembed(h), ("*without* the final norm", "model.ln_final")),
    "norm without its weight": (
        lambda m, h: m.unembed(h / h.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()),
        ("left out the norm's learned weight",),
    ),
    "norm twice": (lambda m, h: m.unembed(m.ln_final(m.ln_final(h))), ("applied twice",)),
    "probabilities": (lambda m, h: torch.softmax(S.readout(m, h), -1), ("probabilities",)),
    "log-probabilities": (lambda m, h: torch.log_softmax(S.readout(m, h), -1), ("log-probabilities",)),
    "top-1 ids": (lambda m, h: S.readout(m, h).argmax(-1), ("looks like token ids",)),
    "no unembedding": (lambda m, h: m.ln_final(h), ("d_model = 64", "unembedding")),
    "flattened": (lambda m, h: S.readout(m, h).reshape(-1, m.cfg.d_vocab), ("every leading dimension",)),
    "no return": (lambda m, h: None, ("returned None", "return")),
    "numpy": (lambda m, h: S.readout(m, h).detach().numpy(), ("torch tensor",)),
}


@pytest.mark.parametrize("mistake", sorted(READOUT_MISTAKES))
def test_readout_check_names_the_mistake(mistake: str) -> None:
    fn, fragments = READOUT_MISTAKES[mistake]
    _fails(readouts, fn, *fragments)


def _lens_with(name_of: Callable[[int, int], str], decode: Callable[..., torch.Tensor] = S.readout, keep_batch: bool = True):
    def logit_lens(model, tokens, layer):
        _, cache = model.run_with_cache(tokens)
        out = decode(model, cache[name_of(layer, model.cfg.n_layers)])
        return out if keep_batch else out[0]

    return logit_lens


LENS_MISTAKES: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "resid_post (off by one)": (
        _lens_with(lambda layer, n: f"blocks.{min(layer, n - 1)}.hook_resid_post"),
        ("Off by one layer", "at layer 0 you return the lens of layer 1", "hook_resid_pre"),
    ),
    "one layer early": (
        _lens_with(lambda layer, n: _name(max(layer - 1, 0), n) if layer else _name(0, n)),
        ("at layer 1 you return the lens of layer 0", "too early"),
    ),
    "no block L": (_lens_with(lambda layer, n: f"blocks.{layer}.hook_resid_pre"), ("KeyError", "blocks.3.hook_resid_post")),
    "no norm": (_lens_with(_name, decode=lambda m, h: m.unembed(h)), ("without the final norm",)),
    "batch dropped": (_lens_with(_name, keep_batch=False), ("batch dimension is gone",)),
    "final logits": (lambda m, t, layer: m(t), ("the model's final logits",)),
    "resid_mid": (_lens_with(lambda layer, n: f"blocks.{layer}.hook_resid_mid" if layer < n else _name(layer, n)), ("hook_resid_mid",)),
    "last position only": (lambda m, t, layer: S.logit_lens(m, t, layer)[:, -1], ("one position",)),
}


@pytest.mark.parametrize("mistake", sorted(LENS_MISTAKES))
def test_logit_lens_check_names_the_mistake(mistake: str) -> None:
    fn, fragments = LENS_MISTAKES[mistake]
    _fails(lens, fn, *fragments)


def _select(cut: Callable[[np.ndarray, int], bool]) -> Callable[[np.ndarray], np.ndarray]:
    def frequency_bucket(ranks):
        r = np.asarray(ranks)
        return np.select([cut(r, 10), cut(r, 100), cut(r, 1000)], ["Top 1-10", "11-100", "101-1000"], "rest")

    return frequency_bucket


BUCKET_MISTAKES: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "strict edges": (_select(lambda r, e: r < e), ("upper edges are inclusive", "<=")),
    "edge one too high": (_select(lambda r, e: r <= e + 1), ("rank 11 gave 'Top 1-10'",)),
    "own names": (lambda r: np.where(np.asarray(r) <= 10, "top10", "other"), ("dk.frequency.BUCKETS", "'top10'")),
    "one string": (lambda r: "rest", ("one string",)),
    "too few": (lambda r: S.frequency_bucket(r)[:-1], ("one bucket name per rank",)),
}


@pytest.mark.parametrize("mistake", sorted(BUCKET_MISTAKES))
def test_frequency_bucket_check_names_the_mistake(mistake: str) -> None:
    fn, fragments = BUCKET_MISTAKES[mistake]
    _fails(buckets, fn, *fragments)


def _flips(reference: str = "final", bucket_of: str = "layer", denominator: str = "bucket", scale: float = 1.0):
    def flip_rate(steps: pd.DataFrame) -> pd.DataFrame:
        s = steps.sort_values(["item", "layer"]).copy()
        ref_layer = {"final": s["layer"].max(), "layer0": 0}.get(reference)
        if reference == "next":
            s["ref"] = s.groupby("item")["top1_id"].shift(-1).fillna(s["top1_id"])
        else:
            s = s.merge(s.loc[s["layer"] == ref_layer, ["item", "top1_id"]].rename(columns={"top1_id": "ref"}), on="item")
        if bucket_of == "final":
            last = s.loc[s["layer"] == s["layer"].max(), ["item", "bucket"]].rename(columns={"bucket": "fb"})
            s = s.drop(columns="bucket").merge(last, on="item").rename(columns={"fb": "bucket"})
        s["flip"] = (s["top1_id"] != s["ref"]).astype(float)
        g = s.groupby(["layer", "bucket"])["flip"]
        rate = g.mean() if denominator == "bucket" else g.sum() / s.groupby("layer").size().reindex(g.sum().index, level=0)
        return (scale * rate).rename("flip_rate").reset_index()

    return flip_rate


FLIP_MISTAKES: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "agreement": (lambda s: S.flip_rate(s).assign(flip_rate=lambda d: 1 - d["flip_rate"]), ("agreement rates",)),
    "percent": (_flips(scale=100.0), ("percentages",)),
    "bucket of the final token": (_flips(bucket_of="final"), ("*final* token",)),
    "against layer 0": (_flips(reference="layer0"), ("with layer 0",)),
    "against the next layer": (_flips(reference="next"), ("with the next one",)),
    "over the whole layer": (_flips(denominator="layer"), ("*in that bucket*",)),
    "no bucket": (lambda s: S.flip_rate(s).drop(columns="bucket"), ("no `bucket` column",)),
    "series": (lambda s: S.flip_rate(s)["flip_rate"].to_numpy(), ("return a DataFrame",)),
    "a missing pair": (lambda s: S.flip_rate(s).iloc[1:], ("No rate for 1",)),
}


@pytest.mark.parametrize("mistake", sorted(FLIP_MISTAKES))
def test_flip_rate_check_names_the_mistake(mistake: str) -> None:
    fn, fragments = FLIP_MISTAKES[mistake]
    _fails(flips, fn, *fragments)


def test_flip_rate_check_accepts_a_series_and_categorical_buckets() -> None:
    flips(lambda s: S.flip_rate(s).set_index(["layer", "bucket"])["flip_rate"])
    flips(lambda s: S.flip_rate(s.assign(bucket=pd.Categorical(s["bucket"]))))  # observed=True
    # An unobserved groupby leaves NaN rows for pairs that never occur: ignored.
    flips(lambda s: s.assign(bucket=pd.Categorical(s["bucket"])).pipe(_unobserved))


def _unobserved(s: pd.DataFrame) -> pd.DataFrame:
    last = s.loc[s["layer"] == s["layer"].max(), ["item", "top1_id"]].rename(columns={"top1_id": "final"})
    m = s.merge(last, on="item").assign(flip=lambda d: d["top1_id"] != d["final"])
    return m.groupby(["layer", "bucket"], observed=False)["flip"].mean().rename("flip_rate").reset_index()


def _patch(how: str = "", sign: float = 1.0, run: str = "patched"):
    def patched_logit_diff(model, source, target, layer, good, bad, position=-1):
        n = model.cfg.n_layers
        name = {"post": f"blocks.{min(layer, n - 1)}.hook_resid_post", "pre": f"blocks.{layer}.hook_resid_pre"}.get(how, _name(layer, n))
        _, cache = model.run_with_cache(source)
        src = cache[name]

        def hook(resid, hook):
            if how == "all":
                resid[:] = src
            elif how != "none":
                resid[:, position] = src[:, position]
            if how != "no return":
                return resid

        logits = {"patched": lambda: model.run_with_hooks(target, fwd_hooks=[(name, hook)]), "source": lambda: model(source)}[run]()
        z = torch.softmax(logits, -1) if how == "probs" else logits
        return sign * float(z[0, -1, good] - z[0, -1, bad])

    return patched_logit_diff


PATCH_MISTAKES: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "wrong sign": (_patch(sign=-1.0), ("sign is flipped",)),
    "resid_post (off by one)": (_patch("post"), ("Off by one layer", "hook_resid_pre")),
    "hook does nothing": (_patch("none"), ("no effect",)),
    "every position": (_patch("all"), ("*every* position", "turns the target run into the source run")),
    "source logits": (_patch(run="source"), ("*source* prompt's own", "read the logits of that patched run")),
    "probabilities": (_patch("probs"), ("probabilities",)),
    "no block L": (_patch("pre"), ("KeyError", "blocks.3.hook_resid_post")),
    "a tensor": (lambda *a, **k: torch.tensor([S.patched_logit_diff(*a, **k)] * 2), ("return one number",)),
}


@pytest.mark.parametrize("mistake", sorted(PATCH_MISTAKES))
def test_patch_check_names_the_mistake(mistake: str) -> None:
    fn, fragments = PATCH_MISTAKES[mistake]
    _fails(patch, fn, *fragments)


def test_patch_check_accepts_an_in_place_hook_and_a_zero_d_tensor() -> None:
    # A hook that edits in place and returns nothing is valid TransformerLens.
    patch(lambda *a, **k: torch.tensor(_patch("no return")(*a, **k)))


def _first(start: int, ok: Callable[[int, int], bool], never: Any = None, offset: int = 0):
    def onset_layer(ranks, k=1):
        return next((i - offset for i in range(start, len(ranks)) if ok(ranks[i], k)), never)

    return onset_layer


ONSET_MISTAKES: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "counts layer 0": (_first(0, lambda r, k: r <= k), ("Layer 0", "not depth", "FIRST_DEPTH_LAYER")),
    "strict": (_first(1, lambda r, k: r < k), ("use `<=`",)),
    "index into ranks[1:]": (_first(1, lambda r, k: r <= k, offset=1), ("position in ranks[1:]",)),
    "-1 for never": (_first(1, lambda r, k: r <= k, never=-1), ("return None (not -1",)),
    "settles": (
        lambda ranks, k=1: next((i for i in range(1, len(ranks)) if all(r <= k for r in ranks[i:])), None),
        ("*stays*", "*reaches*"),
    ),
    "a string": (lambda ranks, k=1: "layer 2", ("return a layer number",)),
}


@pytest.mark.parametrize("mistake", sorted(ONSET_MISTAKES))
def test_onset_check_names_the_mistake(mistake: str) -> None:
    fn, fragments = ONSET_MISTAKES[mistake]
    _fails(onsets, fn, *fragments)


def test_onset_check_accepts_nan_for_never() -> None:
    onsets(lambda r, k=1: float("nan") if S.onset_layer(r, k) is None else S.onset_layer(r, k))


# --------------------------------------------------------------------------- the solutions against depthkit


@pytest.mark.parametrize("arch", ["llama", "gpt2", "neox", "gemma3"])
def test_readout_and_logit_lens_solutions_match_depthkit(arch: str) -> None:
    model = practice_model(arch)
    n = int(model.cfg.n_layers)
    prompt = "The capital of France is"
    ids = dk.encode(model, prompt)
    traj = dk.trajectories(model, [prompt], lens="logit", top_k=1, progress=False)
    with torch.no_grad():
        logits = model(torch.tensor([ids]))
        h = torch.randn(5, int(model.cfg.d_model))
        assert torch.allclose(S.readout(model, h), dk.LogitLens(model).readout(h), atol=1e-5)
        top1 = [int(S.logit_lens(model, torch.tensor([ids]), layer)[0, -1].argmax()) for layer in range(n + 1)]
        assert torch.allclose(S.logit_lens(model, torch.tensor([ids]), n), logits, atol=1e-4)
    assert top1 == traj.steps.sort_values("layer")["top1_id"].tolist()


def test_bucket_and_flip_solutions_match_depthkit() -> None:
    ranks = np.arange(1, 5001)
    assert (S.frequency_bucket(ranks) == frequency.bucket_of(ranks)).all()
    for seed in range(3):
        freq, steps = _synthetic_steps(seed=seed, n_items=30 + 10 * seed)
        ours = S.flip_rate(steps).astype({"bucket": str}).sort_values(["layer", "bucket"]).reset_index(drop=True)
        ref = summaries.flip_rates(steps[["item", "layer", "top1_id"]], freq).astype({"bucket": str})
        ref = ref.sort_values(["layer", "bucket"]).reset_index(drop=True)
        pd.testing.assert_frame_equal(ours[["layer", "bucket", "flip_rate"]], ref[["layer", "bucket", "flip_rate"]])


def test_patch_solution_matches_depthkit_patching() -> None:
    from depthkit.analyses.patching import patched_logits
    from depthkit.engine.capture import Item, residual_rows

    model = practice_model("llama")
    n = int(model.cfg.n_layers)
    src, tgt = dk.encode(model, "The capital of France is"), dk.encode(model, "A small dog ran into the")
    vectors = residual_rows(model, [Item(src, [len(src) - 1])], list(range(n + 1)))[:, 0]
    z = patched_logits(model, [tgt] * (n + 1), list(range(n + 1)), vectors)
    ours = [S.patched_logit_diff(model, torch.tensor([src]), torch.tensor([tgt]), layer, 7, 11) for layer in range(n + 1)]
    np.testing.assert_allclose(ours, (z[:, 7] - z[:, 11]).numpy(), atol=1e-4)


def test_onset_solution_matches_depthkit() -> None:
    rng = np.random.default_rng(3)
    rows = [{"item": i, "layer": layer, "rank": int(r)} for i in range(300) for layer, r in enumerate(rng.integers(1, 30, 2 + i % 9))]
    frame = pd.DataFrame(rows)
    for k in (1, 5, 20):
        ref = summaries.onset_layers(frame, [k], first_layer=summaries.FIRST_DEPTH_LAYER).set_index("item")["onset"]
        ours = [S.onset_layer(g.sort_values("layer")["rank"].tolist(), k) for _, g in frame.groupby("item")]
        assert [None if np.isnan(v) else int(v) for v in ref] == ours


# --------------------------------------------------------------------------- the book pages


def test_committed_exercise_pages_are_current(tmp_path: Path) -> None:
    """book/exercises/*.md are what the runner writes from the notebooks (regenerate
    with `depthkit book`, or pages.write_exercise_pages(Path('book/exercises')))."""
    fresh = pages.write_exercise_pages(tmp_path)
    for page in fresh:
        committed = REPO / "book" / "exercises" / page.name
        assert committed.is_file() and committed.read_text() == page.read_text(), f"{committed} is stale"


def test_toc_lists_the_exercise_pages_in_their_own_part() -> None:
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    part = next(p for p in toc["parts"] if p["caption"] == "Exercises")
    files = [e["file"] for e in part["chapters"]]
    assert [f"book/exercises/{p.stem}" for p in NOTEBOOKS] == [f for f in files if f.startswith("book/exercises/")]


def test_page_shows_the_stub_and_folds_the_solution() -> None:
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    text = pages.page_markdown(nb, "notebooks/exercises/00_logit_lens.ipynb")
    stub = next(c.source for c in nb.cells if "exercise" in c.metadata.get("tags", []))
    assert f"```python\n{stub}\n```\n\n:::{{dropdown}} Solution\n```python\ndef readout(" in text
    assert ":open:" not in text and text.startswith("# Exercise 00")


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).replace("&quot;", '"').replace("&#39;", "'")


def test_depthkit_book_builds_the_exercise_pages(tmp_path: Path) -> None:
    root = book_root_copy(tmp_path)
    notebook = toy_notebook(tmp_path / "90_tiny.ipynb", "model = 'none'\nresults_root = None", [("md", "# Tiny"), ("code", "1")])
    index = book.build_book("none", [ToyChapter("90", "90_tiny", "Tiny", notebook)], root=root, echo=lambda _: None)
    for path in NOTEBOOKS:
        html = (index.parent / "book" / "exercises" / f"{path.stem}.html").read_text()
        folded = re.findall(r"<details[^>]*>(.*?)</details>", html, flags=re.S)
        assert folded and all(" open" not in d for d in re.findall(r"<details[^>]*>", html))
        outside = _text(re.sub(r"<details[^>]*>.*?</details>", "", html, flags=re.S))
        inside = _text(" ".join(folded))
        for name in _stubs(nbformat.read(path, as_version=4)):
            assert f"def {name}(" in outside and 'raise NotImplementedError("write me")' in outside
            assert f"def {name}(" in inside and "Solution" in inside and "NotImplementedError" not in inside
    assert "Exercises" in (index.parent / "book" / "intro.html").read_text()  # the part, in the sidebar
    log = (root / "_build" / "book-build.log").read_text()
    assert not [line for line in log.splitlines() if "WARNING" in line and "exercises" in line], log
