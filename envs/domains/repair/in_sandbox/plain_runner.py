"""Plain test modules run as pytest would run them, without importing pytest: the judge's fast path.

Importing pytest and letting it collect costs the judge about a third of a CPU-second an episode,
more than the tests of a small task take to run. Most hidden test files use nothing of pytest:
module-level ``def test_*():`` functions, without arguments, decorators or ``yield``, that pass
unless they raise. For those the verdict is simple to reproduce exactly, so ``repo_judge.py``
runs them here when :func:`plain_reason` finds nothing pytest-specific in any of them, and hands
everything else to pytest. The judge writes both outcomes in the same report, so the verifier
cannot tell which ran. Same process, same uid, same proxy to the repository: only pytest is gone.

What pytest does that this runner reproduces for such files (pytest 7, the judge's ini):
  - files ``test_*.py`` / ``*_test.py`` of one flat ``tests/`` directory, in name order, each
    imported as a top-level module with its directory first on ``sys.path`` ("prepend" mode);
  - a file that fails to import is a collection error, and then no test runs at all;
  - functions named ``test*`` in source order, ids ``tests/<file>::<name>``;
  - a test passes unless it raises; a test that overruns its time limit fails.

Standard library only (runs inside the sandbox, Python >= 3.8), and never imports the repository:
the judge's proxy does. The host imports :func:`plain_reason` to decide (it is the judge's code).
"""

import ast
import fnmatch
import importlib
import os
import sys

TEST_FILES = ("test_*.py", "*_test.py")  # the judge's pytest.ini ``python_files``
_PYTEST_NAMES = ("pytest", "_pytest", "py")
_XUNIT = frozenset(
    ("setup", "teardown", "setup_module", "teardown_module", "setUpModule", "tearDownModule", "setup_function")
) | {"teardown_function", "setup_method", "teardown_method"}


def plain_reason(files):
    """Why ``files`` (path under ``tests/`` -> source) need pytest, or None when this runner gives its verdict."""
    for path, source in sorted(files.items()):
        name = os.path.basename(path)
        if "/" in path.strip("/") or not any(fnmatch.fnmatch(name, p) for p in TEST_FILES):
            return f"{path}: not a test file of a flat tests/ directory"
        why = _module_reason(source)
        if why:
            return f"{path}: {why}"
    return None if files else "no test files"


def _module_reason(source):
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return "does not parse (pytest reports the collection error)"
    top, seen = {id(node) for node in tree.body}, set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if any(n and n.split(".")[0] in _PYTEST_NAMES for n in names):
                return "imports pytest"
            if any(_special(a.asname or a.name.split(".")[0]) for a in node.names):
                return "imports a name pytest would collect"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _special(node.name):
            if id(node) not in top or not isinstance(node, ast.FunctionDef) or not node.name.startswith("test"):
                return f"defines {node.name} (pytest collects or calls it its own way)"
            a = node.args
            if node.decorator_list or a.args or a.posonlyargs or a.kwonlyargs or a.vararg or a.kwarg:
                return f"{node.name} takes arguments or decorators (fixtures, marks)"
            if any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await)) for n in ast.walk(node)):
                return f"{node.name} is a generator"
            if node.name in seen:
                return f"{node.name} is defined twice"
            seen.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _special(node.id):
            return f"binds {node.id}, a name pytest would collect or read"
        elif isinstance(node, ast.Global) and any(_special(n) for n in node.names):
            return "binds a name pytest would collect or read"
    return None


def _special(name):
    """Names pytest collects (``test*``, ``Test*``) or reads (hooks, marks, xunit setup and teardown)."""
    return name.startswith(("test", "Test", "pytest", "__test__")) or name in _XUNIT


def run(root, arm, disarm):
    """Runs the plain test files under ``root/tests``; the report ``repo_judge.py`` prints.

    ``arm()`` / ``disarm()`` start and stop the per-test time limit (the judge's SIGALRM), around
    each module's import and each test.
    """
    tests = os.path.join(root, "tests")
    names = sorted(n for n in os.listdir(tests) if any(fnmatch.fnmatch(n, p) for p in TEST_FILES))
    if tests not in sys.path:
        sys.path.insert(0, tests)
    modules, collect_errors = [], []
    for name in names:
        arm()
        try:
            modules.append((name, importlib.import_module(name[: -len(".py")])))
        except BaseException:  # anything at import is a collection error, as for pytest
            collect_errors.append(f"tests/{name}")
        finally:
            disarm()
    collected, functions = [], []
    for name, module in modules:
        found = [
            (obj.__code__.co_firstlineno if hasattr(obj, "__code__") else 0, key, obj)
            for key, obj in vars(module).items()
            if key.startswith("test") and callable(obj) and getattr(obj, "__module__", None) == module.__name__
        ]
        for _, key, obj in sorted(found, key=lambda f: f[0]):
            collected.append(f"tests/{name}::{key}")
            functions.append(obj)
    outcomes = {}
    if not collect_errors:  # pytest runs nothing when collecting failed
        for node_id, function in zip(collected, functions):  # noqa: B905 - Python >= 3.8 in the sandbox
            arm()
            try:
                function()
                outcomes[node_id] = "passed"
            except BaseException:  # a failed assertion, an error, the time limit: the test failed
                outcomes[node_id] = "failed"
            finally:
                disarm()
    if collect_errors:
        code = 2
    elif not collected:
        code = 5
    else:
        code = 0 if all(o == "passed" for o in outcomes.values()) else 1
    return {"exit_code": code, "collected": collected, "outcomes": outcomes, "collect_errors": collect_errors}
