"""A repository object reaches the hidden tests as a handle with one answer, through RepoRepair on both backends.

The attack: a ``sort_list`` that does not sort, returning an object whose every
look at it answers afresh from candidate code. Its first pass yields the input
(so "is a permutation of the input" holds), every later pass yields nothing and
``len`` then says 0 (so "is in order" holds vacuously). Each assertion is met,
no single value meets both. Judged beside the code (the control) it passes;
through the proxy, a look is asked once until the repository next acts, so the
second pass sees the first pass's items and the test fails. The gold solution
returns a plain list and passes.
"""

from __future__ import annotations

from envs.quality.hooks import SUBMIT, write
from envs.quality.validate import play
from envs.tasks import Task
from tests.envs.conftest import make_env

BUGGY = "def sort_list(xs):\n    return list(xs)\n"
GOLD = "def sort_list(xs):\n    return sorted(xs)\n"
FICKLE = '''class Fickle:
    """Answers each look by how many looks came before: the input once, then nothing."""

    def __init__(self, xs):
        self.xs, self.seen = list(xs), {"iter": 0, "len": 0, "bool": 0}

    def _look(self, kind):
        self.seen[kind] += 1
        return self.xs if self.seen[kind] == 1 else []

    def __iter__(self):
        return iter(self._look("iter"))

    def __len__(self):
        return len(self._look("len"))

    def __bool__(self):
        return bool(self._look("bool"))


def sort_list(xs):
    return Fickle(xs)
'''
HIDDEN = {
    "test_sort.py": "from sorter.core import sort_list\n\n\n"
    "def test_sorted_permutation():\n"
    "    out = sort_list([3, 1, 2])\n"
    "    assert out and len(out) == 3 and sorted(out) == [1, 2, 3]\n"
    "    items = list(out)\n"
    "    assert all(items[i] <= items[i + 1] for i in range(len(out) - 1))\n"
}
TASK = Task(
    id="repair/fickle-sort",
    domain="repair",
    prompt="sort_list() does not sort.",
    files={"sorter/__init__.py": "", "sorter/core.py": BUGGY},
    hidden={"tests": HIDDEN, "manifest": ["tests/test_sort.py::test_sorted_permutation"]},
)
BESIDE = (
    "mkdir -p /tmp/beside/tests && cd /tmp/beside && "
    "PYTHONPATH=/workspace python3 -m pytest -q -p no:cacheprovider -rA tests"
)


def test_a_handle_answers_every_look_the_same(pool):
    env = make_env("agentrl/RepoRepair-v0", pool, verifier={"outcome": {"weight": 1.0, "scoring": "all_or_nothing"}})
    gold = play(env, TASK, [write("sorter/core.py", GOLD), SUBMIT])
    fickle = play(env, TASK, [write("sorter/core.py", FICKLE), SUBMIT])
    env.reset(options={"task": TASK})  # control: beside the code, each look gets a fresh answer and the test passes
    env.step(write("sorter/core.py", FICKLE))
    env.sandbox.write_files({f"/tmp/beside/tests/{p}": s for p, s in HIDDEN.items()})
    beside = env.sandbox.exec(BESIDE, timeout=60).stdout_text
    env.close()
    assert "PASSED tests/test_sort.py::test_sorted_permutation" in beside, beside[-1500:]
    assert (gold["reward"], gold["passed"], gold["anomaly"]) == (1.0, True, None), gold["details"]
    assert (fickle["reward"], fickle["passed"], fickle["anomaly"]) == (0.0, False, None), fickle["details"]
