"""The house's shape, read from the source: no import circles, no long modules.

The import graph of ``zephon_stream/`` and ``benchmarks/`` is built with
``ast`` from every ``import`` and ``from ... import`` statement, wherever it
stands: at module level, under ``if TYPE_CHECKING:``, and inside functions and
methods (a lazy import). A circle hidden behind a function-level import or a
type-checking block is still a circle: neither file can be read, tested or
replaced without the other. Relative imports are resolved against the
importing module. ``from package import name`` is an edge to
``package.name`` when that is a module, else to the package itself. The
import of a parent package that Python performs implicitly (importing
``zephon_stream.plan.order`` first runs ``zephon_stream/plan/__init__.py``)
is not an edge: only what a file names is.

The loader's sub-packages are stages a batch passes through, declared in
``LOADER_STAGES`` from the first to the last: a module of one stage imports
only modules of its own stage and of stages before it, never a later one and
never the loader's front door (``zephon_stream/loader/__init__.py``, which
re-exports the public names). Every module of the loader lives in a stage.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("zephon_stream", "benchmarks")
MAX_MODULE_LINES = 400
LOADER = "zephon_stream.loader"
# The order a batch passes through the loader's sub-packages (docs/ARCHITECTURE.md, "loader/").
LOADER_STAGES = ("blocks", "planning", "ring", "producer", "delivery", "runs", "front")


def module_files() -> dict[str, tuple[Path, bool]]:
    """``{dotted module name: (file, is a package's __init__)}`` of every module of ``PACKAGES``."""
    modules = {}
    for top in PACKAGES:
        for path in sorted((REPO / top).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            modules[".".join(parts)] = (path, is_package)
    return modules


def absolute_base(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The module a ``from`` import names, its dots resolved against ``module``."""
    if level == 0:
        return name or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports_of(module: str, path: Path, is_package: bool, modules: dict) -> dict[str, int]:
    """``{imported module of PACKAGES: line of its first import}`` for one file."""
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        if target != module:
            found.setdefault(target, line)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name:
                    add(name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = absolute_base(module, is_package, node.level, node.module)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    add(f"{base}.{alias.name}", node.lineno)
                elif base in modules:
                    add(base, node.lineno)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    modules = module_files()
    return {name: imports_of(name, path, is_package, modules) for name, (path, is_package) in modules.items()}


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Groups of modules that reach one another (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def shortest_cycle(graph: dict[str, dict[str, int]], group: list[str]) -> list[str]:
    """A shortest circle through the group's first module, as ``[a, b, ..., a]``."""
    start, members = group[0], set(group)
    previous = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child == start:
                    path = [node]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child in members and child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no circle through {start} in {group}")


def describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    modules = module_files()
    steps = []
    for here, there in zip(cycle, cycle[1:]):
        path = modules[here][0].relative_to(REPO).as_posix()
        steps.append(f"{here} -> {there} ({path}:{graph[here][there]})")
    return " ; ".join(steps)


def test_import_graph_has_no_circles():
    graph = import_graph()
    circles = [
        f"{', '.join(group)}: {describe(graph, shortest_cycle(graph, group))}" for group in strongly_connected(graph)
    ]
    assert not circles, (
        f"{len(circles)} import circle(s); each line names the modules that reach one another, then one circle "
        "through them with the file and line of each import:\n" + "\n".join(f"  {c}" for c in circles)
    )


def test_the_graph_reader_sees_lazy_relative_and_type_checking_imports(tmp_path, monkeypatch):
    """The checker itself: a circle made only of a function-level import, a
    ``TYPE_CHECKING`` import and a relative import is found and named."""
    package = tmp_path / "zephon_stream" / "sub"
    package.mkdir(parents=True)
    (tmp_path / "zephon_stream" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from zephon_stream.sub.b import g\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n")
    (package / "c.py").write_text("from .a import f\n")
    (package / "d.py").write_text("import zephon_stream.sub.a\n")
    (tmp_path / "benchmarks").mkdir()
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    graph = import_graph()
    assert graph["zephon_stream.sub.d"] == {"zephon_stream.sub.a": 1}
    groups = strongly_connected(graph)
    assert groups == [["zephon_stream.sub.a", "zephon_stream.sub.b", "zephon_stream.sub.c"]]
    assert shortest_cycle(graph, groups[0]) == [
        "zephon_stream.sub.a",
        "zephon_stream.sub.b",
        "zephon_stream.sub.c",
        "zephon_stream.sub.a",
    ]
    assert describe(graph, shortest_cycle(graph, groups[0])).startswith(
        "zephon_stream.sub.a -> zephon_stream.sub.b (zephon_stream/sub/a.py:2)"
    )


def test_no_module_of_the_package_is_over_400_lines():
    lengths = {
        path.relative_to(REPO).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in (REPO / "zephon_stream").rglob("*.py")
    }
    long = sorted((n, p) for p, n in lengths.items() if n > MAX_MODULE_LINES)
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by what they hold): " + ", ".join(
        f"{p} ({n})" for n, p in reversed(long)
    )


def loader_stage_of(module: str, stages: tuple[str, ...]) -> str | None:
    """The stage a module of the loader belongs to (None: the front door, or a module in no stage)."""
    parts = module.split(".")
    base = LOADER.split(".")
    if parts[: len(base)] != base or len(parts) == len(base):
        return None
    return parts[len(base)] if parts[len(base)] in stages else None


def loader_stage_violations(graph: dict[str, dict[str, int]], stages: tuple[str, ...]) -> list[str]:
    """``file:line: ...`` for each import from one stage of the loader into a later stage or its front door."""
    modules = module_files()
    found = []
    for module in sorted(graph):
        here = loader_stage_of(module, stages)
        if here is None:
            continue
        for target, line in sorted(graph[module].items(), key=lambda item: item[1]):
            if target != LOADER and not target.startswith(LOADER + "."):
                continue
            there = loader_stage_of(target, stages)
            if target == LOADER:
                why = "the loader's front door (import the module that defines the name)"
            elif there is not None and stages.index(there) > stages.index(here):
                why = f"stage {there!r}, after {here!r} in {stages}"
            else:
                continue
            path = modules[module][0].relative_to(REPO).as_posix()
            found.append(f"{path}:{line}: {module} imports {target}: {why}")
    return found


def test_the_loader_stages_import_one_way():
    violations = loader_stage_violations(import_graph(), LOADER_STAGES)
    assert not violations, (
        f"{len(violations)} import(s) against the loader's stage order {LOADER_STAGES} (a stage imports only "
        "itself and the stages before it):\n" + "\n".join(f"  {v}" for v in violations)
    )


def test_every_loader_module_lives_in_a_stage_with_a_docstring():
    modules = module_files()
    loose = sorted(
        path.relative_to(REPO).as_posix()
        for name, (path, _) in modules.items()
        if name.startswith(LOADER + ".") and loader_stage_of(name, LOADER_STAGES) is None
    )
    assert not loose, f"loader modules in no stage of {LOADER_STAGES} (move each into the stage it serves): {loose}"
    for stage in LOADER_STAGES:
        init = REPO / "zephon_stream" / "loader" / stage / "__init__.py"
        assert init.is_file(), f"stage {stage!r} has no package {init.relative_to(REPO)}"
        tree = ast.parse(init.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), f"{init.relative_to(REPO)}: say the stage's job and where a batch goes next"
        # A stage's __init__ runs whenever any of its modules is imported
        # (the helper process's too), so it imports nothing.
        assert all(isinstance(node, ast.Expr) for node in tree.body), (
            f"{init.relative_to(REPO)} imports or defines something"
        )


def test_the_stage_check_names_the_file_and_line_of_an_import_against_the_order(tmp_path, monkeypatch):
    """The checker itself: an import into a later stage, lazy or not, and one of the front door are named."""
    loader = tmp_path / "zephon_stream" / "loader"
    for stage in ("early", "late"):
        (loader / stage).mkdir(parents=True)
        (loader / stage / "__init__.py").write_text("")
    (tmp_path / "zephon_stream" / "__init__.py").write_text("")
    (loader / "__init__.py").write_text("")
    (loader / "early" / "a.py").write_text("import os\n\n\ndef f():\n    from zephon_stream.loader.late import b\n")
    (loader / "early" / "c.py").write_text("from zephon_stream.loader import b\n")
    (loader / "late" / "b.py").write_text("from ..early import a\n")
    (tmp_path / "benchmarks").mkdir()
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    assert loader_stage_violations(import_graph(), ("early", "late")) == [
        "zephon_stream/loader/early/a.py:5: zephon_stream.loader.early.a imports zephon_stream.loader.late.b: "
        "stage 'late', after 'early' in ('early', 'late')",
        "zephon_stream/loader/early/c.py:1: zephon_stream.loader.early.c imports zephon_stream.loader: "
        "the loader's front door (import the module that defines the name)",
    ]
    assert loader_stage_violations(import_graph(), ("late", "early")) == [
        "zephon_stream/loader/early/c.py:1: zephon_stream.loader.early.c imports zephon_stream.loader: "
        "the loader's front door (import the module that defines the name)",
        "zephon_stream/loader/late/b.py:1: zephon_stream.loader.late.b imports zephon_stream.loader.early.a: "
        "stage 'early', after 'late' in ('late', 'early')",
    ]


def test_the_helper_process_imports_no_torch():
    """The helper's interpreter loads the loader's producer side only: the
    loader's front door re-exports lazily, so torch (seconds and hundreds of
    MiB) stays out of it."""
    code = textwrap.dedent(
        """
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "torch":
                    raise ImportError(f"blocked import of {name}")
                return None

        sys.meta_path.insert(0, Block())
        from zephon_stream.loader.producer.helper_main import main
        assert not any(m.split(".")[0] == "torch" for m in sys.modules)
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
