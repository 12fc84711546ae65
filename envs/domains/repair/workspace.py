"""Workspace hygiene before anything judges a repository: what runs is the repository's source.

Verifiers that run code of the workspace after the agent has finished
(``hidden_tests``' probes) first kill every process the agent left and then
call :func:`restore_workspace`: files that steer Python or pytest
(``conftest.py``, ``pytest.ini``, ``pyproject.toml``, ``setup.cfg``,
``tox.ini``, ``sitecustomize.py``, ``usercustomize.py``, ``*.pth``,
``__pycache__``/``*.pyc`` bytecode, ``*.so`` extension modules that would
shadow a ``.py``) and everything under the task's protected paths (its
visible tests) are deleted, and the task's original versions written back.
So what runs is the repository's *source*, not bytecode or hooks planted
next to it.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from sandbox import SandboxFileError

STEERING_NAMES = (
    "conftest.py",
    "pytest.ini",
    "pyproject.toml",
    "setup.cfg",
    "tox.ini",
    "sitecustomize.py",
    "usercustomize.py",
    "__pycache__",
)
STEERING_SUFFIXES = (".pth", ".pyc", ".pyo", ".so")  # .so: an extension module shadows a .py of the same name

_HYGIENE = r"""
import fnmatch, json, os, shutil, stat, sys
cfg = json.loads(sys.stdin.read())
root, names, suffixes, protected = cfg['root'], set(cfg['names']), tuple(cfg['suffixes']), cfg['protected']
removed, failed = [], []

def usable(path):  # a directory the agent chmod-ed shut must not hide what is inside it
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | 0o700)
    except OSError:
        pass

usable(root)
for d, dirs, files in os.walk(root, topdown=True):
    for name in list(dirs) + files:
        path = os.path.join(d, name)
        rel = os.path.relpath(path, root)
        usable(path)
        if name in names or name.endswith(suffixes) or any(fnmatch.fnmatch(rel, p) for p in protected):
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    for sub, subdirs, _ in os.walk(path):
                        for x in subdirs:
                            usable(os.path.join(sub, x))
                    shutil.rmtree(path)
                    dirs.remove(name)
                else:
                    os.unlink(path)
                removed.append(rel)
            except OSError:
                failed.append(rel)
print(json.dumps({"removed": sorted(removed), "failed": sorted(failed)}))
"""


class WorkspaceError(Exception):
    """The workspace could not be cleaned (the agent's doing): what would run is not the repository's source."""


def restore_workspace(
    sandbox: Any, original_files: Mapping[str, str], protected: Sequence[str], *, root: str = "/workspace"
) -> list[str]:
    """Deletes steering files and protected paths from the workspace, writes the originals back; returns what went.

    :class:`WorkspaceError` if something could not be removed; a broken sandbox still raises
    :class:`sandbox.SandboxInfraError` (an anomaly), a stubborn workspace never does.
    """
    config = {"root": root, "names": STEERING_NAMES, "suffixes": STEERING_SUFFIXES, "protected": list(protected)}
    result = sandbox.exec(["python3", "-I", "-c", _HYGIENE], stdin=json.dumps(config), timeout=60)
    try:
        report = json.loads(result.stdout_text) if result.ok else None
    except ValueError:
        report = None
    if report is None:
        raise WorkspaceError(f"workspace hygiene did not finish (exit {result.exit_code}): {result.stderr_text[-300:]}")
    if report["failed"]:
        raise WorkspaceError(f"could not remove {report['failed'][:5]} from the workspace")
    restore = {
        path: content
        for path, content in original_files.items()
        if posixpath.basename(path) in STEERING_NAMES
        or path.endswith(STEERING_SUFFIXES)
        or any(fnmatch.fnmatch(path, p) for p in protected)
    }
    try:
        if restore:
            sandbox.write_files({posixpath.join(root, p): c for p, c in restore.items()})
    except SandboxFileError as exc:  # the agent filled the workspace
        raise WorkspaceError(f"could not write the original files back: {exc}") from exc
    return list(report["removed"])
