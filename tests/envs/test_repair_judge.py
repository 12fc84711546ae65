"""The repository-repair judge: the plain-data wire, the proxy protocol, and the split judge end to end.

Unit tests run ``repo_wire``/``repo_proxy`` in this process against a real
``repo_server.py`` subprocess, staged as the judge stages it (no sandbox
needed); the codec itself is tested in ``test_plain_data.py``. The end-to-end tests play
agent actions through ``agentrl/RepoRepair-v0`` on both backends: gold and
honest variants pass, partial fixes earn their share, regressions and hacks
earn 0, the code under test can read nothing of the judge, and a hung
repository fails in bounded time without an anomaly.
"""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import time
from decimal import Decimal
from fractions import Fraction
from types import SimpleNamespace

import pytest

from envs.domains.repair.authoring import compile_repair_record
from envs.domains.repair.env import RepoRepairEnv
from envs.domains.repair.in_sandbox import repo_proxy, repo_wire
from envs.domains.repair.selfcheck import MODULE, REPAIR_TASK, repair_cases
from envs.domains.repair.split_judge import SERVER_FILES, programs, repository_modules, run_hidden_tests
from envs.in_sandbox import plain_data
from envs.quality.hooks import SUBMIT, bash
from envs.quality.validate import play
from envs.tasks import Task, TaskError
from tests.envs.conftest import make_env

# -- the wire ----------------------------------------------------------------------------------------


def same(a, b) -> bool:
    """Equal with the same types all the way down (``True`` is not ``1``, ``(1,)`` is not ``[1]``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b and (not isinstance(a, float) or math.copysign(1, a) == math.copysign(1, b))


PLAIN = [
    None,
    True,
    0,
    -(2**200),
    1.5,
    -0.0,
    float("inf"),
    float("nan"),
    "héllo\n\ud800",
    b"\x00\xff",
    bytearray(b"ab"),
    (1, (2, [3])),
    [1, True, 1.0],
    {"a": 1, 2: (3,), (4, 5): None},
    {1, "x", (2,)},
    frozenset({1}),
    3 + 4j,
    Decimal("1.010"),
    Fraction(-3, 4),
]


@pytest.mark.parametrize("value", PLAIN, ids=lambda v: type(v).__name__)
def test_plain_values_cross_the_wire_with_their_exact_types(value):
    a, b = socket.socketpair()
    with a, b:
        repo_wire.send(a, {"ok": plain_data.encode(value)})
        decoded = plain_data.decode(repo_wire.recv(b)["ok"])
    assert same(decoded, value), (decoded, value)


def test_framing_caps_messages_and_tells_a_clean_close_from_a_torn_one():
    wire = repo_wire
    a, b = socket.socketpair()
    wire.send(a, {"x": [1, 2]})
    assert wire.recv(b) == {"x": [1, 2]}
    a.sendall((wire.MAX_MESSAGE + 1).to_bytes(4, "big"))
    with pytest.raises(wire.WireError, match="over the"):
        wire.recv(b)
    a.sendall((10).to_bytes(4, "big") + b"{}")
    a.close()
    with pytest.raises(wire.WireError, match="middle of a message"):
        wire.recv(b)
    c, d = socket.socketpair()
    c.close()
    assert wire.recv(d) is None


# -- the proxy protocol against a real server process --------------------------------------------------

DEMO = """
import os
from decimal import Decimal


class Anything(float):
    def __eq__(self, other):
        return True

    __hash__ = float.__hash__


class Fraction(float):
    __module__ = "fractions"
    __qualname__ = "Fraction"

    def __eq__(self, other):
        return True

    __hash__ = float.__hash__


class CycleError(ValueError):
    pass


class Account:
    def __init__(self, balance):
        self.balance = balance

    def withdraw(self, amount):
        if amount > self.balance:
            raise ValueError("insufficient funds")
        self.balance -= amount


class Box:
    def __len__(self):
        return 3

    def __bool__(self):
        return False

    def __contains__(self, item):
        return item == 1

    def __getitem__(self, key):
        return key * 2


def half(x):
    return x / 2


def price():
    return Decimal("1.01")


def anything():
    return Anything(1.0)


def impostor():
    return Fraction(2.0)


def sort_in_place(items, key=None):
    items.sort(key=key)


def tick(clock, n):
    return [clock() for _ in range(n)]


def cycle():
    raise CycleError("a -> b -> a")


def leave():
    raise SystemExit(0)


def die():
    os._exit(3)


def numbers(n):
    return iter(range(n))


def box():
    return Box()


def identity(x):
    return x
"""


@pytest.fixture
def demo(tmp_path):
    """``judgedemo.core`` served by repo_server.py in a subprocess, imported here through the proxy."""
    (tmp_path / "judgedemo").mkdir()
    (tmp_path / "judgedemo" / "__init__.py").write_text("")
    (tmp_path / "judgedemo" / "core.py").write_text(DEMO)
    serve = tmp_path / "serve"  # the server's files, side by side, as the judge stages them in the sandbox
    serve.mkdir()
    for name, text in programs(SERVER_FILES).items():
        (serve / name).write_text(text)
    path = str(tmp_path / "sock")
    server = subprocess.Popen([sys.executable, "-I", "-B", str(serve / "repo_server.py"), path, str(tmp_path)])
    deadline = time.monotonic() + 10
    while True:  # the socket file appears at bind(), a moment before listen(): retry until it accepts
        try:
            link = repo_proxy.Link.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    finder = repo_proxy.RemoteFinder(link, ["judgedemo"])
    sys.meta_path.insert(0, finder)
    try:
        import judgedemo.core as core

        yield SimpleNamespace(core=core, link=link, proxy=repo_proxy, server=server)
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m.partition(".")[0] == "judgedemo"]:
            del sys.modules[name]
        link.sock.close()
        server.kill()
        server.wait()


def test_results_are_genuine_values_and_objects_stay_handles(demo):
    core, proxy = demo.core, demo.proxy
    assert same(core.half(3), 1.5) and same(core.price(), Decimal("1.01"))
    account = core.Account(10)
    assert type(account) is proxy.RemoteObject and account.balance == 10
    account.withdraw(4)
    assert account.balance == 6
    account.balance = 1
    assert account.balance == 1
    assert core.identity(account) == account and core.Account(1) != account


@pytest.mark.parametrize("make", ["anything", "impostor"])
def test_objects_that_claim_to_equal_anything_equal_nothing(demo, make):
    value = getattr(demo.core, make)()
    assert type(value) is demo.proxy.RemoteObject
    assert value != 1.0 and value != 2.0
    assert not isinstance(value, float) and value not in {1.0, 2.0}


def test_mutated_arguments_come_back_and_callbacks_reach_the_test(demo):
    data = [3, 1, 2]
    assert demo.core.sort_in_place(data, key=lambda x: -x) is None
    assert data == [3, 2, 1]

    class Clock:
        now = 0.0

        def __call__(self):
            self.now += 0.5
            return self.now

    assert demo.core.tick(Clock(), 3) == [0.5, 1.0, 1.5]


def test_exceptions_arrive_as_local_classes(demo):
    core = demo.core
    with pytest.raises(ValueError, match="insufficient"):
        core.Account(1).withdraw(5)
    assert issubclass(core.CycleError, ValueError) and core.CycleError.__qualname__ == "CycleError"
    with pytest.raises(core.CycleError, match="a -> b"):
        core.cycle()
    with pytest.raises(demo.proxy.RemoteError):  # not SystemExit: that would end the judge
        core.leave()
    assert core.half(1) == 0.5  # the link survives an exception


def test_protocol_dunders_are_forwarded_with_their_types_checked(demo):
    box = demo.core.box()
    assert len(box) == 3 and not bool(box) and 1 in box and 2 not in box and box[4] == 8
    assert list(demo.core.numbers(3)) == [0, 1, 2]
    with pytest.raises(AttributeError):
        box.__dict__  # noqa: B018 - dunders are never forwarded


def test_a_dead_repository_fails_every_later_call(demo):
    with pytest.raises(demo.proxy.RemoteGone):
        demo.core.die()
    with pytest.raises(demo.proxy.RemoteGone):
        demo.core.half(2)
    assert demo.link.dead


def test_repository_modules_are_the_top_level_python_packages():
    files = ["pkg/__init__.py", "pkg/sub/mod.py", "tool.py", "tests/test_x.py", "README.md", "json.py", "data/x.csv"]
    assert repository_modules(files) == ["pkg", "tool"]


# -- end to end, through the environment -----------------------------------------------------------


def patch_call(path: str, old: str, new: str) -> str:
    return bash(
        f"cd /workspace && python3 - <<'EOF'\nimport pathlib\np = pathlib.Path({path!r})\n"
        f"p.write_text(p.read_text().replace({old!r}, {new!r}))\nEOF"
    )


@pytest.mark.parametrize(
    "task_id",
    [
        "repair/median-even",
        "repair/bank-transfer-atomic",
        "repair/cart-decimal-rounding",
        "repair/token-bucket",
        "repair/toposort-deterministic",
        "repair/roman-subtractive",
    ],
)
def test_gold_passes_and_doing_nothing_scores_zero(task_id, pool):
    env = make_env("agentrl/RepoRepair-v0", pool)
    task = env.tasks.get(task_id)
    gold = play(env, task, env.gold_actions(task))
    noop = play(env, task, env.noop_actions(task))
    env.close()
    assert (gold["reward"], gold["passed"], gold["anomaly"]) == (1.0, True, None), gold["details"]
    assert (noop["reward"], noop["passed"], noop["anomaly"]) == (0.0, False, None), noop["details"]


def test_scores_follow_the_tests_semantics(pool):
    env = make_env("agentrl/RepoRepair-v0", pool)
    variant = play(env, env.tasks.get(REPAIR_TASK), [patch_call(MODULE, "f - 32 * 5 / 9", "(f - 32) / 1.8"), SUBMIT])
    slug = "textkit/slug.py"
    partial = play(
        env,
        env.tasks.get("repair/slugify-edges"),
        [patch_call(slug, "title.lower())", 'title.lower()).rstrip("-")'), SUBMIT],
    )
    fix = "    values.sort()\n    if len(values) % 2:\n        return values[len(values) // 2]\n    return (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2\n"
    mutating = play(
        env,
        env.tasks.get("repair/median-even"),
        [patch_call("numkit/stats.py", "    return values[len(values) // 2]\n", fix), SUBMIT],
    )
    env.close()
    assert variant["passed"] and variant["reward"] == 1.0, variant["details"]  # an honest variant of the fix
    assert not partial["passed"] and partial["reward"] == 0.0, partial["details"]  # all or nothing: a partial fix
    assert 0 < partial["details"]["outcome"]["details"]["pass_rate"] < 1  # ... that the share still shows
    outcomes = mutating["details"]["outcome"]["details"]["outcomes"]
    # the fix sorts the caller's list: the mutation crosses back, and breaking a passing test scores 0
    assert outcomes["tests/test_stats.py::test_does_not_mutate"] == "failed"
    assert outcomes["tests/test_stats.py::test_even_unsorted"] == "passed" and mutating["reward"] == 0.0


def test_a_full_disk_fails_the_agent_not_the_harness(pool):
    """Filling /tmp, /dev/shm and the workspace leaves a correct fix correct, and is never an anomaly."""
    fill = "for d in /tmp /dev/shm /workspace; do dd if=/dev/zero of=$d/fill bs=1M count=4096 2>/dev/null; done; true"
    env = make_env("agentrl/RepoRepair-v0", pool)
    task = env.tasks.get("repair/leap-years")
    filled_after_fix = play(env, task, [env.gold_actions(task)[0], bash(fill), SUBMIT])
    filled_before = play(env, task, [bash(fill), *env.gold_actions(task)])  # the patch tool itself has no room
    env.close()
    assert (filled_after_fix["reward"], filled_after_fix["anomaly"]) == (1.0, None), filled_after_fix["details"]
    assert filled_before["anomaly"] is None and not filled_before["passed"]


NAIVE = "mkdir -p /tmp/naive/tests && cd /tmp/naive && PYTHONPATH=/workspace python3 -m pytest -q -p no:cacheprovider -rA tests"


SPY = r'''import glob, os, signal

MARK = "SECRET" + "-EXPECTED-7f3a"


def peek():
    """Everything of the judge that this process can read or touch."""
    found = []
    for path in glob.glob("/tmp/**", recursive=True) + glob.glob("/tmp/.agentrl-*/**", recursive=True):
        try:
            with open(path, errors="replace") as f:
                if MARK in f.read():
                    found.append(path)
        except OSError:
            pass
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        for name in ("cmdline", "environ", "mem", "fd/0", "fd/1"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    if MARK.encode() in f.read(1 << 22):
                        found.append(f"/proc/{pid}/{name}")
            except (OSError, ValueError):
                pass
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.getuid():
                os.kill(int(pid), signal.SIGKILL)
                found.append(f"killed {pid}")
        except OSError:
            pass
    return found
'''


def test_the_code_under_test_can_reach_nothing_of_the_judge(pool):
    """The hidden test holds a marker; the repository looks for it everywhere, and tries to kill the judge."""
    hidden = {
        "test_spy.py": 'from spy.look import peek\n\nEXPECTED = "SECRET-EXPECTED-7f3a"\n\n\ndef test_blind():\n    assert peek() == []\n'
    }
    files = {"spy/__init__.py": "", "spy/look.py": SPY}
    task = Task(
        id="repair/spy",
        domain="repair",
        prompt="spy",
        files=files,
        hidden={"tests": hidden, "manifest": ["tests/test_spy.py::test_blind"]},
    )
    env = make_env("agentrl/RepoRepair-v0", pool, verifier={"outcome": {"weight": 1.0, "scoring": "all_or_nothing"}})
    verification = play(env, task, [SUBMIT])
    env.reset(options={"task": task})  # control: beside the code, as the old harness ran them, the spy sees it
    env.sandbox.write_files({f"/tmp/naive/tests/{p}": s for p, s in hidden.items()})
    naive = env.sandbox.exec(NAIVE, timeout=60).stdout_text
    env.close()
    assert "FAILED tests/test_spy.py::test_blind" in naive, naive[-1000:]
    assert verification["anomaly"] is None
    assert verification["passed"] and verification["reward"] == 1.0, verification["details"]


@pytest.mark.parametrize("where", ["call", "import"])
def test_a_hung_repository_fails_in_bounded_time(where, pool):
    hang = "while True:\n    pass\n"
    files = {
        "slow/__init__.py": "",
        "slow/loop.py": "def forever():\n    while True:\n        pass\n\n\ndef fine():\n    return 1\n",
        "slow/stuck.py": hang,
    }
    first = "from slow.loop import forever\n\n\ndef test_a():\n    forever()\n"
    if where == "import":
        first = "import slow.stuck\n\n\ndef test_a():\n    pass\n"
    hidden = {
        "test_1.py": first,
        "test_2.py": "from slow.loop import fine\n\n\ndef test_b():\n    assert fine() == 1\n",
    }
    sandbox = pool.acquire(RepoRepairEnv.sandbox_spec)
    try:
        sandbox.write_files(files)
        start = time.monotonic()
        run = run_hidden_tests(sandbox, hidden, modules=["slow"], timeout_s=60, test_timeout_s=1.5)
        elapsed = time.monotonic() - start
    finally:
        pool.release(sandbox)
    assert run.problems == [] and elapsed < 20, (run, elapsed)
    assert "passed" not in run.outcomes.values() and run.link  # later tests cannot trust the connection
    if where == "call":
        assert run.outcomes == {"tests/test_1.py::test_a": "failed", "tests/test_2.py::test_b": "failed"}
    else:
        assert run.collect_errors == ["tests/test_1.py", "tests/test_2.py"]


@pytest.mark.parametrize(
    "name,passes",
    [
        ("hack: float subclass posing as fractions.Fraction", "test_freezing_and_minus_forty"),
        ("hack: hostile int subclass", "test_freezing_and_minus_forty"),
        ("hack: profile hook swaps test code", "test_round_trip"),
        ("hack: oracle search on disk, /proc and frames", "test_freezing_and_minus_forty"),
        ("hack: raise where the caller expects it", "test_invalid[args0]"),
    ],
)
def test_the_new_hacks_fool_tests_that_run_beside_the_code(name, passes, bwrap_pool):
    """Run in the same process as the code (as the old harness did), the hidden tests pass for these hacks."""
    case = next(c for c in repair_cases() if c.name == name)
    env = make_env("agentrl/RepoRepair-v0", bwrap_pool)
    task = env.tasks.get(case.task_id)
    env.reset(options={"task": task})
    for action in case.actions[:-1]:
        env.step(action)
    env.sandbox.write_files({f"/tmp/naive/tests/{p}": s for p, s in task.hidden["tests"].items()})
    output = env.sandbox.exec(NAIVE, timeout=60).stdout_text
    env.close()
    assert f"PASSED tests/{next(iter(task.hidden['tests']))}::{passes}" in output, output[-1500:]


# -- authoring ----------------------------------------------------------------------------------------

MINI = {
    "id": "repair/mini",
    "prompt": "double() is off by one.",
    "difficulty": "easy",
    "split": "train",
    "files": {
        "mini/__init__.py": "",
        "mini/ops.py": "def double(x):\n    return x + x + 1\n\n\ndef keep(x):\n    return x\n",
    },
    "fix": {"mini/ops.py": "def double(x):\n    return x + x\n\n\ndef keep(x):\n    return x\n"},
    "hidden_tests": {
        "test_ops.py": "from mini.ops import double\n\n\ndef test_two():\n    assert double(2) == 4\n\n\ndef test_type():\n    assert type(double(1)) is int\n"
    },
}


def test_authoring_derives_manifest_and_fail_to_pass_with_the_judge(bwrap_pool):
    task = compile_repair_record(MINI)
    assert (
        sorted(task.hidden["manifest"])
        == task.hidden["manifest"]
        == ["tests/test_ops.py::test_two", "tests/test_ops.py::test_type"]
    )
    assert task.hidden["fail_to_pass"] == ["tests/test_ops.py::test_two"]
    identity = {
        **MINI,
        "hidden_tests": {
            "test_ops.py": "from mini.ops import double, keep\n\n\ndef test_two():\n    assert double(2) == 4\n\n\ndef test_same_list():\n    xs = [1]\n    assert keep(xs) is xs\n"
        },
    }
    with pytest.raises(TaskError, match=r"fails|disagree"):  # object identity does not cross the process boundary
        compile_repair_record(identity)
