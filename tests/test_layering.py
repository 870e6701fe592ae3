"""The import graph of depthkit: packages in layers that only look down, no circle
anywhere, and one module runs hooks.

Every import counts, including those inside functions and under TYPE_CHECKING: a
function-level import hides a circle, it does not remove it, and a type names a
dependency as much as a call does.
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


# The packages from the bottom up: a module may import its own package and those
# below it, never one above. The face (``depthkit/__init__``) and the old-path
# aliases (``_moved``) sit on top of everything and nothing inside imports them.
LAYERS = ["core", "stats", "data", "engine", "lens", "analyses", "plots", "chapters", "exercises", "verdicts", "book", "cli"]
TOP = {"depthkit", "depthkit._moved"}
# The few imports that point up, each with its reason.
ALLOWED_UP = {
    # Chapter 07 compares every chapter's results and shows the verdicts computed from
    # them; the verdict rules read the other chapters' modules, so they sit above
    # chapters, and only this one chapter looks up at them.
    ("depthkit.chapters.ch07_across_models", "depthkit.verdicts"),
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "depthkit"


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    out = []
    for mod, deps in graph.items():
        if mod in TOP:
            continue
        for dep in deps:
            if dep in TOP or LAYERS.index(layer_of(dep)) > LAYERS.index(layer_of(mod)):
                out.append((mod, dep))
    return sorted(out)


def test_every_module_sits_in_a_layer():
    graph = import_graph()
    assert len(graph) > 60
    strays = [m for m in graph if m not in TOP and layer_of(m) not in LAYERS]
    assert not strays, f"modules outside the layered packages (add them to a package or to LAYERS): {strays}"


def test_no_import_cycle():
    graph = import_graph()
    assert "depthkit.engine.capture" in graph and "depthkit.lens.trajectories" in graph
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_function_level_imports_count():
    graph = import_graph()
    # The lens training data imports its default texts inside a function.
    assert "depthkit.data.embedded" in graph["depthkit.lens.training_data"]


def test_every_package_imports_only_the_packages_below_it():
    graph = import_graph()
    found = set(upward_imports(graph))
    assert found - ALLOWED_UP == set(), "imports that point up a layer: " + ", ".join(f"{a} -> {b}" for a, b in sorted(found - ALLOWED_UP))
    assert ALLOWED_UP - found == set(), f"allowed exceptions no longer needed (remove them): {sorted(ALLOWED_UP - found)}"


def test_the_layer_check_catches_a_planted_upward_import():
    graph = {"depthkit.engine.capture": {"depthkit.lens.base"}, "depthkit.lens.base": {"depthkit.engine.capture"},
             "depthkit.stats.narrate": {"depthkit"}, "depthkit": {"depthkit.book.runner"}}  # fmt: skip
    assert upward_imports(graph) == [("depthkit.engine.capture", "depthkit.lens.base"), ("depthkit.stats.narrate", "depthkit")]


def test_only_the_backends_run_forward_passes_with_interventions():
    # The capture layer says what a pass does; each backend module is the one place
    # its engine runs it (hooks, traces). The exercises are the exception: writing
    # a hook is what the patching exercise teaches.
    def users(needle: str) -> list[str]:
        found = sorted(_module_name(p) for p in PKG.rglob("*.py") if needle in p.read_text())
        return [u for u in found if not u.startswith("depthkit.exercises.")]

    assert users("run_with_hooks(") == ["depthkit.engine.backends.bridge"]
    assert users(".trace(") == ["depthkit.engine.backends.nnsight_trace"]
    # Every module that reads or writes residuals asks the capture layer (none reaches a
    # backend's passes); its patched runs live beside it and are re-exported by it.
    assert users("backend.execute") == ["depthkit.engine.capture", "depthkit.engine.patched"]
    assert users("backend.truncated") == ["depthkit.engine.capture"]


def test_old_import_paths_still_work_and_say_where_the_module_went():
    import importlib
    import subprocess
    import sys

    from depthkit import _moved

    for old, new in _moved.MOVED.items():
        assert importlib.util.find_spec(f"depthkit.{new}") is not None, f"depthkit.{old} points at a missing depthkit.{new}"
        assert not (PKG / f"{old}.py").exists(), f"depthkit/{old}.py exists again; drop the alias for it"
    # A fresh interpreter, so the warning is not swallowed by an earlier import.
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import depthkit, depthkit.lens.store as new\n"
        "try:\n    import depthkit.lens_store\nexcept DeprecationWarning as w:\n    print('warned:', w)\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "import depthkit.lens_store as old\nfrom depthkit import metrics\n"
        "print(old is new, metrics.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "warned: depthkit.lens_store moved to depthkit.lens.store" in out, out
    assert "True depthkit.analyses.summaries" in out, out


def test_depthkit_itself_uses_no_old_import_path():
    from depthkit import _moved

    old = {f"depthkit.{name}" for name in _moved.MOVED}
    graph = import_graph()
    # import_graph resolves a missing module to its package, so look at the source too.
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "_moved.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            offenders += [f"{path.relative_to(PKG)}: {n}" for n in names if n in old]
    assert graph and not offenders, offenders
