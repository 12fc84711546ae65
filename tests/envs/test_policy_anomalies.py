"""No anomaly a policy can cause: what an episode leaves behind scores 0, never as an infrastructure failure.

Anomalies are excluded from the loss, so a policy that turns its failing episode
into one escapes its zero reward. Each hazard case is an episode, played through
the real environment on both backends, whose one command leaves the hazard
behind and then submits without doing the task: reward 0, no anomaly, and the
exhausted resource named (``details["failure_kind"]``, :class:`envs.anomalies.FailureKind`).

The settling itself (:func:`envs.anomalies.settle`) is shown with a judge that
fails as infrastructure on cue, wrapped around the domain's real judge
(:class:`HostFaults`): a failure that travels with the policy's workspace
fails again in a fresh sandbox and is the policy's; a sandbox killed from the
host during verification stays an anomaly; the gold solution still passes.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

from envs.anomalies import FAILURE_KIND, FailureKind, settle
from envs.quality.hooks import SUBMIT, bash
from envs.quality.validate import play
from envs.verifiers import Verification, VerifyContext
from envs.verifiers.base import Verifier, make_verifier, register_verifier
from sandbox import AgentUnresponsive, DaemonUnreachable
from tests.envs.conftest import make_env

ENVS = {"agentrl/RepoRepair-v0": "repair/leap-years", "agentrl/ShellOps-v0": "shell/top-clients-report"}

# Each hazard, written as a policy would leave it: one command, then submit.
FILL_DISK = "for d in /tmp /dev/shm /workspace; do dd if=/dev/zero of=$d/fill bs=1M count=4096 2>/dev/null; done; true"
FILL_INODES = (
    'python3 -c \'\nimport os\nfor d in ("/tmp", "/dev/shm", "/workspace"):\n    i = 0\n'
    '    try:\n        while True:\n            open(f"{d}/n{i}", "w").close(); i += 1\n'
    "    except OSError:\n        pass\n'"
)
# A System V segment filled to most of the sandbox's memory: it outlives every process and starves the judge.
PIN_MEMORY = (
    "python3 -c '\nimport ctypes\nlibc = ctypes.CDLL(None)\nlibc.shmat.restype = ctypes.c_void_p\n"
    "size = 900 << 20\nseg = libc.shmget(0, ctypes.c_size_t(size), 0o1600)\n"
    "ctypes.memset(libc.shmat(seg, None, 0), 1, size)\n'"
)
SPARSE = "truncate -s 100G /workspace/huge.bin && truncate -s 100G /tmp/huge.bin"
TAKE_PIDS = "for i in $(seq 400); do nohup setsid sleep 100000 >/dev/null 2>&1 & done; sleep 0.5; true"
# An orphan stopped and continued over and over by a detached process: every stop and continue
# is a child notification to whoever reaps orphans (the in-sandbox agent).
SIGNAL_FLOOD = r"""cat > /tmp/.flood.py <<'PY'
import os, signal, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(100000)
    os._exit(0)
os.wait()
time.sleep(0.2)
me = os.getpid()
orphans = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me
           and open(f"/proc/{p}/cmdline", "rb").read().endswith(b".flood.py\0")]
for pid in orphans:
    for _ in range(1000000):
        os.kill(pid, signal.SIGSTOP)
        os.kill(pid, signal.SIGCONT)
PY
nohup setsid python3 /tmp/.flood.py >/dev/null 2>&1 &
sleep 1"""

HAZARDS = {
    "full-disk": (FILL_DISK, FailureKind.EXHAUSTED_DISK),
    "no-inodes": (FILL_INODES, FailureKind.EXHAUSTED_INODES),
    "pinned-shm": (PIN_MEMORY, FailureKind.PINNED_MEMORY),
    "sparse-file": (SPARSE, None),
    "pid-budget": (TAKE_PIDS, FailureKind.EXHAUSTED_PIDS),
    "signal-flood": (SIGNAL_FLOOD, FailureKind.LEFT_PROCESSES),
}


@pytest.mark.parametrize("env_id", sorted(ENVS))
@pytest.mark.parametrize("hazard", sorted(HAZARDS))
def test_a_hazard_left_behind_is_the_policys_failure(hazard, env_id, pool):
    command, kind = HAZARDS[hazard]
    env = make_env(env_id, pool)
    verdict = play(env, env.tasks.get(ENVS[env_id]), [bash(command), SUBMIT])
    env.close()
    assert verdict["anomaly"] is None, verdict["anomaly"]
    assert (verdict["reward"], verdict["passed"]) == (0.0, False), verdict["details"]
    if kind is not None:
        assert verdict["details"].get(FAILURE_KIND) == kind.value, verdict["details"]


def test_the_probe_names_nothing_after_an_honest_failure(pool):
    """Control for the kinds above: a plain wrong answer that leaves nothing behind is named nothing."""
    env = make_env("agentrl/ShellOps-v0", pool)
    verdict = play(env, env.tasks.get(ENVS["agentrl/ShellOps-v0"]), [bash("echo nothing > /tmp/x"), SUBMIT])
    env.close()
    assert (verdict["reward"], verdict["anomaly"]) == (0.0, None)
    assert FAILURE_KIND not in verdict["details"], verdict["details"]


def test_pinned_memory_left_by_the_policy_cannot_starve_the_judge_of_a_correct_fix(pool):
    """A segment of nearly all the sandbox's memory would OOM-kill the repair judge, but kill_all clears
    System V IPC before the judge starts: the gold fix beside it passes, and no anomaly arises. (A wrong
    fix beside it is ``pinned-shm`` above: reward 0, named.)"""
    env = make_env("agentrl/RepoRepair-v0", pool)
    task = env.tasks.get(ENVS["agentrl/RepoRepair-v0"])
    pinned = play(env, task, [bash(PIN_MEMORY.replace("900 << 20", "1000 << 20")), *env.gold_actions(task)])
    env.close()
    assert (pinned["reward"], pinned["anomaly"]) == (1.0, None), pinned["details"]


# -- the settling, with a judge that fails as infrastructure on cue ------------------------------------
DOOMED: set[str] = set()  # ids of sandboxes the next judge kills from the host, as a crashed machine would
WEDGE = ".wedge-the-judge"  # a workspace file that makes the judge fail as infrastructure wherever it runs
KILLER = ".kill-the-sandbox"  # a workspace file whose judging kills the sandbox (nothing left to snapshot)


@register_verifier("test_host_faults")
class HostFaults(Verifier):
    """The domain's real judge (``inner``), failing as infrastructure where the test arranges it."""

    OPTIONS = {"inner": "sandbox_state"}

    def check(self, ctx: VerifyContext):
        if ctx.sandbox.id in DOOMED:
            ctx.sandbox.abort()  # SIGKILL to the sandbox's init from the host, as a job time-out or crash does
        elif ctx.sandbox.exec(["test", "-e", WEDGE], user="judge", cwd="/workspace", timeout=10).exit_code == 0:
            raise AgentUnresponsive("agent gave no answer to 'killall' within 60.0s", backend=ctx.sandbox.backend)
        elif ctx.sandbox.exec(["test", "-e", KILLER], user="judge", cwd="/workspace", timeout=10).exit_code == 0:
            ctx.sandbox.abort()
        return make_verifier(self.options["inner"]).check(ctx)


def _faulty_env(env_id: str, pool):
    inner = gym.registry[env_id].entry_point.roles()["outcome"]
    return make_env(env_id, pool, verifier={"outcome": {"verifier": "test_host_faults", "inner": inner}})


@pytest.mark.parametrize("marker,how", [(WEDGE, "snapshot"), (KILLER, "replay")])
@pytest.mark.parametrize("env_id", sorted(ENVS))
def test_a_failure_that_travels_with_the_workspace_is_the_policys(env_id, marker, how, pool):
    """Re-judged in a fresh sandbox (the workspace copied over, or the episode replayed when the old
    sandbox is dead), the judge fails again: the policy's doing."""
    env = _faulty_env(env_id, pool)
    verdict = play(env, env.tasks.get(ENVS[env_id]), [bash(f"touch {marker}"), SUBMIT])
    env.close()
    assert verdict["anomaly"] is None and verdict["reward"] == 0.0, verdict
    details = verdict["details"]
    assert details[FAILURE_KIND] == FailureKind.BROKE_SANDBOX.value
    assert details["reverified_by"] == how and details["anomaly_in_fresh_sandbox"].startswith("outcome: sandbox_")


@pytest.mark.parametrize("env_id", sorted(ENVS))
def test_a_sandbox_killed_from_the_host_mid_episode_is_still_an_anomaly(env_id, pool):
    """The replay of the episode in a fresh sandbox judges cleanly: the failure was not the policy's."""
    env = make_env(env_id, pool)
    env.reset(options={"task": env.tasks.get(ENVS[env_id])})
    env.step(bash("echo step one"))
    env.sandbox.abort()
    *_, info = env.step(bash("echo step two"))
    env.close()
    verdict = info["verification"]
    assert info["episode"]["end_reason"] == "sandbox_error"
    assert verdict["anomaly"] is not None and verdict["anomaly"].startswith("sandbox_"), verdict
    assert FAILURE_KIND not in verdict["details"]


@pytest.mark.parametrize("env_id", sorted(ENVS))
def test_a_sandbox_killed_from_the_host_is_still_an_anomaly(env_id, pool):
    env = _faulty_env(env_id, pool)
    task = env.tasks.get(ENVS[env_id])
    env.reset(options={"task": task})
    DOOMED.add(env.sandbox.id)
    try:
        for action in [bash("echo working"), SUBMIT]:
            *_, info = env.step(action)
    finally:
        DOOMED.clear()
        env.close()
    verdict = info["verification"]
    assert verdict["anomaly"] is not None and "sandbox_" in verdict["anomaly"], {
        k: v for k, v in verdict["details"].items() if k != "outcome"
    }
    assert FAILURE_KIND not in verdict["details"]


@pytest.mark.parametrize("env_id", sorted(ENVS))
def test_the_gold_solution_still_passes(env_id, pool):
    env = _faulty_env(env_id, pool)
    task = env.tasks.get(ENVS[env_id])
    verdict = play(env, task, env.gold_actions(task))
    env.close()
    assert (verdict["reward"], verdict["passed"], verdict["anomaly"]) == (1.0, True, None), verdict["details"]
    assert FAILURE_KIND not in verdict["details"]


# -- the decision alone, each branch (no sandbox) ----------------------------------------------------------
WEDGED = Verification.anomalous("outcome: sandbox_agent_unresponsive: no answer to 'killall'", verifier="x")
FAILED = Verification(reward=0.0, passed=False, components={"outcome": 0.0})


def _rejudge_with(result):
    def rejudge(snapshot):
        if isinstance(result, Exception):
            raise result
        return result

    return rejudge


@pytest.mark.parametrize(
    "first,snapshot,second,kind,expect",
    [
        # a cause no command in a sandbox can produce: never re-judged, stays an anomaly
        (Verification.anomalous("sandbox_daemon_unreachable: gone"), lambda: b"", FAILED, None, "anomaly"),
        (Verification.anomalous("verifier_error: KeyError"), lambda: b"", FAILED, None, "anomaly"),
        # fails again in a fresh sandbox: the policy's, by snapshot or by replay
        (WEDGED, lambda: b"", WEDGED, None, FailureKind.BROKE_SANDBOX),
        (WEDGED, None, WEDGED, None, FailureKind.BROKE_SANDBOX),
        (WEDGED, None, AgentUnresponsive("again"), FailureKind.PINNED_MEMORY, FailureKind.PINNED_MEMORY),
        # the fresh judge gives a verdict: that is the verdict (snapshot), or the failure did not replay
        (WEDGED, lambda: b"", FAILED, None, "verdict"),
        (WEDGED, None, FAILED, None, "anomaly"),
        # no fresh sandbox to be had: the harness's failure
        (WEDGED, lambda: b"", DaemonUnreachable("no daemon"), None, "anomaly"),
        (WEDGED, None, Verification.anomalous("sandbox_pool_timeout: full"), None, "anomaly"),
    ],
)
def test_settle_decides_whose_failure_it_is(first, snapshot, second, kind, expect):
    result = settle(first, kind=kind, snapshot=snapshot, rejudge=_rejudge_with(second))
    if expect == "anomaly":
        assert result is first
    elif expect == "verdict":
        assert not result.is_anomaly and result.details["reverified_by"] == "snapshot"
    else:
        assert (result.reward, result.is_anomaly, result.details[FAILURE_KIND]) == (0.0, False, expect.value)
