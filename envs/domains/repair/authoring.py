"""Compiling a repair task: its gold patch, and hidden data cross-checked in fresh sandboxes.

:func:`build_reference` runs the hidden tests through the split judge
(:mod:`envs.domains.repair.split_judge`) on the gold repository (original
files + fix) and on the original files, each in a fresh sandbox of trusted
files only, and also under plain pytest in the same sandboxes. It requires that

* every hidden test passes on the gold repository, under both;
* both collect the same tests (the manifest);
* on the original code, the judge and plain pytest agree test by test: the
  proxy must not change what a test means (a test that relies on what cannot
  cross the process boundary, such as object identity across the call or
  subclassing a repository class, fails here instead of judging wrongly);
* some test fails on the original code (``fail_to_pass``): doing nothing must
  score 0.

:func:`compile_repair` is the ``repair`` compiler of ``python -m
envs.quality.authoring build``; the gold patch is a unified diff from
``files`` to ``fix`` (:func:`unified_patch`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from envs.domains.repair.split_judge import repository_modules, run_hidden_tests
from envs.quality.hooks import NEAR_MISSES, register_compiler, task_fields
from envs.tasks import Task, TaskError

PYTEST_DIR = "/tmp/.agentrl-reference-pytest"


class ReferenceError(ValueError):
    """The task cannot be judged soundly as written; the message names the tests."""


@dataclasses.dataclass(frozen=True)
class Reference:
    """The hidden data of a compiled repair task."""

    manifest: list[str]
    fail_to_pass: list[str]
    modules: list[str]

    def hidden(self, tests: Mapping[str, str]) -> dict[str, Any]:
        return {"tests": dict(tests), "manifest": list(self.manifest), "fail_to_pass": list(self.fail_to_pass)}


def build_reference(
    tests: Mapping[str, str],
    files: Mapping[str, str],
    fix: Mapping[str, str],
    *,
    backend: Any = "bwrap",
    import_roots: Sequence[str] = ("/workspace",),
    protected: Sequence[str] = ("tests/*",),
) -> Reference:
    """The task's :class:`Reference`; :class:`ReferenceError` when it cannot be judged soundly."""
    from sandbox import SandboxSpec, get_backend

    backend = get_backend(backend) if isinstance(backend, str) else backend
    modules = repository_modules(files, protected)
    if not modules:
        raise ReferenceError("the repository has no Python packages or modules for the tests to import")

    def both(workspace: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        with backend.create(SandboxSpec(memory_mb=1024, timeout_s=120)) as sandbox:
            sandbox.write_files(dict(workspace))
            run = run_hidden_tests(sandbox, tests, modules=modules, import_roots=import_roots)
            if run.problems:
                raise ReferenceError(f"the judge did not report: {run.problems} {run.judge_tail[-500:]}")
            return run.outcomes, pytest_outcomes(sandbox, tests, import_roots)

    gold, gold_plain = both({**files, **fix})
    manifest = sorted(gold_plain)
    if sorted(gold) != manifest:
        raise ReferenceError(f"the judge collects {sorted(gold)}, plain pytest {manifest}")
    failing = sorted(t for t in manifest if gold[t] != "passed" or gold_plain[t] != "passed")
    if failing:
        raise ReferenceError(f"the gold repository fails {failing} (judge: {gold}, pytest: {gold_plain})")
    original, original_plain = both(files)
    verdict = {t: original.get(t) == "passed" for t in manifest}
    disagree = sorted(t for t in manifest if verdict[t] != (original_plain.get(t) == "passed"))
    if disagree:
        raise ReferenceError(
            f"on the original code the judge and plain pytest disagree on {disagree} "
            f"(judge: {[original.get(t) for t in disagree]}, pytest: {[original_plain.get(t) for t in disagree]}): "
            "the test relies on something that does not cross the process boundary"
        )
    fail_to_pass = sorted(t for t in manifest if not verdict[t])
    if not fail_to_pass:
        raise ReferenceError("the original code already passes every hidden test: doing nothing would score")
    return Reference(manifest, fail_to_pass, modules)


def pytest_outcomes(sandbox: Any, tests: Mapping[str, str], import_roots: Sequence[str]) -> dict[str, str]:
    """``{node id: passed|failed|skipped}`` of plain pytest over ``tests`` (trusted files only: authoring)."""
    files = {f"{PYTEST_DIR}/tests/{path}": source for path, source in tests.items()}
    files[f"{PYTEST_DIR}/pytest.ini"] = "[pytest]\naddopts =\n"
    sandbox.write_files(files)
    argv = ["python3", "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-c", f"{PYTEST_DIR}/pytest.ini"]
    argv += [f"--rootdir={PYTEST_DIR}", f"{PYTEST_DIR}/tests"]
    env = {"PYTHONPATH": ":".join(import_roots), "PYTHONDONTWRITEBYTECODE": "1"}
    result = sandbox.exec(argv, env=env, cwd=PYTEST_DIR, timeout=120)
    sandbox.exec(["rm", "-rf", PYTEST_DIR], timeout=30)
    outcomes = {}
    for line in result.stdout_text.splitlines():
        match = re.match(r"(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (.+?)(?: - .*)?$", line)
        if match and "::" in match.group(2):
            outcomes[match.group(2)] = {"PASSED": "passed", "SKIPPED": "skipped"}.get(match.group(1), "failed")
    if not outcomes:
        raise ReferenceError(f"plain pytest reported nothing: {result.stdout_text[-500:]!r}")
    return outcomes


def unified_patch(before: dict[str, str], after: dict[str, str]) -> str:
    """A ``git diff``-style patch (``a/``, ``b/`` prefixes) turning ``before`` into ``after`` for changed paths."""
    chunks = []
    for path in sorted(after):
        old, new = before.get(path, ""), after[path]
        if old == new:
            continue
        diff = difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{path}" if path in before else "/dev/null",
            tofile=f"b/{path}",
        )
        chunks.append("".join(diff))
    if not chunks:
        raise TaskError("unified_patch: the fix changes nothing")
    return "".join(chunks)


@register_compiler("repair")
def compile_repair(records: list[dict[str, Any]], *, backend: str = "bwrap", **_: Any) -> list[Task]:
    """Repair tasks, one fresh-sandbox reference each: see :func:`compile_repair_record`."""
    return [compile_repair_record(r, backend=backend) for r in records]


def compile_repair_record(r: dict[str, Any], *, backend: str = "bwrap") -> Task:
    """One repair task from its source record (``files``, ``fix``, ``hidden_tests``, ...).

    The manifest and the ``fail_to_pass`` tests come from running the hidden tests the
    way verification will (a judge process with the repository behind a proxy) on the
    gold repository and the original files, each in a fresh sandbox, cross-checked with
    plain pytest (:func:`build_reference`).
    """
    files, fix = dict(r["files"]), dict(r["fix"])
    import_roots = r.get("import_roots", ["/workspace"])
    protected = r.get("protected", ["tests/*"])
    try:
        reference = build_reference(
            r["hidden_tests"], files, fix, backend=backend, import_roots=import_roots, protected=protected
        )
    except ReferenceError as exc:
        raise TaskError(f"repair source {r['id']!r}: {exc}") from exc
    metadata = {
        "source": "agentrl",
        "test_command": r.get("test_command", "python3 -m pytest -q tests"),
        "protected": protected,
    }
    if "import_roots" in r:
        metadata["import_roots"] = list(import_roots)
    print(
        f"  {r['id']}: {len(reference.manifest)} hidden tests, {len(reference.fail_to_pass)} fail before the fix",
        flush=True,
    )
    gold = {"patch": unified_patch(files, fix)}
    if r.get("near_misses"):
        gold[NEAR_MISSES] = near_misses(r)
    return Task(
        **task_fields(r, "repair"),
        files=files,
        hidden=reference.hidden(r["hidden_tests"]),
        gold=gold,
        metadata=metadata,
    )


def near_misses(r: dict[str, Any]) -> list[dict[str, str]]:
    """``gold["near_misses"]`` of a repair record: each ``{name, why, fix}`` as a patch from ``files``.

    A near miss is carried in the gold's own kind (a unified patch) so the environment plays it
    exactly as it plays the gold. One whose fix is the gold fix, or changes nothing, would not be
    a wrong end state at all: refused here, by name, rather than found by the gate.
    """
    files, fix = dict(r["files"]), dict(r["fix"])
    gold_state = {**files, **fix}
    compiled, seen = [], set()
    for i, miss in enumerate(r["near_misses"]):
        where = f"repair source {r['id']!r} near miss {miss.get('name', i)!r}"
        missing = [k for k in ("name", "why", "fix") if not miss.get(k)]
        if missing or not isinstance(miss["fix"], dict):
            raise TaskError(f"{where}: needs name, why and fix (path -> full new content); missing {missing}")
        if miss["name"] in seen:
            raise TaskError(f"{where}: the name is used twice")
        seen.add(miss["name"])
        state = {**files, **miss["fix"]}
        if state == gold_state:
            raise TaskError(f"{where}: its fix is the gold fix")
        if state == files:
            raise TaskError(f"{where}: its fix changes nothing")
        compiled.append({"name": miss["name"], "why": miss["why"], "patch": unified_patch(files, dict(miss["fix"]))})
    return compiled
