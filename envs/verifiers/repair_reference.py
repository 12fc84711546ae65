"""What a repair task's hidden data must hold, computed and cross-checked in fresh sandboxes at authoring time.

:func:`build_reference` runs the hidden tests through the split judge
(:mod:`envs.verifiers.split_judge`) on the gold repository (original files +
fix) and on the original files, each in a fresh sandbox of trusted files only,
and also under plain pytest in the same sandboxes. It requires that

* every hidden test passes on the gold repository, under both;
* both collect the same tests (the manifest);
* on the original code, the judge and plain pytest agree test by test: the
  proxy must not change what a test means (a test that relies on what cannot
  cross the process boundary, such as object identity across the call or
  subclassing a repository class, fails here instead of judging wrongly);
* some test fails on the original code (``fail_to_pass``): doing nothing must
  score 0.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from envs.verifiers.split_judge import repository_modules, run_hidden_tests

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
