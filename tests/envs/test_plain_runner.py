"""The judge's plain runner gives pytest's verdict on plain test files, and refuses every file it could misjudge.

Each case is a ``tests/`` directory run twice in fresh interpreters: by
``plain_runner.run`` and by pytest through the judge's own recorder (``repo_judge._run_pytest``),
with the module under test importable as it would be through the proxy. Collected ids, outcomes
(passed or not) and collection errors must agree. Then every file shape the runner does not
reproduce must be sent to pytest (:func:`plain_reason` names why), and the generated repair
tasks, the domain the fast path exists for, must all be plain.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envs.domains.repair.in_sandbox import plain_runner
from envs.domains.repair.in_sandbox.plain_runner import plain_reason
from envs.tasks import load_tasks

IN_SANDBOX = Path(plain_runner.__file__).parent
MODULE = "def add(a, b):\n    return a + b\n\ndef hang():\n    while True:\n        pass\n"

CASES = {
    "all pass": {
        "test_a.py": "from calc import add\n\ndef test_one():\n    assert add(1, 2) == 3\n\ndef test_two():\n    assert add(0, 0) == 0\n"
    },
    "one fails": {
        "test_a.py": "from calc import add\n\ndef test_ok():\n    assert add(1, 2) == 3\n\ndef test_bad():\n    assert add(1, 2) == 4\n"
    },
    "an error": {"test_a.py": "from calc import add\n\ndef test_err():\n    add(1)\n"},
    "returns a value": {"test_a.py": "def test_returns():\n    return 5\n"},
    "exits": {"test_a.py": "import sys\n\ndef test_exit():\n    sys.exit(0)\n"},
    "times out": {
        "test_a.py": "from calc import hang\n\ndef test_hang():\n    hang()\n\ndef test_after():\n    assert True\n"
    },
    "import error stops everything": {
        "test_a.py": "def test_fine():\n    assert True\n",
        "test_b.py": "from calc import missing\n\ndef test_never():\n    assert True\n",
    },
    "two files in name order, *_test.py too": {
        "test_z.py": "def test_late():\n    assert True\n",
        "b_test.py": "def test_early():\n    assert 1\n\ndef helper():\n    raise ValueError\n",
    },
    "source order, not name order": {
        "test_a.py": "def test_b():\n    assert True\n\ndef test_a():\n    assert False\n"
    },
    "no tests": {"test_a.py": "X = 1\n"},
}

RUN = """
import json, os, signal, sys
root, runner = sys.argv[1], sys.argv[2]
sys.path.insert(0, {in_sandbox!r}); sys.path.insert(0, os.path.join(root, "repo"))
import repo_judge
signal.signal(signal.SIGALRM, repo_judge._alarm)
sys.stdout = sys.stderr
if runner == "plain":
    import plain_runner
    arm = lambda: signal.setitimer(signal.ITIMER_REAL, 0.5)
    disarm = lambda: signal.setitimer(signal.ITIMER_REAL, 0)
    report = plain_runner.run(root, arm, disarm)
else:
    report = repo_judge._run_pytest(root, 0.5)
sys.__stdout__.write(json.dumps(report))
"""


def _verdict(root: Path, runner: str) -> dict:
    script = RUN.format(in_sandbox=str(IN_SANDBOX))
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # as the judge runs it
    done = subprocess.run(
        [sys.executable, "-B", "-c", script, str(root), runner], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    return {
        "collected": report["collected"],
        "passed": sorted(t for t, o in report["outcomes"].items() if o == "passed"),
        "not passed": sorted(t for t, o in report["outcomes"].items() if o != "passed"),
        "collect_errors": sorted(report["collect_errors"]),
        "exit_code": report["exit_code"],
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_plain_runner_gives_pytests_verdict(tmp_path, case):
    files = CASES[case]
    assert plain_reason(files) is None, plain_reason(files)
    (tmp_path / "tests").mkdir()
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "calc.py").write_text(MODULE)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts =\npython_files = test_*.py *_test.py\n")
    for name, source in files.items():
        (tmp_path / "tests" / name).write_text(source)
    plain, reference = _verdict(tmp_path, "plain"), _verdict(tmp_path, "pytest")
    assert plain == reference
    if case == "all pass":
        assert plain["passed"] == ["tests/test_a.py::test_one", "tests/test_a.py::test_two"]


@pytest.mark.parametrize(
    ("files", "why"),
    [
        (
            {"test_a.py": "import pytest\n\ndef test_x():\n    with pytest.raises(ValueError):\n        int('x')\n"},
            "imports pytest",
        ),
        ({"test_a.py": "from _pytest.python_api import approx\n\ndef test_x():\n    pass\n"}, "imports pytest"),
        ({"test_a.py": "def test_x(tmp_path):\n    pass\n"}, "arguments"),
        ({"test_a.py": "import functools\n\n@functools.lru_cache\ndef test_x():\n    pass\n"}, "decorators"),
        ({"test_a.py": "class TestThing:\n    def test_x(self):\n        pass\n"}, "TestThing"),
        ({"test_a.py": "def test_x():\n    yield 1\n"}, "generator"),
        ({"test_a.py": "async def test_x():\n    pass\n"}, "test_x"),
        ({"test_a.py": "def setup_module():\n    pass\n\ndef test_x():\n    pass\n"}, "setup_module"),
        ({"test_a.py": "def test_x():\n    pass\n\ndef test_x():\n    pass\n"}, "twice"),
        ({"test_a.py": "test_y = lambda: None\n"}, "test_y"),
        ({"test_a.py": "from os.path import join as test_join\n"}, "collect"),
        ({"test_a.py": "if True:\n    def test_x():\n        pass\n"}, "test_x"),
        ({"test_a.py": "pytestmark = []\n\ndef test_x():\n    pass\n"}, "pytestmark"),
        ({"test_a.py": "def test_x(:\n"}, "parse"),
        ({"conftest.py": "X = 1\n", "test_a.py": "def test_x():\n    pass\n"}, "not a test file"),
        ({"sub/test_a.py": "def test_x():\n    pass\n"}, "flat"),
        ({}, "no test files"),
    ],
)
def test_every_file_the_runner_could_misjudge_goes_to_pytest(files, why):
    assert why in (plain_reason(files) or "")


def test_the_generated_repair_tasks_run_on_the_plain_runner():
    for task in load_tasks("repair_gen:eval:40"):
        assert plain_reason(task.hidden["tests"]) is None, task.id


def test_the_judge_chooses_its_runner_from_the_tests(monkeypatch):
    """What the judge process is told: "plain" for plain files, "pytest" for anything else."""
    from envs.domains.repair import split_judge

    seen = []

    class Sandbox:
        def kill_all(self):
            pass

        def exec(self, argv, **kwargs):
            if argv[:3] == ["python3", "-I", "-B"]:
                seen.append(json.loads(kwargs["stdin"])["runner"])
            return type("R", (), {"ok": True, "stdout_text": "", "stderr_text": "", "timed_out": False,
                                  "exit_code": 0, "oom_killed": False})()  # fmt: skip

        def write_files(self, files, **kwargs):
            pass

        def read_file(self, path, **kwargs):
            return b""

    for tests in ({"test_a.py": "def test_x():\n    pass\n"}, {"test_a.py": textwrap.dedent("import pytest\n")}):
        split_judge.run_hidden_tests(Sandbox(), tests, modules=["calc"])
    assert seen == ["plain", "pytest"]
