"""The package's layout holds: layers import only downwards, no import cycle, no reaching into private state.

Read from the sources (no sandbox is started), so a change that breaks the
architecture fails here, with the offending import named, before it becomes
a tangle to undo.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_import_graph import owning_modules

ROOT = Path(__file__).resolve().parents[2] / "sandbox"
# Lowest first: a module may import its own layer and the ones before it (see sandbox/__init__.py).
LAYERS = (
    ("sandbox.errors",),
    ("sandbox.images",),
    ("sandbox.spec",),
    ("sandbox.identity", "sandbox.seccomp"),
    ("sandbox.agent",),
    ("sandbox.backends",),
    ("sandbox.pool",),
    ("sandbox.scheduler",),
    ("sandbox.fleet",),
    ("sandbox.demo", "sandbox.dockerd"),
)


def layer_of(module: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer of LAYERS: add it there and to sandbox/__init__.py")


def modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def sandbox_imports(tree: ast.Module, known: dict[str, ast.Module], *, top_level_only: bool) -> set[str]:
    """The ``sandbox`` modules a module imports: ``from sandbox.pool import cleanup`` is ``sandbox.pool.cleanup``,
    ``from sandbox import SandboxSpec`` (a lazy export) the package ``sandbox`` itself."""
    if top_level_only:  # module level, `if TYPE_CHECKING:` blocks included
        nodes = [n for stmt in tree.body for n in (stmt.body if isinstance(stmt, ast.If) else [stmt])]
    else:
        nodes = list(ast.walk(tree))
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return owning_modules(names, known)


def test_every_module_imports_only_its_own_layer_or_lower_ones():
    known = modules()
    wrong = []
    for name, tree in known.items():
        if name == "sandbox":
            continue  # the package's lazy exports name every layer by design
        for target in sandbox_imports(tree, known, top_level_only=False):
            if target != "sandbox" and layer_of(target) > layer_of(name):
                wrong.append(f"{name} imports {target}")
    assert not wrong, wrong


def test_the_agent_imports_only_itself():
    """Its sources are all a sandbox receives (``sandbox.agent.bundle``): nothing else of ``sandbox`` is there."""
    known = modules()
    wrong = [
        f"{name} imports {target}"
        for name, tree in known.items()
        if name.startswith("sandbox.agent.")
        for target in sandbox_imports(tree, known, top_level_only=False)
        if not target.startswith("sandbox.agent")
    ]
    assert not wrong, wrong


def test_no_import_cycle_between_modules():
    known = modules()
    graph = {
        name: sandbox_imports(tree, known, top_level_only=True) - {"sandbox", name}
        for name, tree in known.items()
        if name != "sandbox"
    }
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            pytest.fail("import cycle: " + " -> ".join([*path[path.index(node) :], node]))
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            visit(target, [*path, node])
        done.add(node)

    for name in sorted(graph):
        visit(name, [])


def test_no_module_reaches_into_another_objects_private_members():
    """Collaborators talk through public methods (e.g. the pool and its upkeep share ``PoolState``)."""
    wrong = []
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            wrong.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert not wrong, wrong


def test_importing_everything_pulls_in_no_upper_layer_of_the_repository():
    code = (
        "import sys, sandbox\n"
        "for name in sandbox.__all__: getattr(sandbox, name)\n"
        "import sandbox.dockerd, sandbox.demo, sandbox.identity, sandbox.images\n"
        "bad = {m.split('.')[0] for m in sys.modules} & {'envs', 'rl', 'configs', 'jax', 'gymnasium'}\n"
        "print(','.join(sorted(bad)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == ""
