"""The layers import only downwards: configs -> rl -> envs -> sandbox, and envs and sandbox run without JAX.

Checked twice: statically, on every import statement of every module (those
inside functions too, and ``importlib.import_module("...")`` / ``__import__``
with a literal name), so an import that only runs on some path is caught; and
by importing ``envs`` with its tools in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JAX_STACK = {"jax", "jaxlib", "flax", "optax", "orbax", "grain"}
FORBIDDEN = {
    "envs": JAX_STACK | {"rl", "configs"},
    "sandbox": JAX_STACK | {"envs", "rl", "configs", "gymnasium"},
}


def imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, top-level package)`` of every absolute import anywhere in ``tree``, literal dynamic ones included."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value.split(".")[0]))
    return found


def violations(package: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, name in imported_names(tree):
            if name in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_imports_an_upper_layer_or_jax_even_inside_a_function(package):
    assert violations(package) == []


def test_the_scan_sees_deferred_and_dynamic_imports():
    source = (
        "import os\n"
        "def f():\n    import jax.numpy\n"
        "def g():\n    from rl.loop import x\n"
        "def h():\n    importlib.import_module('grain.python')\n"
        "from . import sibling\n"
    )
    assert [name for _, name in imported_names(ast.parse(source))] == ["os", "jax", "rl", "grain"]


def test_import_envs_and_its_tools_loads_no_jax_or_upper_layers():
    code = (
        "import sys, envs, envs.quality.validate, envs.quality.selfcheck, envs.quality.difficulty, "
        "envs.quality.leaks, envs.quality.authoring, envs.demonstrations\n"
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'flax', 'optax', 'orbax', 'grain', 'rl', 'configs'})\n"
        "print(','.join(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == ""
