"""Running hidden tests so that the verdict cannot be gamed from inside the sandbox.

The order of operations is the defence:

1. ``kill_all``: nothing the agent started survives to watch or rewrite what follows.
2. Workspace hygiene: files that steer Python or pytest (``conftest.py``,
   ``pytest.ini``, ``pyproject.toml``, ``setup.cfg``, ``tox.ini``,
   ``sitecustomize.py``, ``usercustomize.py``, ``*.pth``, ``__pycache__``/``*.pyc``,
   ``*.so``)
   and everything under the task's protected paths (its visible tests) are
   deleted, and the task's original versions written back.
3. A fresh directory with a random name receives the hidden tests, a pytest.ini
   and the trusted runner (``envs/data/harness/pytest_runner.py``). The tests run
   with ``python3 -I -B`` (no user site, no PYTHON* variables, no bytecode),
   rootdir/ini/confcutdir pinned, plugin autoload off, a secret nonce on stdin.
4. ``kill_all`` again, then the host reads the runner's HMAC-signed verdict and
   the JUnit XML, and accepts a result only if: the signature holds, the XML
   hash matches, no tampering was detected, the collected ids equal the task's
   manifest, and the XML agrees with the runner's own record, test by test.

Anything less is a failure of the *submission* (score 0), never an anomaly:
only :class:`sandbox.SandboxInfraError` makes an anomaly (see ``Verifier.verify``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import hmac
import json
import posixpath
import secrets
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sandbox import SandboxFileError

HARNESS_DIR = Path(__file__).resolve().parent.parent / "data" / "harness"
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
MAX_REPORT_BYTES = 8 << 20

_HYGIENE = r"""
import fnmatch, json, os, shutil, sys
cfg = json.loads(sys.stdin.read())
root, names, suffixes, protected = cfg['root'], set(cfg['names']), tuple(cfg['suffixes']), cfg['protected']
removed = []
for d, dirs, files in os.walk(root, topdown=True):
    for name in list(dirs) + files:
        path = os.path.join(d, name)
        rel = os.path.relpath(path, root)
        if name in names or name.endswith(suffixes) or any(fnmatch.fnmatch(rel, p) for p in protected):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
                if name in dirs:
                    dirs.remove(name)
            else:
                os.unlink(path)
            removed.append(rel)
print(json.dumps(sorted(removed)))
"""


@dataclasses.dataclass(frozen=True)
class HiddenRun:
    """What the hidden tests said, as accepted (or rejected) by the host."""

    outcomes: dict[str, str]
    manifest: list[str]
    collected: list[str]
    problems: list[str]
    exit_code: int | None
    removed: list[str]
    output_tail: str

    @property
    def passed_count(self) -> int:
        return sum(1 for t in self.manifest if self.outcomes.get(t) == "passed")

    @property
    def pass_rate(self) -> float:
        if self.problems or not self.manifest:
            return 0.0
        return self.passed_count / len(self.manifest)

    @property
    def all_passed(self) -> bool:
        return not self.problems and bool(self.manifest) and self.passed_count == len(self.manifest)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pass_rate": self.pass_rate,
            "passed": self.passed_count,
            "total": len(self.manifest),
            "outcomes": dict(self.outcomes),
            "problems": list(self.problems),
            "exit_code": self.exit_code,
            "removed_from_workspace": list(self.removed),
            "output_tail": self.output_tail,
        }


def restore_workspace(
    sandbox: Any, original_files: Mapping[str, str], protected: Sequence[str], *, root: str = "/workspace"
) -> list[str]:
    """Deletes steering files and protected paths from the workspace, then writes the originals back."""
    config = {"root": root, "names": STEERING_NAMES, "suffixes": STEERING_SUFFIXES, "protected": list(protected)}
    result = sandbox.exec(["python3", "-I", "-c", _HYGIENE], stdin=json.dumps(config), timeout=60)
    if not result.ok:
        raise RuntimeError(f"workspace hygiene failed: {result.stderr_text[-500:]}")
    removed = json.loads(result.stdout_text)
    restore = {
        path: content
        for path, content in original_files.items()
        if posixpath.basename(path) in STEERING_NAMES
        or path.endswith(STEERING_SUFFIXES)
        or any(fnmatch.fnmatch(path, p) for p in protected)
    }
    if restore:
        sandbox.write_files({posixpath.join(root, p): c for p, c in restore.items()})
    return removed


def pytest_ini(import_roots: Sequence[str]) -> str:
    return "[pytest]\npythonpath = " + " ".join(import_roots) + "\npython_files = test_*.py *_test.py\naddopts =\n"


def run_hidden_tests(
    sandbox: Any,
    tests: Mapping[str, str],
    *,
    manifest: Sequence[str] | None,
    original_files: Mapping[str, str] | None = None,
    protected: Sequence[str] = ("tests/*",),
    import_roots: Sequence[str] = ("/workspace",),
    timeout_s: float = 120.0,
    workspace: str = "/workspace",
) -> HiddenRun:
    """Runs ``tests`` (path under ``tests/`` -> source) against the workspace; see the module docstring.

    ``manifest`` is the sorted list of test ids the task declares; ``None``
    accepts whatever was collected (used only to compute a manifest when authoring).
    """
    sandbox.kill_all()
    removed = restore_workspace(sandbox, original_files or {}, protected, root=workspace)
    token = secrets.token_hex(16)
    root = f"/tmp/.agentrl-verify-{secrets.token_hex(12)}"
    files = {f"{root}/tests/{path}": source for path, source in tests.items()}
    files[f"{root}/pytest.ini"] = pytest_ini(import_roots)
    files[f"{root}/pytest_runner.py"] = (HARNESS_DIR / "pytest_runner.py").read_text()
    sandbox.write_files(files)
    nonce = secrets.token_bytes(32)
    # HOME moves out of the workspace, so no dotfile the agent left there is read while the tests run.
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "HOME": root}
    result = sandbox.exec(
        ["python3", "-I", "-B", f"{root}/pytest_runner.py", root, token, workspace],
        stdin=nonce,
        env=env,
        cwd=workspace,
        timeout=timeout_s,
    )
    sandbox.kill_all()
    tail = (result.stdout_text + result.stderr_text)[-2000:]
    problems: list[str] = []
    if result.timed_out:
        problems.append(f"the hidden tests did not finish within {timeout_s:g} s")
    verdict = _read_verdict(sandbox, f"{root}/verdict-{token}.json", nonce, problems)
    xml = _read(sandbox, f"{root}/junit-{token}.xml")
    outcomes: dict[str, str] = {}
    collected: list[str] = []
    if verdict is not None:
        collected = list(verdict.get("collected", []))
        outcomes = {str(k): str(v) for k, v in dict(verdict.get("outcomes", {})).items()}
        problems.extend(f"tampering: {t}" for t in verdict.get("tampered", []))
        problems.extend(f"collection error in {e}" for e in verdict.get("collect_errors", []))
        if xml is None or hashlib.sha256(xml).hexdigest() != verdict.get("xml_sha256"):
            problems.append("the JUnit report is missing or was altered after the run")
        else:
            problems.extend(_compare_with_junit(xml, outcomes))
        expected = sorted(manifest) if manifest is not None else sorted(collected)
        if sorted(collected) != expected:
            missing = sorted(set(expected) - set(collected))[:5]
            extra = sorted(set(collected) - set(expected))[:5]
            problems.append(
                f"collected {len(collected)} tests but the manifest lists {len(expected)} (missing {missing}, extra {extra})"
            )
    return HiddenRun(
        outcomes=outcomes,
        manifest=sorted(manifest) if manifest is not None else sorted(collected),
        collected=collected,
        problems=problems,
        exit_code=None if verdict is None else int(verdict.get("exit_code", -1)),
        removed=removed,
        output_tail=tail,
    )


def _read(sandbox: Any, path: str) -> bytes | None:
    try:
        return sandbox.read_file(path, max_bytes=MAX_REPORT_BYTES)
    except SandboxFileError:
        return None


def _read_verdict(sandbox: Any, path: str, nonce: bytes, problems: list[str]) -> dict[str, Any] | None:
    raw = _read(sandbox, path)
    if raw is None:
        problems.append("no verdict: the test process ended before reporting (early exit or crash)")
        return None
    try:
        envelope = json.loads(raw)
        body, mac = envelope["body"], envelope["mac"]
        expected = hmac.new(nonce, body.encode("utf-8"), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, str(mac)):
            problems.append("the verdict's signature does not match: it was forged")
            return None
        return json.loads(body)
    except (ValueError, KeyError, TypeError):
        problems.append("the verdict is unreadable")
        return None


def junit_key(nodeid: str) -> tuple[str, str]:
    """pytest's JUnit ``(classname, name)`` for a node id: ``a/test_b.py::C::t`` -> ``("a.test_b.C", "t")``."""
    path, *rest = nodeid.split("::")
    names = [posixpath.splitext(path)[0].replace("/", "."), *rest[:-1]]
    return ".".join(names), rest[-1] if rest else ""


def junit_outcomes(xml: bytes) -> dict[tuple[str, str], str]:
    """``{(classname, name): outcome}`` from a JUnit XML report (DTDs refused: the file is untrusted)."""
    if b"<!DOCTYPE" in xml or b"<!ENTITY" in xml:
        raise ValueError("the JUnit report declares a DTD or entities")
    out = {}
    for case in ET.fromstring(xml).iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        out[(case.get("classname", ""), case.get("name", ""))] = outcome
    return out


def _compare_with_junit(xml: bytes, outcomes: Mapping[str, str]) -> list[str]:
    try:
        reported = junit_outcomes(xml)
    except (ET.ParseError, ValueError) as exc:
        return [f"the JUnit report is malformed ({exc})"]
    problems = []
    for nodeid, outcome in outcomes.items():
        norm = "passed" if outcome == "passed" else ("skipped" if outcome in ("skipped", "xfailed") else "failed")
        junit = reported.get(junit_key(nodeid))
        if junit != norm:
            problems.append(f"JUnit report disagrees with the runner on {nodeid}: runner {outcome}, JUnit {junit}")
    passed_in_junit = sum(1 for o in reported.values() if o == "passed")
    passed_in_runner = sum(1 for o in outcomes.values() if o == "passed")
    if passed_in_junit != passed_in_runner:
        problems.append(f"JUnit report lists {passed_in_junit} passing tests, the runner {passed_in_runner}")
    return problems[:6]
