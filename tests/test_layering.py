"""The import graph of depthkit: no circle anywhere, and one module runs hooks.

Layering: models -> capture -> lenses -> (lens data, training, store) ->
trajectories -> analyses. Every import counts, including those inside functions:
a function-level import hides a circle, it does not remove it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "depthkit"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _resolve(name: str, known: set[str]) -> str | None:
    """The depthkit module ``name`` refers to: itself, or the closest package above it."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                # ``from depthkit import data``: the submodule; otherwise the module itself.
                targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]
            for t in targets:
                if t == "depthkit" or t.startswith("depthkit."):
                    dep = _resolve(t, known)
                    if dep and dep != mod:
                        graph[mod].add(dep)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle():
    graph = import_graph()
    assert "depthkit.capture" in graph and "depthkit.trajectories" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_function_level_imports_count():
    graph = import_graph()
    # lens_data imports its default texts inside a function.
    assert "depthkit.data" in graph["depthkit.lens_data"]


def test_layers_point_down():
    graph = import_graph()

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            m = todo.pop()
            if m == b:
                return True
            if m not in seen:
                seen.add(m)
                todo += graph.get(m, ())
        return False

    order = [
        "depthkit.models",
        "depthkit.capture",
        "depthkit.lenses",
        "depthkit.lens_data",
        "depthkit.lens_training",
        "depthkit.lens_store",
        "depthkit.trajectories",
        "depthkit.lens_compare",
        "depthkit.tuned_lens",
    ]
    for i, lower in enumerate(order):
        for upper in order[i + 1 :]:
            assert not reaches(lower, upper), f"{lower} must not import {upper}, even indirectly"
    for upper, lower in [
        ("depthkit.capture", "depthkit.models"),
        ("depthkit.lens_data", "depthkit.capture"),
        ("depthkit.trajectories", "depthkit.capture"),
        ("depthkit.trajectories", "depthkit.lens_store"),
        ("depthkit.patching", "depthkit.capture"),
        ("depthkit.residual", "depthkit.capture"),
    ]:
        assert lower in graph[upper], f"{upper} should import {lower} directly"


def test_capture_is_the_only_module_running_hooks():
    # The exercises are the exception: writing a hook is what the patching exercise teaches.
    users = sorted(_module_name(p) for p in PKG.rglob("*.py") if "run_with_hooks" in p.read_text())
    assert [u for u in users if not u.startswith("depthkit.exercises.")] == ["depthkit.capture"], users
