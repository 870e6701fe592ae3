"""Chapter parameter specs: one spec per chapter, held equal to the notebooks,
checked before anything runs, with re-run hints that are commands that parse."""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import toy_notebook

from depthkit import cli
from depthkit.book import runner as book
from depthkit.chapters import (
    CHAPTERS,
    MCQ_TASKS,
    UPDATE_STATS,
    UPOS_TAGS,
    Chapter,
    available_chapters,
    chapter,
    check_chapter_params,
    notebook_defaults,
    validate_run,
)
from depthkit.core.params import ParameterError, check_params

NOTEBOOKS = available_chapters()


def test_choice_lists_match_the_analysis_modules():
    from depthkit.analyses import mcq, part_of_speech, residual

    assert MCQ_TASKS == mcq.TASKS
    assert set(UPOS_TAGS) == set(part_of_speech.UPOS)
    assert UPDATE_STATS == residual.UPDATE_STATS


@pytest.mark.parametrize("ch", NOTEBOOKS, ids=[c.slug for c in NOTEBOOKS])
def test_notebook_parameters_are_the_spec_and_the_defaults_are_valid(ch: Chapter):
    defaults = notebook_defaults(ch)
    assert list(defaults) == list(ch.params), ch.slug
    # papermill must read every line too (it skips, with a warning, a line it cannot parse,
    # e.g. one whose comment holds an equals sign): otherwise `-p` would not reach it
    import nbformat
    from papermill.translators import PythonTranslator

    cell = next(c for c in nbformat.read(ch.notebook, 4).cells if "parameters" in c.metadata.get("tags", []))
    assert [q.name for q in PythonTranslator.inspect(cell)] == list(ch.params), ch.slug
    checked = check_chapter_params(ch.id, defaults)
    assert list(checked) == list(ch.params)  # every parameter, in spec order
    assert validate_run(ch, {}) == {}
    for key in ch.smoke:
        assert key in ch.params, f"{ch.slug}: smoke parameter {key} is not in the spec"
    assert validate_run(ch, ch.smoke) == ch.smoke


def _bad_inputs(ch: Chapter) -> list[dict[str, Any]]:
    """One wrong value of every parameter that can be wrong, and a typo'd name."""
    out: list[dict[str, Any]] = [{ch_param + "x": 1} for ch_param in list(ch.params)[:3]]
    for name, param in ch.params.items():
        if param.type is int:
            out += [{name: "many"}, {name: -10**9}, {name: 2.5}]
        elif param.type is float:
            out += [{name: "many"}, {name: -1e9}]
        elif param.type is list:
            out += [{name: 5}]
            if param.choices:
                out += [{name: ["nonsense"]}]
        elif param.choices:
            out += [{name: str(param.choices[0])[:-1] or "zz"}]
        elif param.type is str and not param.optional:
            out += [{name: None}]
    return out


HINT = re.compile(r"`(depthkit run [^`]+)`")


@pytest.mark.parametrize("ch", NOTEBOOKS, ids=[c.slug for c in NOTEBOOKS])
def test_every_hint_in_an_error_is_a_command_that_parses_and_passes(ch: Chapter):
    hints = 0
    for bad in _bad_inputs(ch):
        with pytest.raises(ParameterError) as err:
            validate_run(ch, bad)
        message = str(err.value)
        assert next(iter(bad)) in message
        for command in HINT.findall(message):
            argv = shlex.split(command)
            assert argv[:2] == ["depthkit", "run"]
            args = cli._parser().parse_args(argv[1:])
            assert chapter(args.chapter) is ch
            extra = book.parse_params(args.param or [])
            # Each suggested value is valid (whether it suits the other values is
            # the cross-parameter checks' business, tested below).
            check_params(extra, **{k: ch.params[k] for k in extra})
            hints += 1
    assert hints >= len(_bad_inputs(ch)) // 2


def test_cross_parameter_checks():
    with pytest.raises(ParameterError, match="patching needs two tasks") as err:
        validate_run(chapter("02"), {"patch_source": "mmlu", "patch_target": "mmlu"})
    validate_run(chapter("02"), book.parse_params(shlex.split(HINT.search(str(err.value)).group(1))[4::2]))
    with pytest.raises(ParameterError, match="including 1"):
        validate_run(chapter("03"), {"k_grid": [10, 100]})
    # A user's MCQ file is a patching task under its file's name, and only then.
    mine = {"dataset": "data/my_quiz.jsonl", "patch_source": "my_quiz"}
    validate_run(chapter("02"), mine)
    with pytest.raises(ParameterError, match="'my_quiz' \\(your dataset\\)"):
        validate_run(chapter("02"), {**mine, "patch_target": "my_quizz"})
    with pytest.raises(ParameterError, match="patch_source='my_quiz' is not a task.*-p dataset=PATH"):
        validate_run(chapter("02"), {"patch_source": "my_quiz"})
    with pytest.raises(ParameterError, match="did you mean 'mmlu'"):
        validate_run(chapter("02"), {"patch_target": "mmluu"})


def test_a_typo_from_the_command_line_fails_in_seconds_and_touches_nothing(tmp_path, capsys):
    (tmp_path / "book" / "chapters").mkdir(parents=True)
    page = tmp_path / "book" / "chapters" / "04_pos_onset.ipynb"
    page.write_text("an earlier run")
    start = time.perf_counter()
    code = cli.main(["run", "04", "-p", "n_per_tagg=5", "--root", str(tmp_path), "--results", str(tmp_path / "r")])
    assert code == 1 and time.perf_counter() - start < 10
    err = capsys.readouterr().err
    assert "Did you mean 'n_per_tag'?" in err and "depthkit run 04 -p n_per_tag=5" in err and "Traceback" not in err
    assert page.read_text() == "an earlier run"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["04_pos_onset.ipynb", "book", "chapters"]


def test_a_typo_from_python_raises_before_anything_runs(tmp_path):
    with pytest.raises(ParameterError, match="n_per_tag"):
        book.run_chapter("04", n_per_tagg=5, root=tmp_path, results_root=tmp_path / "r")
    with pytest.raises(ParameterError, match="dtype"):
        book.run_chapter("01", dtype="float64", root=tmp_path, results_root=tmp_path / "r")
    assert list(tmp_path.iterdir()) == []


def test_placement_options_reach_model_chapters_only(tmp_path):
    args = ["--dtype", "bfloat16", "--device", "cpu", "--device-map", "auto"]
    ns = cli._parser().parse_args(["run", "01", *args])
    placement = cli._placement(ns)
    assert placement == {"dtype": "bfloat16", "device": "cpu", "device_map": "auto"}
    p01 = book.chapter_params(chapter("01"), "tiny-llama", tmp_path, extra=placement)
    assert {k: p01[k] for k in placement} == placement
    p07 = book.chapter_params(chapter("07"), "tiny-llama", tmp_path, extra=placement)
    assert set(p07) == {"results_root"}  # papermill would warn about names 07 does not take
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["run", "01", "--dtype", "float64"])


def test_a_model_option_given_twice_is_refused(capsys):
    assert cli.main(["run", "01", "--dtype", "float16", "-p", "dtype=float32"]) == 1
    assert "give it once" in capsys.readouterr().err


@dataclass
class ResultsChapter:
    id: str
    slug: str
    title: str
    notebook: Path
    smoke: dict[str, Any] = field(default_factory=dict)
    reads_results: bool = True


def test_a_chapter_reading_results_reruns_when_any_saved_result_changes(tmp_path):
    nb = toy_notebook(tmp_path / "07_toy.ipynb", "results_root = None", [("code", "x = 1")])
    ch = ResultsChapter("07", "07_toy", "Toy", nb)
    results = tmp_path / "results"
    (results / "m" / "01_x").mkdir(parents=True)
    params = {"results_root": str(results)}
    out = tmp_path / "out"
    assert book.execute_chapter(ch, params, out).status == "ran"
    assert book.execute_chapter(ch, params, out).status == "unchanged"
    (results / "m" / "01_x" / "manifest.json").write_text('{"status": "complete"}')
    assert book.execute_chapter(ch, params, out).status == "ran"
    assert book.execute_chapter(ch, params, out).status == "unchanged"
    (results / "m" / "01_x" / "manifest.json").write_text('{"status": "complete", "again": 1}')
    assert book.execute_chapter(ch, params, out).status == "ran"


def test_every_registered_chapter_has_a_spec():
    for ch in CHAPTERS.values():
        assert "results_root" in ch.params
        assert ch.takes_model == (ch.id != "07")


def test_any_budget_and_a_saved_lens_file_are_accepted_and_bad_ones_refused(tmp_path):
    ch01 = chapter("01")
    assert validate_run(ch01, {"lens_budget": "steps=3,batch_positions=16"}) == {"lens_budget": "steps=3,batch_positions=16"}
    with pytest.raises(ParameterError, match="Unknown tuned-lens config keys") as err:
        validate_run(ch01, {"lens_budget": "stepz=3"})
    hint = HINT.search(str(err.value)).group(1)
    assert validate_run(ch01, book.parse_params(shlex.split(hint)[4::2])) == {"lens_budget": "steps=200"}
    with pytest.raises(ParameterError, match="Unknown tuned-lens budget 'lots'.*steps=200"):
        validate_run(ch01, {"lens_budget": "lots"})
    with pytest.raises(ParameterError, match="key=value"):
        validate_run(ch01, {"lens_budget": "steps=3,lr"})
    with pytest.raises(ParameterError, match="no such lens file"):
        validate_run(ch01, {"lens": str(tmp_path / "mine.safetensors")})
    with pytest.raises(ParameterError, match="choose 'logit', 'tuned' or the path"):
        validate_run(ch01, {"lens": "tunde"})
    (tmp_path / "mine.safetensors").write_bytes(b"")
    assert validate_run(ch01, {"lens": str(tmp_path / "mine.safetensors")})
    assert validate_run(chapter("00"), {"bias_budget": "steps=2"}) == {"bias_budget": "steps=2"}
