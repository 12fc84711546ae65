"""``hidden_tests``: the outcome of repository tasks, from hidden tests the code under test cannot reach.

The task declares ``hidden.tests`` (path under ``tests/`` -> source),
``hidden.manifest`` (the sorted pytest node ids those tests collect) and
``hidden.fail_to_pass`` (the ids that fail on the original code). Verification:
``kill_all``, workspace hygiene (:func:`~envs.domains.repair.workspace.restore_workspace`:
bytecode, ``.pth``/``sitecustomize`` hooks and config files go, visible tests
are restored), then the tests run in a judge process under its own uid with
the repository behind a plain-data proxy (:mod:`envs.domains.repair.split_judge`).
The judge never executes the repository's code, so its report is the verdict:
no nonce, signature or integrity check of the test process is needed, and none
is kept. A test that the judge did not report (its module failed to import the
repository, the repository hung or died) counts as failed.

There is no separate pytest "process" signal from the visible tests: one that
counted without the outcome would pay hacks that game pytest, and one gated on
the outcome would repeat it. ``passed`` needs every test to pass. The score
(``scoring`` option):

* ``all_or_nothing`` (default): 1 if every test passes, else 0. A share would pay
  the near misses a policy finds first (a partial fix, the visible input
  special-cased, the bug moved) a part of the reward; ``details["pass_rate"]``
  keeps the share for reading runs.
* ``fail_to_pass``: 0 if any test that passed before now fails (a regression),
  else the share of the fail-to-pass tests that now pass (denser, and gameable
  by partial fixes). Doing nothing scores 0.
* ``pass_rate``: passed / manifest.

A run without a report (the judge timed out) scores 0 under every rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envs.domains.repair.split_judge import repository_modules, run_hidden_tests
from envs.domains.repair.workspace import WorkspaceError, restore_workspace
from envs.verifiers.base import Verification, Verifier, VerifyContext, register_verifier

TEST_TIMEOUT_S = 30.0  # per test (task metadata ``test_timeout_s``); ``timeout_s`` bounds the whole run


@register_verifier("hidden_tests")
class HiddenTestsVerifier(Verifier):
    """Pass rate of the task's hidden tests (``all_or_nothing`` turns it into 0/1)."""

    role = "outcome"
    OPTIONS = {"timeout_s": 120.0, "scoring": "all_or_nothing"}
    SCORINGS = ("fail_to_pass", "pass_rate", "all_or_nothing")

    def __init__(self, **options):
        super().__init__(**options)
        if self.options["scoring"] not in self.SCORINGS:
            raise ValueError(f"hidden_tests.scoring: expected one of {self.SCORINGS}, got {self.options['scoring']!r}")

    def check(self, ctx: VerifyContext) -> Verification:
        task = ctx.task
        hidden, meta = task.hidden, task.metadata
        if not hidden.get("tests") or not hidden.get("manifest"):
            raise ValueError(f"task {task.id!r}: hidden_tests needs a non-empty hidden.tests and hidden.manifest")
        manifest = sorted(hidden["manifest"])
        protected = meta.get("protected", ["tests/*"])
        details: dict[str, Any] = {"scoring": self.options["scoring"], "total": len(manifest)}
        ctx.sandbox.kill_all()
        try:
            details["removed_from_workspace"] = restore_workspace(ctx.sandbox, task.files, protected)
        except WorkspaceError as exc:
            return self.result(0.0, passed=False, details={**details, "passed": 0, "problems": [str(exc)]})
        run = run_hidden_tests(
            ctx.sandbox,
            hidden["tests"],
            modules=meta.get("repo_modules") or repository_modules(task.files, protected),
            import_roots=meta.get("import_roots", ["/workspace"]),
            timeout_s=float(meta.get("hidden_timeout_s", self.options["timeout_s"])),
            test_timeout_s=float(meta.get("test_timeout_s", TEST_TIMEOUT_S)),
        )
        outcomes = {t: run.outcomes.get(t, "not run") for t in manifest}
        passed_count = sum(1 for o in outcomes.values() if o == "passed")
        passed = not run.problems and passed_count == len(manifest)
        scoring = self.options["scoring"]
        if run.problems:
            score = 0.0
        elif scoring == "fail_to_pass" and hidden.get("fail_to_pass"):
            score = score_fail_to_pass(outcomes, manifest, hidden["fail_to_pass"])
        elif scoring == "all_or_nothing":
            score = float(passed)
        else:
            score = passed_count / len(manifest)
        details.update(
            pass_rate=passed_count / len(manifest),
            passed=passed_count,
            outcomes=outcomes,
            problems=run.problems,
            collect_errors=run.collect_errors,
            repository_link=run.link,
            judge_tail=run.judge_tail,
            repository_tail=run.server_tail,
        )
        return self.result(score, passed=passed, details=details)


def score_fail_to_pass(outcomes: Mapping[str, str], manifest: list[str], fail_to_pass: list[str]) -> float:
    """Share of ``fail_to_pass`` now passing, or 0 if any previously passing test regressed."""
    targets = set(fail_to_pass)
    if any(outcomes.get(t) != "passed" for t in manifest if t not in targets):
        return 0.0
    return sum(1 for t in targets if outcomes.get(t) == "passed") / len(targets)
