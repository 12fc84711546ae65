"""The house's import graph, read from the sources: no module-level import circle anywhere in
``rl``, ``envs``, ``sandbox`` and ``configs``, and the learner never reaches the environments.
Its modules stay small: one over :data:`MAX_LINES` lines is named in the README, which says why
it is one unit.

A circle makes the import order decide what works (the half-initialised module raises
``ImportError`` from one entry point and not another); it is cheap to keep at zero and costly to
untangle later. Imports inside functions are deferred by design and are not edges here, except
for ``rl/learning/``, which must not import ``envs`` at all: the learner sees batches of tokens.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rl", "envs", "sandbox", "configs")
MAX_LINES = 450  # a module of one job reads in one sitting; past this, split it or say why it is one unit


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _import_time(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements run when the module is imported: module level, ``if``/``try`` blocks, but not
    ``if TYPE_CHECKING:`` (never run) nor function bodies (deferred)."""
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, (ast.If, ast.Try)):
            yield from _import_time(node.body)
            yield from _import_time(node.orelse)
            for handler in getattr(node, "handlers", []):
                yield from _import_time(handler.body)
        else:
            yield node


def _targets(nodes: Iterator[ast.AST], known: dict[str, Path]) -> set[str]:
    """Modules of the house that these nodes import: ``from sandbox import identity`` is the
    module ``sandbox.identity``, ``from sandbox import SandboxSpec`` the package ``sandbox``."""
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names
            }
    return owning_modules(names, known)


def owning_modules(names: set[str], known: Mapping[str, object]) -> set[str]:
    """The known module each dotted name lives in (``sandbox.spec.SandboxSpec`` → ``sandbox.spec``)."""
    found = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def _graph(*, deferred: bool) -> dict[str, set[str]]:
    known = _modules()
    graph = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        nodes = ast.walk(tree) if deferred else _import_time(tree.body)
        graph[name] = _targets(nodes, known) - {name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
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
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_no_module_level_import_circle_in_the_house():
    assert _circles(_graph(deferred=False)) == []


def test_the_circle_finder_sees_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_the_learner_imports_nothing_from_the_environments_even_deferred():
    graph = _graph(deferred=True)
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in graph.items()
        if name.startswith("rl.learning")
        for target in targets
        if target == "envs" or target.startswith("envs.")
    )
    assert wrong == []


def test_a_module_over_the_line_limit_is_named_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    long = {
        str(path.relative_to(ROOT)): n
        for path in _modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    unexplained = {path: n for path, n in long.items() if f"`{path}`" not in readme}
    assert not unexplained, f"split these, or say in README.md why each is one unit: {unexplained}"
