"""The lens front door: one function for a lens by kind, path or object, and kinds that
are one file each."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import depthkit as dk
import depthkit.lens.kinds as kinds_package
from depthkit.lens import registry
from depthkit.lens.base import LogitLens


@pytest.fixture
def fresh_registry():
    registry._kinds.cache_clear()
    yield
    registry._kinds.cache_clear()


def test_adding_a_lens_kind_is_one_new_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_registry, tiny_llama):
    (tmp_path / "halfway.py").write_text(textwrap.dedent('''
        """A toy kind: the logit lens under another name, as a user would add one."""
        from depthkit.lens.base import LogitLens
        from depthkit.lens.registry import LensKind

        class HalfwayLens(LogitLens):
            name = "halfway"

        KIND = LensKind("halfway", "a toy kind for the test", load=lambda model, **_: HalfwayLens(model))
    '''))
    monkeypatch.setattr(kinds_package, "__path__", [*kinds_package.__path__, str(tmp_path)])
    assert registry.kind_names() == ("halfway", "logit", "tuned")
    lens = dk.get_lens(tiny_llama, "halfway")
    assert type(lens).__name__ == "HalfwayLens" and isinstance(lens, LogitLens)
    # The chapters' parameter check asks the registry too: the new kind is a valid choice.
    assert dk.check_chapter_params("01", {**_defaults("01"), "model": "tiny-llama", "lens": "halfway"})["lens"] == "halfway"


def _defaults(chapter_id: str) -> dict:
    from depthkit.chapters import chapter, notebook_defaults

    return notebook_defaults(chapter(chapter_id))


def test_a_kind_file_without_a_kind_is_refused_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_registry):
    (tmp_path / "broken.py").write_text("X = 1\n")
    monkeypatch.setattr(kinds_package, "__path__", [*kinds_package.__path__, str(tmp_path)])
    with pytest.raises(TypeError, match="broken.py must define KIND"):
        registry.kind_names()


def test_one_front_door_for_names_paths_and_objects(tiny_llama, tmp_path: Path):
    lens = LogitLens(tiny_llama)
    assert dk.get_lens(tiny_llama, lens) is lens
    assert isinstance(dk.get_lens(tiny_llama, "logit"), LogitLens)
    with pytest.raises(ValueError, match="Unknown lens 'tunde'; choose 'logit', 'tuned'"):
        dk.get_lens(tiny_llama, "tunde")
    with pytest.raises(TypeError, match="kind name, a lens file path or a Lens"):
        dk.get_lens(tiny_llama, 3)
    # Engine calls never train: a tuned lens that is not saved says how to make it.
    with pytest.raises(ValueError, match="engine calls never train one"):
        dk.get_lens(tiny_llama, "tuned", budget="smoke", cache_dir=tmp_path)
    assert not list(tmp_path.rglob("*.safetensors"))
