"""Resource bombs on both backends: contained by the spec's limits, reported as results, nothing left behind.

Every test runs a fresh sandbox next to a neighbour, checks that the attack came back
as an ExecResult (not an infrastructure error), that the neighbour still answers, and,
after close, that no process, container or cgroup of the sandbox is left.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.sandbox.conftest import HOSTILE_SPEC as SPEC
from tests.sandbox.conftest import backend_or_skip, only_agent_left


def test_fork_bomb(hostile):
    r = hostile.exec(":(){ :|:& };:; sleep 2", timeout=5)
    assert not r.oom_killed
    assert hostile.ping()["processes"] <= SPEC.pids  # the pids limit held
    hostile.kill_all()
    assert only_agent_left(hostile)
    assert hostile.exec("echo recovered").stdout == b"recovered\n"


def test_memory_bomb_is_oom_killed(hostile):
    r = hostile.exec("python3 -c 'x = bytearray(2 << 30)'", timeout=20)
    assert r.exit_code == 137 and r.oom_killed
    assert hostile.exec("echo alive").ok


def test_slow_memory_growth_is_oom_killed(hostile):
    r = hostile.exec("python3 -c '\nchunks = []\nwhile True: chunks.append(bytearray(8 << 20))'", timeout=20)
    assert r.oom_killed and not r.timed_out


def test_disk_fill_hits_the_quota_not_the_host(hostile):
    r = hostile.exec("dd if=/dev/zero of=/workspace/fill bs=1M count=1000", timeout=20)
    assert r.exit_code != 0 and b"No space left" in r.stderr
    size = int(hostile.exec("stat -c %s /workspace/fill").stdout)
    assert size <= SPEC.workspace_mb << 20
    r = hostile.exec("dd if=/dev/zero of=/tmp/fill bs=1M count=1000; dd if=/dev/zero of=/dev/shm/f bs=1M count=1000")
    assert r.stderr.count(b"No space left") == 2
    assert hostile.exec("rm /workspace/fill && echo freed").stdout == b"freed\n"


@pytest.mark.parametrize(
    "cmd",
    ["yes", "head -c 1000000000 /dev/zero", "python3 -c 'import sys; sys.stderr.write(\"e\" * 10**8)'"],
    ids=["yes", "1GB-line-no-newline", "stderr-flood"],
)
def test_output_bomb_is_capped(hostile, cmd):
    r = hostile.exec(cmd, timeout=3)
    assert r.truncated
    assert len(r.stdout) <= SPEC.max_output_bytes and len(r.stderr) <= SPEC.max_output_bytes
    assert max(len(r.stdout), len(r.stderr)) == SPEC.max_output_bytes
    assert only_agent_left(hostile)


@pytest.mark.parametrize(
    "cmd",
    [
        "trap '' TERM INT HUP; sleep 600",
        "setsid sh -c 'setsid sleep 600 & sleep 600' & sleep 600",
        "nohup sleep 600 >/dev/null 2>&1 & disown; sleep 600",
        "python3 -c 'import os,time\nif os.fork()==0:\n  os.setsid()\n  if os.fork()==0:\n    time.sleep(600)\n  os._exit(0)\ntime.sleep(600)'",
    ],
    ids=["trapped-sigterm", "setsid-daemon", "nohup", "double-fork"],
)
def test_timeout_kills_the_whole_tree(hostile, cmd):
    t = time.monotonic()
    r = hostile.exec(cmd, timeout=1)
    assert r.timed_out and r.exit_code == 137
    assert time.monotonic() - t < 10
    assert only_agent_left(hostile), hostile.exec("ps -ef").stdout_text


def test_timeout_spares_services_started_earlier(hostile):
    hostile.exec("sleep 600 >/dev/null 2>&1 &")
    assert hostile.ping()["processes"] == 1
    assert hostile.exec("setsid sleep 600 & sleep 600", timeout=1).timed_out
    assert hostile.ping()["processes"] == 1


def test_zombies_are_reaped(hostile):
    # The parent exits without waiting for 20 children: they are re-parented to the agent.
    # The exec returns once the parent is reaped; the children may still be exiting. Wait for the event
    # (no live child left) and only then look for zombies, which an unreaped exit would leave for good.
    hostile.exec("python3 -c 'import os\nfor _ in range(20):\n  os.fork() or os._exit(0)\n'")
    states = hostile.exec(ZOMBIE_WAIT).stdout_text.split()
    assert states and not [s for s in states if s.startswith("Z")], states


# Waits until only zombies (if any) are left besides the agent and itself, then lists the states.
ZOMBIE_WAIT = (
    "for i in $(seq 200); do n=$(ps -eo pid=,stat=,comm= | awk '$1 != 1 && $2 !~ /^Z/' | grep -vc -e ' ps$' -e ' awk$'"
    " -e ' grep$' -e ' bash$' -e ' sh$'); [ \"$n\" = 0 ] && break; sleep 0.05; done; ps -eo stat="
)


def test_the_zombie_probe_sees_a_zombie(hostile):
    """Control: a zombie whose parent lives on (and never waits) is one the probe reports."""
    hostile.exec("python3 -c 'import os, time\nos.fork() or os._exit(0)\ntime.sleep(30)' >/dev/null 2>&1 &")
    states = hostile.exec("for i in $(seq 200); do ps -eo stat= | grep -q ^Z && break; sleep 0.05; done; ps -eo stat=")
    assert [s for s in states.stdout_text.split() if s.startswith("Z")], states.stdout_text
    hostile.kill_all()


@pytest.mark.parametrize(
    ("cmd", "expected"),
    [
        ("printf '\\377\\376\\000bin'", b"\xff\xfe\x00bin"),
        ("head -c 4096 /dev/urandom | wc -c", b"4096\n"),
        ("python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256)))'", bytes(range(256))),
    ],
)
def test_binary_and_non_utf8_output(hostile, cmd, expected):
    r = hostile.exec(cmd)
    assert r.stdout == expected
    assert isinstance(r.stdout_text, str)


def _cpu_cgroup(sb) -> Path:
    """The host's cgroup directory that holds the sandbox's CPU quota."""
    if sb.backend == "bwrap":
        if sb._cgroup is None:
            pytest.fail("no cgroup for the bwrap sandbox: its CPU quota cannot be checked")
        found = [d for d in sb._cgroup.dirs if (d / "cpu.max").exists() or (d / "cpu.cfs_quota_us").exists()]
    else:
        cid = sb._container.id
        found = [p.parent for p in Path("/sys/fs/cgroup").glob(f"**/*{cid}*/cgroup.procs")]
        found = [d for d in found if (d / "cpu.max").exists() or (d / "cpu.cfs_quota_us").exists()]
    if not found:
        pytest.fail(f"no CPU cgroup found for {sb.id}")
    return found[0]


def _cpu_quota(cgroup: Path) -> float | None:
    """Cores the cgroup may use (None: unlimited), from cgroup v2 ``cpu.max`` or v1 ``cfs_quota_us``."""
    if (cgroup / "cpu.max").exists():
        quota, period = (cgroup / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    quota = int((cgroup / "cpu.cfs_quota_us").read_text())
    return None if quota < 0 else quota / int((cgroup / "cpu.cfs_period_us").read_text())


def test_cpu_burn_is_held_to_the_quota_and_the_host_stays_responsive(hostile):
    """Four busy loops: every one of them sits in a cgroup whose quota is the spec's ``cpus``.

    The kernel enforces a quota on the cgroup's members; a sandbox with no limit, or burners that
    escaped into another cgroup, fail here. Throttle counters are no probe on a loaded 2-core host:
    SCHED_IDLE commands may get too little CPU to reach the quota at all.
    """
    hostile.exec("for i in 1 2 3 4; do (while :; do :; done) & done; sleep 0.1")
    cgroup = _cpu_cgroup(hostile)
    assert _cpu_quota(cgroup) == pytest.approx(SPEC.cpus)
    members = (cgroup / "cgroup.procs").read_text().split()
    assert len(members) >= 5, members  # the agent and the four burners, all under the quota
    root = Path("/sys/fs/cgroup/cpu") if Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists() else None
    if root is not None:
        assert _cpu_quota(root) is None  # control: the probe reports an unlimited cgroup as unlimited
    subprocess.run(["python3", "-c", "sum(range(10**6))"], check=True, timeout=60)  # the host still runs work
    hostile.kill_all()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for the host's view of cgroups")
def test_bwrap_cgroup_limits_match_the_spec():
    backend = backend_or_skip("bwrap")
    if backend.cgroups is None:
        pytest.fail("running as root but no writable cgroups found for the bwrap backend")
    with backend.create(SPEC) as sb:
        memory = next(d for d in sb._cgroup.dirs if "memory" in str(d) or sb._cgroup.version == 2)
        limit_file = "memory.max" if sb._cgroup.version == 2 else "memory.limit_in_bytes"
        assert int((memory / limit_file).read_text()) == SPEC.memory_mb << 20
        pids_dir = sb._cgroup.dirs[0] if sb._cgroup.version == 2 else sb._cgroup.dirs[1]
        assert int((pids_dir / "pids.max").read_text()) == SPEC.pids


def test_filling_every_mount_to_its_caps_leaves_the_agent_serving(hostile):
    """Bytes and inodes of every writable mount at once: tmpfs memory is budgeted, so nothing OOMs the agent."""
    fill = (
        "import os\n"
        "for root in ('/workspace', '/tmp', '/dev/shm'):\n"
        "    try:\n"
        "        with open(root + '/big', 'wb') as f:\n"
        "            while True: f.write(b'x' * (1 << 20))\n"
        "    except OSError: pass\n"
        "    try:\n"
        "        for i in range(10**6): os.mkdir('%s/%s%07d' % (root, 'd' * 200, i))\n"
        "    except OSError as e: print(root, e.errno)\n"
    )
    r = hostile.exec(["python3", "-c", fill], timeout=120)
    assert not r.oom_killed and r.stdout_text.split()[1::2] == ["28", "28", "28"], r
    assert hostile.exec("echo alive").stdout == b"alive\n"
    assert hostile.ping()["pid"] == 1


def test_endlessly_nested_directories_are_refused_not_an_agent_crash(backend):
    """A chain of 5,000 directories: snapshot refuses it as a file error, a pool reset still clears it."""
    from sandbox import Host, SandboxFileError, WarmPool

    nest = "python3 -c \"import os\nfor i in range(5000):\n    os.mkdir('d'); os.chdir('d')\""
    with WarmPool(Host(backend, capacity=1)) as pool:
        with pool.lease(SPEC) as sb:
            first = sb.id
            assert sb.exec(nest, timeout=60).exit_code == 0
            with pytest.raises(SandboxFileError, match="nested deeper"):
                sb.snapshot()
            assert sb.probe()["truncated"] is True
        with pool.lease(SPEC) as sb:
            assert sb.id == first and sb.probe()["entries"] == []
        assert pool.stats()["sandbox/pool_reset_failures"] == 0


def test_spinning_processes_cannot_turn_a_timeout_into_an_infrastructure_error(hostile):
    """100 busy loops left running: a later command's timeout still comes back as a result, promptly.

    Commands run under SCHED_IDLE and the agent freezes the sandbox while it kills a timed-out
    command, so neither its answer nor the victim's death waits on the spinners' CPU share.
    """
    spin = 'python3 -c "import os\nfor i in range(100):\n    if os.fork() == 0:\n        while True: pass"'
    assert hostile.exec(spin, timeout=60).exit_code == 0
    t = time.monotonic()
    r = hostile.exec("sleep 100", timeout=1)
    assert r.timed_out and time.monotonic() - t < 6
    assert hostile.ping()["processes"] >= 100  # the spinners were older: they survive the timeout
    policy = hostile.exec("python3 -c 'import os; print(os.sched_getscheduler(0) == os.SCHED_IDLE)'", timeout=30)
    assert policy.stdout == b"True\n"
    hostile.kill_all()
    assert only_agent_left(hostile)
