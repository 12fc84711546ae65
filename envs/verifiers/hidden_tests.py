"""``hidden_tests``: the outcome of repository tasks, from hidden tests run by the hardened harness.

The task declares ``hidden.tests`` (path under ``tests/`` -> source),
``hidden.manifest`` (the sorted pytest node ids those tests must collect) and
``hidden.fail_to_pass`` (the ids that fail on the original code); the verdict
comes from :func:`envs.verifiers.harness.run_hidden_tests`. ``passed`` needs
every test to pass. The score (``scoring`` option):

* ``fail_to_pass`` (default): 0 if any test that passed before now fails (a
  regression), else the share of the fail-to-pass tests that now pass. Doing
  nothing scores 0, whatever share of the suite the original code passes.
* ``pass_rate``: passed / manifest.  * ``all_or_nothing``: 1 if everything passes.

A rejected run (early exit, tampering, a collected set that differs from the
manifest) scores 0 under every rule.
"""

from __future__ import annotations

from envs.verifiers.base import Verification, Verifier, VerifyContext, register_verifier
from envs.verifiers.harness import run_hidden_tests


@register_verifier("hidden_tests")
class HiddenTestsVerifier(Verifier):
    """Pass rate of the task's hidden tests (``all_or_nothing`` turns it into 0/1)."""

    role = "outcome"
    OPTIONS = {"timeout_s": 120.0, "scoring": "fail_to_pass"}
    SCORINGS = ("fail_to_pass", "pass_rate", "all_or_nothing")

    def __init__(self, **options):
        super().__init__(**options)
        if self.options["scoring"] not in self.SCORINGS:
            raise ValueError(f"hidden_tests.scoring: expected one of {self.SCORINGS}, got {self.options['scoring']!r}")

    def check(self, ctx: VerifyContext) -> Verification:
        task = ctx.task
        hidden = task.hidden
        if "tests" not in hidden or "manifest" not in hidden:
            raise ValueError(f"task {task.id!r}: hidden_tests needs hidden.tests and hidden.manifest")
        run = run_hidden_tests(
            ctx.sandbox,
            hidden["tests"],
            manifest=hidden["manifest"],
            original_files=task.files,
            protected=task.metadata.get("protected", ["tests/*"]),
            import_roots=task.metadata.get("import_roots", ["/workspace"]),
            timeout_s=float(task.metadata.get("hidden_timeout_s", self.options["timeout_s"])),
        )
        scoring = self.options["scoring"]
        fail_to_pass = hidden.get("fail_to_pass")
        if scoring == "fail_to_pass" and fail_to_pass:
            score = score_fail_to_pass(run.outcomes, run.manifest, fail_to_pass) if not run.problems else 0.0
        elif scoring == "all_or_nothing":
            score = float(run.all_passed)
        else:
            score = run.pass_rate
        return self.result(score, passed=run.all_passed, details={**run.to_dict(), "scoring": scoring})


def score_fail_to_pass(outcomes: dict[str, str], manifest: list[str], fail_to_pass: list[str]) -> float:
    """Share of ``fail_to_pass`` now passing, or 0 if any previously passing test regressed."""
    targets = set(fail_to_pass)
    if any(outcomes.get(t) != "passed" for t in manifest if t not in targets):
        return 0.0
    return sum(1 for t in targets if outcomes.get(t) == "passed") / len(targets)
