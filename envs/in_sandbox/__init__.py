"""Programs and modules that run inside sandboxes, and how the host ships them there.

They are code, kept as source next to the host code that uses them, and sent
into a sandbox as text on every use (never installed there, so a sandbox holds
nothing the agent could have replaced beforehand). Two ways in:

* :func:`bundle` makes one ``python3 -c`` program: the modules it needs are
  installed in ``sys.modules`` from their source, then the main program runs.
  For programs started once per check (the function driver, the state checker,
  the oracle scan).
* Files written side by side into a directory the caller controls, the main one
  run by path (the function recorder, the repository judge and server).

Shipped, a program imports its modules by their flat name (``from plain_data
import encode``); imported on the host (the host's own judging code, tests) it
imports them by package path. Each such module picks by ``__package__``, which
is empty only when it was shipped::

    if __package__:  # imported on the host, as part of envs
        from envs.in_sandbox.plain_data import encode
    else:  # shipped: plain_data is bundled in, or sits beside this file
        from plain_data import encode

Shared by several domains here:
``plain_data`` (the one codec of values across a trust boundary) and
``git_env`` (git that runs nothing the agent configured). Each domain keeps its
own programs in its package's ``in_sandbox/`` folder; the task-quality tools
keep theirs in ``envs/quality/in_sandbox/``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

HERE = Path(__file__).resolve().parent


@functools.cache
def source(path: str | Path) -> str:
    """The source text of a shipped module (read once per process)."""
    return Path(path).read_text(encoding="utf-8")


def shared(name: str) -> str:
    """The source of a module shared by several domains (``plain_data``, ``git_env``)."""
    path = HERE / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"shared(name=): no shipped module {name!r} in {HERE}")
    return source(path)


def bundle(main: str, modules: Mapping[str, str]) -> str:
    """One ``python3 -c`` program: ``modules`` (flat name -> source) importable by name, then ``main``.

    Each module is executed in a fresh module object registered in
    ``sys.modules`` before ``main`` runs, so ``main``'s own imports resolve as
    they would with the files side by side; ``__name__`` of ``main`` is
    ``"__main__"``.
    """
    for name in modules:
        if not name.isidentifier():
            raise ValueError(f"bundle(modules=): {name!r} is not a module name")
    lines = ["import sys as _sys, types as _types"]
    for name, text in modules.items():
        lines.append(f"_module = _sys.modules[{name!r}] = _types.ModuleType({name!r})")
        lines.append(f"exec(compile({text!r}, {name + '.py'!r}, 'exec'), _module.__dict__)")
    lines.append("del _sys, _types" + (", _module" if modules else ""))
    return "\n".join(lines) + "\n" + main
