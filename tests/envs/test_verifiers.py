"""Verification records, composition from configs, the registry, and harness failures as anomalies."""

from __future__ import annotations

import json

import ml_collections
import pytest

from envs import Task, Verification, Verifier, VerifyContext, build_verifier, make_verifier, register_verifier
from envs.domains.math.answers import answers_match, extract_answer
from envs.domains.math.selfcheck import MATH_SAMPLES
from envs.domains.repair.verifier import score_fail_to_pass
from envs.episode import Episode
from envs.verifiers import VERIFIERS
from sandbox import SandboxSpec
from tests.envs.conftest import kill_underneath

MATH_TASK = Task(id="v/math", domain="math", prompt="2+2?", hidden={"answer": "4"})


def ctx_for(reply: str, turns: int = 1, task: Task = MATH_TASK) -> VerifyContext:
    episode = Episode(env_id="test", task_id=task.id, domain=task.domain, answer=reply, turns=turns)
    return VerifyContext(task=task, episode=episode, max_turns=4)


def test_verification_is_validated_and_json_round_trips():
    v = Verification(reward=0.5, passed=False, components={"outcome": 0.5}, details={"tests": [1, 2]})
    assert Verification.from_dict(json.loads(json.dumps(v.to_dict()))) == v
    for bad, field in (
        ({"reward": float("nan"), "passed": False}, "reward"),
        ({"reward": 1.0, "passed": 1}, "passed"),
        ({"reward": 1.0, "passed": True, "components": {"x": "high"}}, r"components\['x'\]"),
        ({"reward": 0.0, "passed": True, "anomaly": "sandbox_vanished"}, "passed"),
        ({"reward": 0.0, "passed": False, "anomaly": ""}, "anomaly"),
        ({"reward": 0.0, "passed": False, "details": {"x": object()}}, "details"),
    ):
        with pytest.raises(ValueError, match=f"Verification.{field}"):
            Verification(**bad)
    anomaly = Verification.anomalous("sandbox_vanished: gone", verifier="x")
    assert anomaly.is_anomaly and anomaly.reward == 0.0 and not anomaly.passed


def test_registry_and_options():
    assert {"hidden_tests", "math_answer", "function_tests", "sandbox_state", "pipeline_output"} <= set(VERIFIERS)
    assert {"tool_format", "turn_efficiency", "code_compiles"} <= set(VERIFIERS)
    with pytest.raises(KeyError, match="unknown name 'psychic'"):
        make_verifier("psychic")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['timeout'\]; options: \['scoring', 'timeout_s'\]"):
        make_verifier("hidden_tests", timeout=3)
    with pytest.raises(ValueError, match=r"hidden_tests\.scoring"):
        make_verifier("hidden_tests", scoring="vibes")
    with pytest.raises(TypeError, match="expected a Verifier subclass"):
        register_verifier("nope")(int)


def test_weighted_composition_from_a_config_dict():
    config = ml_collections.ConfigDict({"outcome": 1.0, "efficiency": 0.1, "tool_format": {"weight": 0.05}})
    verifier = build_verifier(config, roles={"outcome": "math_answer", "efficiency": "turn_efficiency"})
    solved = verifier.verify(ctx_for("\\boxed{4}", turns=1))
    assert solved.passed and solved.components == {"outcome": 1.0, "efficiency": 1.0, "tool_format": 1.0}
    assert solved.reward == pytest.approx(1.15)
    slow = verifier.verify(ctx_for("\\boxed{4}", turns=4))
    assert slow.components["efficiency"] == 0.25 and slow.reward == pytest.approx(1.0 + 0.025 + 0.05)
    wrong = verifier.verify(ctx_for("\\boxed{5}", turns=1))
    # efficiency is gated by the outcome: answering wrong *fast* earns nothing for speed
    assert not wrong.passed and wrong.reward == pytest.approx(0.05)
    assert set(wrong.details) == {"outcome", "efficiency", "tool_format"}
    ungated = build_verifier(
        {"outcome": 1.0, "efficiency": {"weight": 0.1, "gated": False}}, {"outcome": "math_answer"}
    )
    assert ungated.verify(ctx_for("\\boxed{5}")).reward == pytest.approx(0.1)
    with pytest.raises(TypeError, match=r"verifier config \['outcome'\]"):
        build_verifier({"outcome": "high"}, {"outcome": "math_answer"})


def test_sandbox_verifier_without_a_sandbox_is_an_anomaly():
    task = Task(id="v/state", domain="shell", prompt="p", hidden={"checks": [{"type": "file", "path": "x"}]})
    result = make_verifier("sandbox_state").verify(VerifyContext(task=task))
    assert result.anomaly.startswith("no_sandbox") and not result.passed


def test_a_crashing_verifier_is_an_anomaly_not_a_failure():
    task = Task(id="v/state", domain="shell", prompt="p", hidden={"checks": "not a list"})
    result = make_verifier("sandbox_state").verify(VerifyContext(task=task, sandbox=object()))
    assert result.anomaly.startswith("verifier_error: ValueError") and "traceback" in result.details


def test_a_sandbox_dying_during_verification_is_an_anomaly(pool):
    sandbox = pool.acquire(SandboxSpec(memory_mb=512, timeout_s=30.0))
    task = Task(id="v/state", domain="shell", prompt="p", hidden={"checks": [{"type": "file", "path": "x"}]})
    kill_underneath(sandbox)
    result = build_verifier({"outcome": 1.0}, {"outcome": "sandbox_state"}).verify(
        VerifyContext(task=task, sandbox=sandbox)
    )
    assert result.anomaly.startswith("outcome: sandbox_") and result.reward == 0.0 and not result.passed
    pool.release(sandbox)  # closed, not pooled, since it is unhealthy


@pytest.mark.parametrize("reference,reply,expect", MATH_SAMPLES)
def test_math_answers_by_value(reference, reply, expect):
    answer, _ = extract_answer(reply)
    assert (answer is not None and answers_match(reference, answer)) is expect


def test_math_extraction_rules():
    assert extract_answer("so \\boxed{\\frac{a}{b}} done") == ("\\frac{a}{b}", "boxed")
    assert extract_answer("Work...\n#### 1,234") == ("1,234", "hashes")
    assert extract_answer("The final answer is: 7.") == ("7", "phrase")
    assert extract_answer("I get 3 then 5/2") == ("5/2", "last_number")
    assert extract_answer("") == (None, "empty")


def test_fail_to_pass_scoring():
    manifest = ["t::a", "t::b", "t::c"]
    assert score_fail_to_pass({"t::a": "passed", "t::b": "passed", "t::c": "failed"}, manifest, ["t::b", "t::c"]) == 0.5
    assert score_fail_to_pass({"t::a": "failed", "t::b": "passed", "t::c": "passed"}, manifest, ["t::b", "t::c"]) == 0.0


def test_process_verifiers():
    task = Task(id="v/p", domain="d", prompt="p")
    episode = Episode(env_id="e", task_id=task.id, domain="d", turns=3)
    result = make_verifier("turn_efficiency", tool_time_budget_s=10).verify(
        VerifyContext(task, episode=episode, max_turns=4)
    )
    assert result.reward == pytest.approx(0.5) and result.details["tool_time_s"] == 0.0
    assert make_verifier("tool_format").verify(VerifyContext(task, episode=episode)).reward == 1.0


class _Counting(Verifier):
    needs_sandbox = False

    def check(self, ctx):
        return self.result(1.0)


def test_custom_verifier_registration_and_result_helper():
    register_verifier("counting_for_test")(_Counting)
    result = make_verifier("counting_for_test").verify(ctx_for(""))
    assert result.passed and result.components == {"counting_for_test": 1.0} and result.verifier == "counting_for_test"
