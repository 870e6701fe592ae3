"""Exercise notebooks as book pages, and as solved notebooks.

The book's configuration leaves ``notebooks/`` out of the build, so the runner
(:func:`depthkit.book.runner.build_book`) writes one MyST Markdown page per exercise
notebook into ``book/exercises/``: the notebook's text and code as they are, and
after each stub (a code cell tagged ``exercise``) the reference solution folded in
a collapsed dropdown. Pages are plain Markdown, not executed: a stub would only
raise. The same mapping (the stub's function name → the solution of that name in
:mod:`depthkit.exercises.solutions`) fills a notebook in with its solutions
(:func:`solved`), which is how the tests run every notebook both ways.
"""

from __future__ import annotations

import ast
import copy
import inspect
from pathlib import Path
from typing import Any

from depthkit.core.files import atomic_write
from depthkit.exercises.solutions import SOLUTIONS

EXERCISE_TAG = "exercise"
REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks" / "exercises"


def exercise_notebooks(source_dir: Path = NOTEBOOKS) -> list[Path]:
    """The exercise notebooks, in chapter order (their names start with the chapter number)."""
    return sorted(Path(source_dir).glob("[0-9][0-9]_*.ipynb"))


def stub_name(source: str) -> str:
    """The name of the function a stub cell defines (its first ``def``)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            return node.name
    raise ValueError(f"An {EXERCISE_TAG!r} cell defines no function:\n{source}")


def solution_source(name: str) -> str:
    """The source of the reference solution of the stub that defines ``name``."""
    if name not in SOLUTIONS:
        raise KeyError(f"No solution named {name!r} in depthkit.exercises.solutions; have {sorted(SOLUTIONS)}.")
    return inspect.getsource(SOLUTIONS[name]).rstrip() + "\n"


def _is_exercise(cell: Any) -> bool:
    return cell.get("cell_type") == "code" and EXERCISE_TAG in cell.get("metadata", {}).get("tags", [])


def solved(nb: Any) -> Any:
    """A copy of notebook ``nb`` with every stub replaced by its solution."""
    out = copy.deepcopy(nb)
    for cell in out.cells:
        if _is_exercise(cell):
            cell.source = solution_source(stub_name(cell.source))
    return out


def _fence(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def page_markdown(nb: Any, notebook: str) -> str:
    """The book page of exercise notebook ``nb`` (found at ``notebook`` in the repository)."""
    parts: list[str] = []
    for i, cell in enumerate(nb.cells):
        source = cell.source.rstrip()
        if cell.cell_type == "markdown":
            parts.append(source)
        elif _is_exercise(cell):
            parts.append(_fence(source))
            parts.append(f":::{{dropdown}} Solution\n{_fence(solution_source(stub_name(source)))}\n:::")
        elif cell.cell_type == "code" and source:
            parts.append(_fence(source))
        if i == 0:  # after the title and introduction
            parts.append(
                ":::{note}\nThis page is the notebook `" + notebook + "`: open it in JupyterLab to do the exercises. "
                "Write each function in place of its stub and run the check below it; a check says what is wrong "
                "until the function is right. The solutions are folded under *Solution*: try first.\n:::"
            )
    return "\n\n".join(parts) + "\n"


def write_exercise_pages(out_dir: Path, source_dir: Path = NOTEBOOKS) -> list[Path]:
    """Write ``out_dir/<name>.md`` for every exercise notebook; a page whose text is
    unchanged keeps its timestamp (Sphinx then does not rebuild it)."""
    import nbformat

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in exercise_notebooks(source_dir):
        rel = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
        text = page_markdown(nbformat.read(path, as_version=4), rel)
        page = out_dir / f"{path.stem}.md"
        if not page.is_file() or page.read_text(encoding="utf-8") != text:
            atomic_write(page, text)
        written.append(page)
    return written
