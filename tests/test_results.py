"""Results: atomic runs, deterministic Parquet, verified loading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from depthkit.core.results import ResultsError, RunRecorder, list_runs, load_run, model_slug
from depthkit.engine.models import ModelInfo

INFO = ModelInfo(
    name="org/Test-Model",
    family="llama",
    n_blocks=4,
    d_model=64,
    d_vocab=320,
    n_ctx=128,
    quantisation="none",
    source="tiny",
    fingerprint="abc123",
)
CHAPTER = "01_guess_then_refine"


def frame(k: int = 0) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "layer": np.arange(5, dtype=np.int64),
            "share": np.linspace(0, 1, 5) + k,
            "bucket": ["Top 1-10", "11-100", "101-1000", "rest", "rest"],
        }
    )


def record(root, k: int = 0, chapter: str = CHAPTER, model=INFO) -> RunRecorder:
    rec = RunRecorder(chapter, model, {"n_prompts": np.int64(5), "lens": "logit", "k": k}, seed=0, root=root)
    rec.table("steps", frame(k))
    rec.table("summary", frame(k).head(2))
    rec.finish()
    return rec


def test_model_slug():
    assert model_slug("meta-llama/Llama-2-7b-hf") == "meta-llama__Llama-2-7b-hf"
    assert model_slug("a b:c?/d") == "abc__d"
    assert model_slug(INFO) == "org__Test-Model"
    assert model_slug({"name": "gpt2-xl"}) == "gpt2-xl"
    for bad in ("///..", "..", "?"):
        with pytest.raises(ResultsError, match="no usable folder name"):
            model_slug(bad)


def test_round_trip_and_manifest(tmp_path):
    rec = record(tmp_path)
    final = tmp_path / "org__Test-Model" / CHAPTER
    assert rec.final_dir == final and final.is_dir()
    assert sorted(p.name for p in final.iterdir()) == ["manifest.json", "steps.parquet", "summary.parquet"]
    assert [p.name for p in (tmp_path / "org__Test-Model").iterdir()] == [CHAPTER]  # no staging or trash left

    run = load_run("org/Test-Model", CHAPTER, root=tmp_path)
    pd.testing.assert_frame_equal(run.tables["steps"], frame(0))
    pd.testing.assert_frame_equal(run["summary"], frame(0).head(2))
    m = run.manifest
    assert m["status"] == "complete" and m["chapter"] == CHAPTER and m["seed"] == 0
    assert m["model"] == INFO.as_dict()
    assert m["params"] == {"n_prompts": 5, "lens": "logit", "k": 0}
    assert m["tables"]["steps"]["rows"] == 5 and m["tables"]["summary"]["rows"] == 2
    assert m["tables"]["steps"]["columns"] == ["layer", "share", "bucket"]
    assert set(m["versions"]) >= {"python", "torch", "transformers", "transformer-lens", "depthkit"}
    assert m["versions"]["torch"] and m["started_utc"] <= m["finished_utc"]
    import hashlib

    assert m["tables"]["steps"]["sha256"] == hashlib.sha256((final / "steps.parquet").read_bytes()).hexdigest()


def test_chapter_id_finds_the_slug_folder(tmp_path):
    record(tmp_path)
    assert load_run(INFO, "01", root=tmp_path).manifest["chapter"] == CHAPTER


def test_root_defaults_to_env(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPTHKIT_RESULTS", str(tmp_path / "env-root"))
    record(None)
    assert (tmp_path / "env-root" / "org__Test-Model" / CHAPTER / "manifest.json").is_file()
    assert len(load_run(INFO, CHAPTER).tables) == 2


def test_parquet_is_byte_identical_across_runs(tmp_path):
    record(tmp_path / "a")
    record(tmp_path / "b")
    for name in ("steps.parquet", "summary.parquet"):
        a = (tmp_path / "a" / "org__Test-Model" / CHAPTER / name).read_bytes()
        b = (tmp_path / "b" / "org__Test-Model" / CHAPTER / name).read_bytes()
        assert a == b
    ma = json.loads((tmp_path / "a" / "org__Test-Model" / CHAPTER / "manifest.json").read_text())
    mb = json.loads((tmp_path / "b" / "org__Test-Model" / CHAPTER / "manifest.json").read_text())
    assert ma["tables"] == mb["tables"]


def test_new_run_replaces_the_old_one(tmp_path):
    record(tmp_path, k=0)
    record(tmp_path, k=1)
    run = load_run(INFO, CHAPTER, root=tmp_path)
    assert run.params["k"] == 1
    pd.testing.assert_frame_equal(run.tables["steps"], frame(1))
    assert [p.name for p in (tmp_path / "org__Test-Model").iterdir()] == [CHAPTER]


def test_crash_between_table_writes_keeps_previous_run(tmp_path):
    record(tmp_path, k=0)
    # A real crash: another process writes one table, then dies before finish().
    script = textwrap.dedent(
        f"""
        import os, pandas as pd
        from depthkit.core.results import RunRecorder
        rec = RunRecorder({CHAPTER!r}, {{"name": "org/Test-Model"}}, {{"k": 9}}, 0, root={str(tmp_path)!r})
        rec.table("steps", pd.DataFrame({{"layer": [9]}}))
        os._exit(3)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    model_dir = tmp_path / "org__Test-Model"
    partial = [p for p in model_dir.iterdir() if ".partial-" in p.name]
    assert len(partial) == 1 and (partial[0] / "steps.parquet").is_file()

    run = load_run(INFO, CHAPTER, root=tmp_path)
    assert run.params["k"] == 0
    pd.testing.assert_frame_equal(run.tables["steps"], frame(0))
    assert list_runs(tmp_path)["chapter"].tolist() == [CHAPTER]

    # The next successful run removes the dead process's staging folder.
    record(tmp_path, k=2)
    assert [p.name for p in model_dir.iterdir()] == [CHAPTER]
    assert load_run(INFO, CHAPTER, root=tmp_path).params["k"] == 2


def test_exception_inside_with_discards_staging(tmp_path):
    record(tmp_path, k=0)
    with pytest.raises(RuntimeError, match="boom"):
        with RunRecorder(CHAPTER, INFO, {"k": 5}, 0, root=tmp_path) as rec:
            rec.table("steps", frame(5))
            raise RuntimeError("boom")
    assert [p.name for p in (tmp_path / "org__Test-Model").iterdir()] == [CHAPTER]
    assert load_run(INFO, CHAPTER, root=tmp_path).params["k"] == 0
    with RunRecorder(CHAPTER, INFO, {"k": 6}, 0, root=tmp_path) as rec:
        rec.table("steps", frame(6))
    assert load_run(INFO, CHAPTER, root=tmp_path).params["k"] == 6


def test_open_recorder_of_this_process_is_not_stale(tmp_path):
    other = RunRecorder(CHAPTER, INFO, {"k": 7}, 0, root=tmp_path)
    other.table("steps", frame(7))
    record(tmp_path, k=1)
    assert other.staging.is_dir()
    other.finish()
    assert load_run(INFO, CHAPTER, root=tmp_path).params["k"] == 7


def test_dropped_recorder_of_this_process_is_cleaned_up(tmp_path):
    import gc

    dropped = RunRecorder(CHAPTER, INFO, {"k": 8}, 0, root=tmp_path)  # e.g. a notebook cell re-run
    dropped.table("steps", frame(8))
    staging = dropped.staging
    del dropped
    gc.collect()
    record(tmp_path, k=1)
    assert not staging.exists()
    assert [p.name for p in (tmp_path / "org__Test-Model").iterdir()] == [CHAPTER]


def test_crash_between_the_two_renames_still_loads_previous(tmp_path, monkeypatch):
    record(tmp_path, k=0)
    rec = RunRecorder(CHAPTER, INFO, {"k": 1}, 0, root=tmp_path)
    rec.table("steps", frame(1))
    real_rename = os.rename
    calls = []

    def rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("simulated crash")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="simulated crash"):
        rec.finish()
    monkeypatch.setattr(os, "rename", real_rename)
    assert not (tmp_path / "org__Test-Model" / CHAPTER).exists()
    with pytest.warns(UserWarning, match="interrupted"):
        run = load_run(INFO, CHAPTER, root=tmp_path)
    assert run.params["k"] == 0


def test_missing_run_error(tmp_path):
    with pytest.raises(ResultsError) as e:
        load_run("smollm2-135m", "03_fact_recall", root=tmp_path)
    msg = str(e.value)
    assert "no complete run of chapter 03_fact_recall for model smollm2-135m" in msg
    assert "run `depthkit run 03_fact_recall --model smollm2-135m`" in msg


def test_damaged_manifest_error(tmp_path):
    record(tmp_path)
    manifest = tmp_path / "org__Test-Model" / CHAPTER / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])
    with pytest.raises(ResultsError, match=r"is damaged \(not valid JSON.*Re-run the chapter with `depthkit run"):
        load_run(INFO, CHAPTER, root=tmp_path)
    with pytest.warns(UserWarning, match="damaged"):
        assert list_runs(tmp_path).empty


def test_checksum_mismatch_error(tmp_path):
    record(tmp_path)
    path = tmp_path / "org__Test-Model" / CHAPTER / "steps.parquet"
    frame(3).to_parquet(path)
    with pytest.raises(ResultsError, match="does not match the checksum"):
        load_run(INFO, CHAPTER, root=tmp_path)
    path.unlink()
    with pytest.raises(ResultsError, match="is missing"):
        load_run(INFO, CHAPTER, root=tmp_path)


def test_incomplete_manifest_is_refused(tmp_path):
    record(tmp_path)
    manifest = tmp_path / "org__Test-Model" / CHAPTER / "manifest.json"
    data = json.loads(manifest.read_text())
    data["status"] = "running"
    manifest.write_text(json.dumps(data))
    with pytest.raises(ResultsError, match="not describe a complete run"):
        load_run(INFO, CHAPTER, root=tmp_path)


def test_list_runs(tmp_path):
    assert list(list_runs(tmp_path / "nothing").columns) == ["model", "chapter", "finished", "n_tables", "path"]
    record(tmp_path, chapter="02_mcq")
    record(tmp_path, chapter=CHAPTER)
    record(tmp_path, model={"name": "gpt2-xl"})
    runs = list_runs(tmp_path)
    assert runs[["model", "chapter"]].values.tolist() == [
        ["gpt2-xl", CHAPTER],
        ["org/Test-Model", CHAPTER],
        ["org/Test-Model", "02_mcq"],
    ]
    assert runs["n_tables"].tolist() == [2, 2, 2]
    assert all(os.path.isdir(p) for p in runs["path"])


def test_bad_input_errors(tmp_path):
    rec = RunRecorder(CHAPTER, INFO, {}, 0, root=tmp_path)
    with pytest.raises(ResultsError, match="safe file name"):
        rec.table("../evil", frame())
    with pytest.raises(ResultsError, match="must be a pandas DataFrame"):
        rec.table("x", [1, 2])
    with pytest.raises(ResultsError, match="one type"):
        rec.table("mixed", pd.DataFrame({"a": [1, "x"]}))
    rec.table("ok", frame())
    with pytest.raises(ResultsError, match="already recorded"):
        rec.table("ok", frame())
    rec.finish()
    with pytest.raises(ResultsError, match="already finished"):
        rec.table("late", frame())
    with pytest.raises(ResultsError, match="safe file name"):
        RunRecorder("../x", INFO, {}, 0, root=tmp_path)
    with pytest.raises(ResultsError, match="cannot be recorded"):
        RunRecorder(CHAPTER, INFO, {"f": object()}, 0, root=tmp_path)
