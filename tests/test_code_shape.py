"""The shape of depthkit's code: modules a reader can hold in mind, functions that fit
on a screen, and a runnable example for every public function of the package face
(each executed here as a doctest)."""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
from pathlib import Path

import pytest

import depthkit as dk

PKG = Path(dk.__file__).resolve().parent
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# A longer function says why on the line above its ``def`` (or its decorators).
REASON = "# long:"


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def long_functions(path: Path) -> list[tuple[str, int]]:
    """Functions over the limit in ``path`` that give no reason, as (name, lines)."""
    lines = path.read_text().splitlines()
    out = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            above = lines[first - 2].strip() if first >= 2 else ""
            if length > MAX_FUNCTION_LINES and not above.startswith(REASON):
                out.append((node.name, length))
    return out


def test_no_module_is_over_the_limit():
    big = {p.relative_to(PKG).as_posix(): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them by idea): {big}"


def test_every_long_function_says_why():
    found = {p.relative_to(PKG).as_posix(): long for p in _modules() if (long := long_functions(p))}
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines without a '{REASON} ...' comment above them: {found}"


def test_the_shape_checks_bite(tmp_path: Path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "m.py"
    path.write_text(f"def short():\n    return 1\n\n\ndef sprawling():\n{body}\n")
    assert long_functions(path) == [("sprawling", MAX_FUNCTION_LINES + 1)]
    path.write_text(f"{REASON} one pass over the batch, kept whole for speed\ndef sprawling():\n{body}\n")
    assert long_functions(path) == []


FACE_FUNCTIONS = sorted(n for n in dk.__all__ if inspect.isfunction(getattr(dk, n)))


@pytest.mark.parametrize("name", FACE_FUNCTIONS)
def test_every_public_function_of_the_face_has_an_example(name: str):
    assert ">>>" in (inspect.getdoc(getattr(dk, name)) or ""), f"dk.{name} needs a short runnable example in its docstring"


def _module_names() -> list[str]:
    out = []
    for p in _modules():
        if ">>>" not in p.read_text():
            continue
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


@pytest.mark.parametrize("module", _module_names())
def test_docstring_examples_run(module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Examples that save something write into a scratch cache and results folder.
    monkeypatch.setenv("DEPTHKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    mod = importlib.import_module(module)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(mod, module) if t.examples and (t.filename or "").endswith(".py")]
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {module} failed (see the output above)"
