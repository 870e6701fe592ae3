"""Reference runs: kept with their provenance, installed into a build's results and
pages, said to be stale when the chapter's code changed, never over a user's run."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import yaml
from conftest import ToyChapter, toy_notebook

from depthkit.book import pages as book_pages
from depthkit.book import reference, stamps
from depthkit.book import site as book_site
from depthkit.book.site import BookError
from depthkit.core.results import RunRecorder, load_run

MODEL = "gemma3-270m"


@pytest.fixture
def made(tmp_path: Path) -> tuple[ToyChapter, Path, Path]:
    """A finished run of a toy chapter on MODEL, as the runner leaves it: the
    executed page and its stamp under pages/, the tables under results/."""
    nb = toy_notebook(tmp_path / "91_toy.ipynb", "n = 1", [("md", "# Toy\n\nText."), ("code", "x = n")])
    ch = ToyChapter("91", "91_toy", "Toy", nb)
    pages, results = tmp_path / "pages", tmp_path / "results"
    pages.mkdir()
    params = {"n": 3, "model": MODEL, "results_root": str(results)}
    executed, stamp_path, _ = stamps.output_paths(pages, ch.slug)
    page = book_pages.insert_run_box(nbformat.read(nb, as_version=4), "box")
    executed.write_text(nbformat.writes(page))
    stamp = {"chapter": ch.id, "hash": stamps.run_hash(nb, params, stamps.fingerprint_of(ch)), "params": params, "elapsed_s": 61.0, "cpus": 2,
             "finished": "2026-12-03T10:00:00+0000"}  # fmt: skip
    stamp_path.write_text(json.dumps(stamp))
    with RunRecorder(ch.slug, {"name": MODEL}, {"n": 3}, 0, root=results) as rec:
        rec.table("values", pd.DataFrame({"x": [1.0, 2.0]}))
    return ch, pages, results


def _kept(made, tmp_path: Path) -> tuple[ToyChapter, Path, Path]:
    ch, pages, results = made
    dest = tmp_path / "reference"
    reference.save(ch, MODEL, pages, results, "depthkit run 91 --model gemma3-270m --reference", dest)
    return ch, dest, results


def test_a_kept_run_holds_its_page_tables_and_provenance(made, tmp_path):
    ch, dest, results = _kept(made, tmp_path)
    folder = dest / MODEL / ch.slug
    assert (folder / "page.ipynb").is_file()
    assert (folder / "run" / "values.parquet").read_bytes() == (load_run(MODEL, ch.slug, results).path / "values.parquet").read_bytes()
    prov = json.loads((folder / "stamp.json").read_text())["provenance"]
    assert prov["command"].startswith("depthkit run 91") and prov["wall_s"] == 61.0 and prov["date"].startswith("2026-12-03")
    assert prov["commit"] and prov["cpu"] and isinstance(prov["lens_sidecars"], dict)
    (found,) = reference.find(dest, [ch])
    assert found.model == MODEL and not found.is_stale()


def test_a_run_without_results_or_page_is_refused(made, tmp_path):
    ch, pages, results = made
    with pytest.raises(BookError, match="no finished run"):
        reference.save(ch, MODEL, tmp_path / "elsewhere", results, "cmd", tmp_path / "reference")
    with pytest.raises(BookError, match="cannot be kept"):
        reference.save(ch, MODEL, pages, tmp_path / "no-results", "cmd", tmp_path / "reference")
    assert not (tmp_path / "reference").exists()


def test_a_changed_notebook_or_code_makes_the_run_stale(made, tmp_path):
    ch, dest, _ = _kept(made, tmp_path)
    (ref,) = reference.find(dest, [ch])
    assert ref.is_stale("another fingerprint")
    assert "has not changed" in reference.box(ref, False)
    stale = reference.box(ref, True)
    assert "has changed since" in stale and "depthkit run 91 --model gemma3-270m --reference" in stale
    ch.notebook.write_text(ch.notebook.read_text().replace("x = n", "x = n + 1"))
    assert reference.find(dest, [ch])[0].is_stale()


def test_install_adds_pages_and_results_but_never_replaces_a_users_own_run(made, tmp_path):
    ch, dest, _ = _kept(made, tmp_path)
    refs = reference.find(dest, [ch])
    book_pages_dir, results = tmp_path / "book" / "chapters", tmp_path / "build-results"
    said: list[str] = []
    parts = reference.install(refs, book_pages_dir, results, skip_model="smollm2-135m", echo=said.append)
    assert parts == {MODEL: [f"{MODEL}/{ch.slug}"]}
    page = nbformat.read(book_pages_dir / MODEL / f"{ch.slug}.ipynb", as_version=4)
    boxes = [c.source for c in page.cells if reference.BOX_TAG in c.metadata.get("tags", [])]
    assert len(boxes) == 1 and "reference run" in boxes[0]
    assert load_run(MODEL, ch.slug, results).tables["values"]["x"].tolist() == [1.0, 2.0]
    assert reference.install(refs, book_pages_dir, results, skip_model=MODEL) == {}  # the model this build runs

    # The user's own run of the same model and chapter wins, and the build says so.
    own = tmp_path / "own-results"
    with RunRecorder(ch.slug, {"name": MODEL}, {"n": 9}, 0, root=own) as rec:
        rec.table("values", pd.DataFrame({"x": [7.0]}))
    reference.install(refs, book_pages_dir, own, skip_model="smollm2-135m", echo=said.append)
    assert load_run(MODEL, ch.slug, own).tables["values"]["x"].tolist() == [7.0]
    assert any("your own saved run" in s for s in said)


def test_the_build_toc_gets_a_part_per_reference_model(tmp_path):
    root = Path(__file__).resolve().parent.parent
    out = book_site.write_build_toc(root, ["01_guess_then_refine"], tmp_path / "toc.yml", {MODEL: [f"{MODEL}/01_guess_then_refine"]})
    parts = yaml.safe_load(out.read_text())["parts"]
    captions = [p["caption"] for p in parts]
    assert captions.index(f"Reference runs: {MODEL}") == captions.index("Chapters") + 1
    assert parts[captions.index(f"Reference runs: {MODEL}")]["chapters"] == [{"file": f"book/chapters/{MODEL}/01_guess_then_refine"}]


def test_a_robustness_run_is_kept_and_installed_where_the_verdicts_read_it(made, tmp_path):
    from depthkit.verdicts import ROBUSTNESS_DIR, robustness_roots

    ch, pages, results = made
    dest = tmp_path / "reference"
    kept = reference.save(ch, MODEL, pages, results, "depthkit run 91 --variant logit -p lens=logit", dest, variant="logit")
    assert kept == dest / ROBUSTNESS_DIR / "logit" / MODEL / ch.slug
    (ref,) = reference.find(dest, [ch])
    assert ref.variant == "logit" and "--variant logit" in reference.box(ref, True)
    build = tmp_path / "build-results"
    parts = reference.install([ref], tmp_path / "pages-out", build, skip_model=MODEL)
    assert parts == {}  # no page of its own, even for the model this build runs
    assert robustness_roots(build) == [build / ROBUSTNESS_DIR / "logit"]
    assert load_run(MODEL, ch.slug, build / ROBUSTNESS_DIR / "logit").manifest["status"] == "complete"


def test_the_reference_command_says_what_to_do_when_nothing_is_kept(monkeypatch, capsys):
    from depthkit import cli

    monkeypatch.setattr(reference, "find", lambda *a, **k: [])
    assert cli.main(["reference", "--variant", "logit"]) == 1
    assert "depthkit run NN --model NAME --reference" in capsys.readouterr().err
    # with no --model and no --variant: every kept run (none here), not a crash
    assert cli.main(["reference", "--stale-only"]) == 1
    assert "depthkit run NN --model NAME --reference" in capsys.readouterr().err
    assert cli.main(["run", "07", "--reference"]) == 1  # chapter 07 is rebuilt by every book, never kept
    assert "rebuilt by every book" in capsys.readouterr().err
