"""The book runner: parameters, skip-if-unchanged stamps, failure messages,
atomic writes, cleaning of executed notebooks, the build toc and the CLI.
Uses tiny throwaway notebooks, never the real chapters."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
import yaml
from conftest import ToyChapter, toy_notebook

from depthkit import cli, plots
from depthkit.book import pages as book_pages
from depthkit.book import runner as book
from depthkit.book import site as book_site
from depthkit.chapters import CHAPTERS

REPO = Path(__file__).resolve().parent.parent


def _notebook(path: Path, body: str = "result = n * 2\nprint(result)") -> Path:
    return toy_notebook(path, "model = 'none'\nresults_root = None\nn = 1\nfail = False", [("md", "# Tiny"), ("code", body)])


@pytest.fixture
def chapter(tmp_path: Path) -> ToyChapter:
    return ToyChapter("90", "90_tiny", "Tiny chapter", _notebook(tmp_path / "90_tiny.ipynb"), smoke={"n": 2})


# --------------------------------------------------------------------------- parameters


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("n_prompts=200", ("n_prompts", 200)),
        ("lens=logit", ("lens", "logit")),
        ("tau=0.5", ("tau", 0.5)),
        ("ks=[1, 10, 100]", ("ks", [1, 10, 100])),
        ("names=[a, b]", ("names", ["a", "b"])),
        ("flag=true", ("flag", True)),
        ("x=null", ("x", None)),
        ("model=EleutherAI/pythia-6.9b-deduped", ("model", "EleutherAI/pythia-6.9b-deduped")),
        ("text=a=b", ("text", "a=b")),
        ("s='200'", ("s", "200")),
        ("empty=", ("empty", "")),
    ],
)
def test_parse_param_reads_yaml_values(text: str, expected: tuple[str, Any]) -> None:
    assert book.parse_param(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("n_prompts", "key=value"),
        ("=3", "key=value"),
        ("n-prompts=3", "identifier"),
        ("x={a: 1}", "mapping"),
        ("x=[1, 2", "not valid YAML"),
    ],
)
def test_parse_param_rejects_bad_input(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        book.parse_param(text)


def test_chapter_params_order_shared_then_smoke_then_overrides(chapter: ToyChapter, tmp_path: Path) -> None:
    full = book.chapter_params(chapter, "smollm2-135m", tmp_path / "res")
    assert full == {"model": "smollm2-135m", "results_root": str((tmp_path / "res").resolve())}
    smoke = book.chapter_params(chapter, "m", Path("relative/res"), smoke=True, extra={"model": "other", "k": 3})
    assert smoke["n"] == 2 and smoke["model"] == "other" and smoke["k"] == 3
    assert Path(smoke["results_root"]).is_absolute()


# --------------------------------------------------------------------------- stamps


def test_run_hash_changes_with_notebook_params_and_code(chapter: ToyChapter) -> None:
    base = book.run_hash(chapter.notebook, {"n": 1}, "code-a")
    assert base == book.run_hash(chapter.notebook, {"n": 1}, "code-a")
    assert base != book.run_hash(chapter.notebook, {"n": 2}, "code-a")
    assert base != book.run_hash(chapter.notebook, {"n": 1}, "code-b")
    # key order of the parameters does not matter
    assert book.run_hash(chapter.notebook, {"a": 1, "b": 2}, "c") == book.run_hash(chapter.notebook, {"b": 2, "a": 1}, "c")
    _notebook(chapter.notebook, body="result = n * 3")
    assert base != book.run_hash(chapter.notebook, {"n": 1}, "code-a")


def test_source_fingerprint_is_stable_and_leaves_out_only_other_chapters_code() -> None:
    from depthkit.book import stamps

    assert stamps.source_fingerprint() == stamps.source_fingerprint()
    assert len({stamps.source_fingerprint(), stamps.source_fingerprint("02"), stamps.source_fingerprint("03")}) == 3
    mine = ("chapters/ch03_fact_recall.py", "stats.py", "chapters/__init__.py", "datafiles/facts.jsonl")
    assert not any(stamps._other_chapters(rel, "03") for rel in mine)
    assert all(stamps._other_chapters(rel, "03") for rel in ("chapters/ch02_mcq_collection_vs_reasoning.py", "verdicts/__init__.py"))
    assert not any(stamps._other_chapters(rel, None) for rel in ("chapters/ch02_mcq_collection_vs_reasoning.py", "verdicts/__init__.py"))


@pytest.mark.parametrize(("seconds", "text"), [(3.21, "3.2 s"), (119.94, "119.9 s"), (359.6, "6 min 0 s"), (754, "12 min 34 s")])
def test_duration_format(seconds: float, text: str) -> None:
    assert book_pages.duration(seconds) == text


def test_is_current_needs_matching_stamp_and_notebook(tmp_path: Path) -> None:
    executed, stamp, _ = book.output_paths(tmp_path, "90_tiny")
    assert not book.is_current(tmp_path, "90_tiny", "h1")
    stamp.write_text(json.dumps({"hash": "h1"}))
    assert not book.is_current(tmp_path, "90_tiny", "h1")  # no executed notebook
    executed.write_text("{}")
    assert book.is_current(tmp_path, "90_tiny", "h1")
    assert not book.is_current(tmp_path, "90_tiny", "h2")
    stamp.write_text("{not json")
    assert not book.is_current(tmp_path, "90_tiny", "h1")


def test_unchanged_chapter_is_not_executed_again(chapter: ToyChapter, tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    first = book.execute_chapter(chapter, {"model": "m", "n": 5}, out, work_dir=work)
    assert first.status == "ran" and first.elapsed_s > 0
    nb = nbformat.read(first.notebook, as_version=4)
    assert "10" in "".join(o.get("text", "") for o in nb.cells[-1].outputs)  # n=5 was injected
    stamp = json.loads(book.output_paths(out, chapter.slug)[1].read_text())
    assert stamp["params"] == {"model": "m", "n": 5} and stamp["chapter"] == "90"
    assert not book.output_paths(out, chapter.slug)[2].exists()  # partial removed

    assert book.execute_chapter(chapter, {"model": "m", "n": 5}, out, work_dir=work).status == "unchanged"
    assert book.execute_chapter(chapter, {"model": "m", "n": 5}, out, work_dir=work, force=True).status == "ran"
    assert book.execute_chapter(chapter, {"model": "m", "n": 6}, out, work_dir=work).status == "ran"
    _notebook(chapter.notebook, body="result = n + 1")
    assert book.execute_chapter(chapter, {"model": "m", "n": 6}, out, work_dir=work).status == "ran"
    # the kernelspec of the source survives papermill's own kernel choice
    assert nbformat.read(first.notebook, as_version=4).metadata["kernelspec"]["name"] == "python3"


# --------------------------------------------------------------------------- failures and atomicity


def test_failing_chapter_reports_cell_error_and_partial_path(chapter: ToyChapter, tmp_path: Path) -> None:
    _notebook(chapter.notebook, body="if fail:\n    raise ValueError(f'n must be small, got {n}')")
    out = tmp_path / "out"
    ok = book.execute_chapter(chapter, {"n": 1}, out, work_dir=tmp_path / "work")
    before = ok.notebook.read_text()
    with pytest.raises(book.ChapterFailed) as info:
        book.execute_chapter(chapter, {"n": 7, "fail": True}, out, work_dir=tmp_path / "work")
    err = info.value
    assert err.ename == "ValueError" and err.evalue == "n must be small, got 7"
    message = str(err)
    assert message.splitlines()[0] == "Chapter 90 (Tiny chapter) failed in cell [3]: ValueError: n must be small, got 7"
    assert "Traceback" not in message and len(message.splitlines()) == 2
    assert str(err.partial) in message and err.partial.name == "90_tiny.partial.ipynb" and err.partial.is_file()
    # the last complete run and its stamp are untouched, and still describe each other
    assert ok.notebook.read_text() == before
    stamp = json.loads(book.output_paths(out, chapter.slug)[1].read_text())
    assert stamp["params"] == {"n": 1}


def test_interrupted_run_leaves_nothing_that_looks_complete(
    chapter: ToyChapter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import papermill

    def killed(input_path: str, output_path: str, **kwargs: Any) -> None:
        Path(output_path).write_text(Path(input_path).read_text())  # papermill's progressive save
        raise KeyboardInterrupt

    monkeypatch.setattr(papermill, "execute_notebook", killed)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        book.execute_chapter(chapter, {"n": 1}, out, work_dir=tmp_path / "work")
    executed, stamp, partial = book.output_paths(out, chapter.slug)
    assert partial.is_file() and not executed.exists() and not stamp.exists()
    assert [p.name for p in out.iterdir()] == [partial.name]


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path: Path) -> None:
    from depthkit.core.files import atomic_write

    target = tmp_path / "x.json"
    target.write_text("old")
    atomic_write(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_atomic_dir_replaces_the_folder_or_leaves_it_as_it_was(tmp_path: Path) -> None:
    from depthkit.core.files import atomic_dir

    target = tmp_path / "copy"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "half.txt").write_text("half")
        raise RuntimeError("crash mid-write")
    assert [p.name for p in tmp_path.iterdir()] == ["copy"] and [p.name for p in target.iterdir()] == ["old.txt"]
    with atomic_dir(target) as tmp:
        (tmp / "new.txt").write_text("new")
    assert [p.name for p in tmp_path.iterdir()] == ["copy"] and [p.name for p in target.iterdir()] == ["new.txt"]


def test_failure_in_cli_is_one_short_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "00", "-p", "no_equals_sign"]) == 1
    err = capsys.readouterr().err
    assert "key=value" in err and "Traceback" not in err
    assert cli.main(["run", "99"]) == 1
    assert "No chapter '99'" in capsys.readouterr().err
    assert cli.main(["run", "01", "--root", "/no/such/folder"]) == 1
    assert "--root /no/such/folder: no such folder" in capsys.readouterr().err


def test_cli_list_shows_every_chapter(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(CHAPTERS)


# --------------------------------------------------------------------------- executed notebooks for the book


def test_clean_executed_drops_bundle_widget_state_and_progress_bars() -> None:
    widget = {"application/vnd.jupyter.widget-view+json": {"model_id": "abc", "version_major": 2}}
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"abc": {}}}}
    nb.metadata["kernelspec"] = {"name": "depthkit-python"}
    cell = nbformat.v4.new_code_cell("...")
    cell.outputs = [
        nbformat.v4.new_output("display_data", data={"text/html": "<script>...</script>"}, metadata={plots.BUNDLE_MARK: True}),
        nbformat.v4.new_output("display_data", data={**widget, "text/plain": "  0%|          | 0/3 [00:00<?, ?it/s]"}),
        nbformat.v4.new_output("display_data", data={**widget, "text/plain": "VBox(children=(Text(value='')))"}),
        nbformat.v4.new_output("display_data", data={"text/html": "<div class='depthkit-chart'></div>"}),
        nbformat.v4.new_output("stream", name="stdout", text="hello\n"),
    ]
    nb.cells = [cell]
    out = book.clean_executed(nb, {"name": "python3", "display_name": "Python 3", "language": "python"})
    assert "widgets" not in out.metadata and out.metadata["kernelspec"]["name"] == "python3"
    outputs = out.cells[0].outputs
    assert len(outputs) == 3
    assert outputs[0]["data"]["text/plain"] == book.WIDGET_NOTE
    assert "application/vnd.jupyter.widget-view+json" not in outputs[0]["data"]
    assert "depthkit-chart" in outputs[1]["data"]["text/html"]
    assert outputs[2]["text"] == "hello\n"
    nbformat.validate(out)
    injected = nbformat.v4.new_code_cell('results_root = "/tmp/x"', metadata={"tags": ["injected-parameters"]})
    nb.cells = [injected]
    assert book.clean_executed(nb, None).cells[0].metadata["tags"] == ["injected-parameters", "remove-cell"]


# --------------------------------------------------------------------------- table of contents


def test_repository_toc_lists_every_chapter_in_registry_order() -> None:
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    files = [e["file"] for part in toc["parts"] for e in part["chapters"]]
    chapters = [f.removeprefix("book/chapters/") for f in files if f.startswith("book/chapters/")]
    assert chapters == [c.slug for c in CHAPTERS.values()]
    for f in [toc["root"], *files]:
        if not f.startswith("book/chapters/"):
            assert (REPO / f"{f}.md").is_file(), f


def test_build_toc_keeps_order_and_drops_empty_part(tmp_path: Path) -> None:
    (tmp_path / "_toc.yml").write_text((REPO / "_toc.yml").read_text())
    toc = yaml.safe_load(
        book_site.write_build_toc(tmp_path, ["03_fact_recall", "01_guess_then_refine"], tmp_path / "b.yml").read_text()
    )
    chapters = next(p for p in toc["parts"] if p["caption"] == "Chapters")["chapters"]
    assert chapters == [{"file": "book/chapters/03_fact_recall"}, {"file": "book/chapters/01_guess_then_refine"}]
    assert toc["root"] == "book/intro"
    empty = yaml.safe_load(book_site.write_build_toc(tmp_path, [], tmp_path / "c.yml").read_text())
    assert "Chapters" not in [p["caption"] for p in empty["parts"]]
    assert any(e["file"] == "book/own_model" for p in empty["parts"] for e in p["chapters"])


# --------------------------------------------------------------------------- plots


def test_chart_html_is_script_safe_and_waits_for_bundle() -> None:
    spec = {"data": {"values": [{"token": "</script><b>"}]}, "mark": "bar"}
    html = plots.chart_html(spec)
    assert html.count("</script>") == 1  # only the snippet's own closing tag
    assert "<\\/script><b>" in html
    assert "window.vegaEmbed" in html and "__depthkitCharts" in html
    assert plots.chart_html(spec) != html  # each chart gets its own element id


def test_enable_makes_altair_use_the_offline_renderer() -> None:
    import altair as alt

    plots.enable(show_bundle=False)
    assert alt.renderers.active == plots.RENDERER
    chart = alt.Chart(alt.Data(values=[{"a": 1}])).mark_point().encode(x="a:Q", tooltip=["a:Q"])
    bundle = chart._repr_mimebundle_()
    bundle = bundle[0] if isinstance(bundle, tuple) else bundle
    assert set(bundle) == {"text/html", "text/plain"}
    assert 'class="depthkit-chart"' in bundle["text/html"] and "cdn" not in bundle["text/html"].lower()


def test_bundle_carries_the_three_libraries_in_its_own_scope() -> None:
    code = plots.bundle_path().read_text()
    assert code.startswith("(function () {") and code.rstrip().endswith("})();")
    # the snippet comes out minified; the browser test checks that it works
    for name in ("window.vegaEmbed=", "window.vegaLite=", "window.vega=", "window.__depthkitCharts="):
        assert name in code
    assert "</script" not in code


# --------------------------------------------------------------------------- measured runs: stamps, box, run table


def test_the_tether_measures_the_child_it_ran(tmp_path: Path) -> None:
    import subprocess
    import sys

    from depthkit.book import tether

    out = tmp_path / "peak.json"
    grow = "x = bytearray(300_000_000); x[::4096] = b'1' * len(x[::4096])"  # touch every page: resident
    cmd = [sys.executable, str(tether.SCRIPT), "--usage", str(out), "--", sys.executable, "-c", grow + "; raise SystemExit(3)"]
    proc = subprocess.run(cmd)
    assert proc.returncode == 3  # the child's exit status is passed on
    usage = json.loads(out.read_text())
    assert 300 < usage["peak_rss_mb"] < 600 and 0 < usage["cpu_s"] < 30
    assert tether.peak_mb(1000, "linux") == 1.0 and tether.peak_mb(2_000_000, "darwin") == 2.0


def _tethered_sleeper(tmp_path: Path) -> tuple[Any, int, int]:
    """A parent (started here) that starts a tethered sleeper and then sleeps too:
    (parent process, tether pid, sleeper pid)."""
    import subprocess
    import sys

    from depthkit.book import tether

    pids = tmp_path / "pids"
    # The sleeper starts a grandchild of its own: the tether must stop the whole group.
    sleeper = f"import os, subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{g.pid}}'); time.sleep(600)"
    parent_code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, {str(tether.SCRIPT)!r}, '--', sys.executable, '-c', {sleeper!r}]); time.sleep(600)"
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    deadline = time.monotonic() + 30
    while not (pids.is_file() and pids.read_text().count(" ") == 1) and time.monotonic() < deadline:
        time.sleep(0.1)
    child, grandchild = (int(x) for x in pids.read_text().split())
    return parent, child, grandchild


def _gone(pids: list[int], timeout: float) -> bool:
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.1)
    return False


def test_a_tethered_command_and_its_children_stop_when_the_parent_is_killed(tmp_path: Path) -> None:
    import signal

    parent, child, grandchild = _tethered_sleeper(tmp_path)
    try:
        assert not _gone([child, grandchild], 1.0)  # alive while the parent lives
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _gone([child, grandchild], 6.0)  # poll interval + SIGTERM's grace, with room
    finally:
        for pid in (child, grandchild):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_tether_passes_a_stop_signal_on_to_its_command(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from depthkit.book import tether

    code = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(7)); print('ready', flush=True); time.sleep(60)"
    proc = subprocess.Popen(
        [sys.executable, str(tether.SCRIPT), "--", sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 7  # the command handled it and its exit status came back


def test_a_run_records_time_and_peak_memory_and_its_page_opens_with_them(chapter: ToyChapter, tmp_path: Path) -> None:
    import os

    from depthkit.book import pages as book_pages

    out, work = tmp_path / "out", tmp_path / "work"
    first = book.execute_chapter(chapter, {"model": "m", "n": 5}, out, work_dir=work)
    stamp = json.loads(book.output_paths(out, chapter.slug)[1].read_text())
    assert stamp["elapsed_s"] > 0 and stamp["cpus"] == os.cpu_count() and 0 < stamp["cpu_s"] < 120
    assert 30 < stamp["peak_rss_mb"] < 2000  # an IPython kernel: tens to hundreds of MB
    assert not list(work.glob("*.peak.json"))
    nb = nbformat.read(first.notebook, as_version=4)
    assert nb.cells[0].source == "# Tiny"
    box = nb.cells[1]
    assert book_pages.BOX_TAG in box.metadata["tags"] and box.source.startswith(":::{admonition}")
    assert book_pages.memory(stamp["peak_rss_mb"]) in box.source and book_pages.duration(stamp["elapsed_s"]) in box.source
    assert f"({book_pages.duration(stamp['cpu_s'])} of CPU time)" in box.source
    assert "`n = 5`\\*" in box.source and '`model = "m"`' in box.source  # n differs from the notebook's 1
    assert str(tmp_path) not in box.source
    # A warm rebuild reuses the notebook, and with it the box of the run that made it.
    before = first.notebook.read_bytes()
    assert book.execute_chapter(chapter, {"model": "m", "n": 5}, out, work_dir=work).status == "unchanged"
    assert first.notebook.read_bytes() == before


def test_insert_run_box_splits_the_title_and_replaces_an_old_box() -> None:
    from depthkit.book import pages as book_pages

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Title\n\nIntro prose."), nbformat.v4.new_code_cell("x = 1")]
    book_pages.insert_run_box(nb, "box one")
    book_pages.insert_run_box(nb, "box two")
    assert [c.source for c in nb.cells] == ["# Title", "box two", "Intro prose.", "x = 1"]
    nbformat.validate(nb)


def test_run_table_from_stamps(chapter: ToyChapter) -> None:
    from depthkit.book import pages as book_pages

    other = ToyChapter("91", "91_other", "Other", chapter.notebook)
    stamp = {"params": {"model": "m", "n": 3}, "elapsed_s": 754, "cpu_s": 1200.4, "peak_rss_mb": 3210.0, "cpus": 2}
    text = book_pages.run_table([(chapter, stamp), (other, None)])
    assert "| 90 Tiny chapter | `m` | 12 min 34 s | 20 min 0 s | 3.2 GB | `n=3` |" in text
    assert "| 91 Other | — | not executed in this build |" in text
    assert "2 CPU cores" in text


# --------------------------------------------------------------------------- where a kernel's time goes


def test_time_shares_classify_stacks() -> None:
    from depthkit.book.time_shares import classify

    cell, pkg, nn = "/tmp/ipykernel_7/123.py", "/x/depthkit", "/v/site-packages/torch/nn/modules/module.py"
    inner_first = lambda *frames: [*frames, (cell, "<module>"), ("/v/ipykernel/kernelbase.py", "run")]  # noqa: E731
    assert classify([("/v/zmq/poll.py", "poll"), ("/v/ipykernel/kernelbase.py", "run")]) is None  # idle kernel
    assert classify(inner_first(("/v/numpy/core.py", "mean"), (f"{pkg}/stats/__init__.py", "bootstrap_ci"))) == "statistics"
    forward = [(nn, "_call_impl"), ("/v/transformer_lens/model.py", "forward"), (f"{pkg}/engine/capture.py", "_run"),
               (f"{pkg}/lens/trajectories.py", "trajectories")]
    assert classify(inner_first(*forward)) == "model forward"
    # A lens readout inside a forward hook is the readout, not the forward around it.
    assert classify(inner_first((nn, "_call_impl"), (f"{pkg}/lens/base.py", "readout"), (f"{pkg}/engine/capture.py", "grab"), *forward)) == "lens readout"
    assert classify(inner_first((f"{pkg}/lens/trajectories.py", "decode_residuals"))) == "lens readout"
    assert classify(inner_first((f"{pkg}/lens/decode.py", "_decode_chunk"), (f"{pkg}/lens/trajectories.py", "_read_batches"))) == "lens readout"
    assert classify(inner_first(*forward, (f"{pkg}/lens/training.py", "train_tuned_lens"))) == "lens training"
    # Training split over modules is training in each of them, wherever it is called from.
    for module, function in (("training_steps", "kl_gradients"), ("training_metrics", "heldout_metrics")):
        assert classify(inner_first((nn, "_call_impl"), (f"{pkg}/lens/base.py", "readout"), (f"{pkg}/lens/{module}.py", function))) == "lens training"
    # Tokenising prompts is not a readout (the tokenizer counts as the model's library).
    assert classify(inner_first(("/v/transformers/tokenization_utils_base.py", "__call__"), (f"{pkg}/lens/prompts.py", "encode"),
                                (f"{pkg}/lens/compare.py", "compare_lenses"))) == "model forward"  # fmt: skip
    assert classify(inner_first(("/v/pandas/frame.py", "merge"), (f"{pkg}/analyses/summaries.py", "onset_layers"))) == "other"
    assert classify(inner_first(("/v/altair/api.py", "to_dict"))) == "other"
    assert classify(inner_first((f"{pkg}/lens/base.py", "<module>"), ("<frozen importlib._bootstrap>", "_load"))) == "other"


def test_a_chapter_stamp_says_where_its_time_went(tmp_path: Path) -> None:
    body = ("import time, numpy as np\nfrom depthkit import stats\nt = time.time()\n"
            "while time.time() - t < 1.5:\n    stats.bootstrap_ci(np.arange(2000.0), n_boot=200)\n")
    ch = ToyChapter("91", "91_busy", "Busy chapter", _notebook(tmp_path / "91_busy.ipynb", body=body))
    out = tmp_path / "out"
    book.execute_chapter(ch, {"model": "m", "n": 1}, out, work_dir=tmp_path / "work")
    shares = json.loads(book.output_paths(out, ch.slug)[1].read_text())["time_s"]
    assert set(shares) == {"model forward", "lens readout", "lens training", "statistics", "other"}
    # The loop runs 1.5 s of bootstraps; importing depthkit in the cell is "other".
    assert 1.2 < shares["statistics"] < 2.0 and shares["other"] > 0
    assert shares["model forward"] == shares["lens readout"] == 0
