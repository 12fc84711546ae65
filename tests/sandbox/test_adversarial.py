"""Hostile code on both backends: contained, reported as a result, nothing left behind.

Every test runs a fresh sandbox, checks the attack came back as an ExecResult
(not an infrastructure error), that a neighbouring sandbox still answers, and,
after close, that no process, container or cgroup of the sandbox is left.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from sandbox import SandboxSpec
from tests.sandbox.conftest import backend_or_skip

SPEC = SandboxSpec(memory_mb=384, workspace_mb=64, tmp_mb=32, pids=128, timeout_s=20, max_output_bytes=1 << 16)


def assert_gone(sb) -> None:
    """Nothing of a closed sandbox is left: no process, cgroup, container."""
    assert sb.closed
    if sb.backend == "bwrap":
        assert sb._proc.poll() is not None
        if sb._cgroup is not None:
            assert not any(d.exists() for d in sb._cgroup.dirs), sb._cgroup.dirs
    else:
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"name={sb.id}"], capture_output=True, text=True, check=True
        ).stdout
        deadline = time.monotonic() + 10
        while out.strip() and time.monotonic() < deadline:  # auto-remove can lag a moment
            time.sleep(0.1)
            out = subprocess.run(
                ["docker", "ps", "-aq", "--filter", f"name={sb.id}"], capture_output=True, text=True
            ).stdout
        assert not out.strip(), f"container {sb.id} still exists"
    host_procs = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "agentrl-adversary-marker" not in host_procs


@pytest.fixture
def hostile(backend):
    neighbour = backend.create(SPEC)
    sb = backend.create(SPEC)
    yield sb
    assert neighbour.exec("echo ok", timeout=10).stdout == b"ok\n", "neighbour sandbox stopped answering"
    neighbour.close()
    sb.close()
    assert_gone(sb)


def only_agent_left(sb) -> bool:
    return sb.ping()["processes"] == 0


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
    hostile.exec("python3 -c 'import os\nfor _ in range(20):\n  os.fork() or os._exit(0)\n'")
    time.sleep(0.2)
    states = hostile.exec("ps -eo stat=").stdout_text.split()
    assert not [s for s in states if s.startswith("Z")], states


def _host_addresses() -> list[str]:
    addrs = {"127.0.0.1"}
    try:
        addrs.add(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    out = subprocess.run(
        ["sh", "-c", "ip -4 -o addr 2>/dev/null || hostname -I"], capture_output=True, text=True
    ).stdout
    for tok in out.replace("/", " ").split():
        if tok.count(".") == 3 and all(p.isdigit() for p in tok.split(".")):
            addrs.add(tok)
    return sorted(addrs)


def test_no_network_egress(hostile):
    with socket.socket() as server:  # a host service the sandbox must not reach
        server.bind(("0.0.0.0", 0))
        server.listen()
        port = server.getsockname()[1]
        for addr in [*_host_addresses(), "172.17.0.1", "1.1.1.1"]:
            r = hostile.exec(f"curl -sS -m 2 http://{addr}:{port}/ || curl -sS -m 2 http://{addr}/", timeout=10)
            assert r.exit_code != 0, f"reached {addr}"
    r = hostile.exec("getent hosts deb.debian.org pypi.org", timeout=10)
    assert r.exit_code != 0 and not r.stdout
    ifaces = hostile.exec("cat /proc/net/dev").stdout_text
    assert [line.split(":")[0].strip() for line in ifaces.splitlines()[2:]] == ["lo"]


def test_host_files_and_docker_socket_are_invisible(hostile, tmp_path):
    secret = Path("/root/agentrl-host-secret.txt")
    secret.write_text("host secret")
    try:
        r = hostile.exec(
            "cat /root/agentrl-host-secret.txt; ls /var/run/docker.sock /run/docker.sock; "
            "ls /proc | grep -c '^[0-9]'; cat /proc/1/cmdline | tr '\\0' ' '"
        )
        assert b"host secret" not in r.stdout
        assert b"docker.sock" not in r.stdout
        count, cmdline = r.stdout_text.strip().splitlines()[-2:]
        assert int(count) <= 4  # the agent, bash and the ls/grep pipeline: no host processes
        assert "agentrl-agent" in cmdline or "python3" in cmdline
    finally:
        secret.unlink()


@pytest.mark.parametrize(
    "cmd",
    [
        "mount -t tmpfs none /mnt",
        "unshare -r true",
        "unshare -m true",
        "python3 -c 'import os; os.setuid(1000); os.setuid(0)'",
        "chroot / true",
        "mknod /tmp/sda b 8 0",
        "python3 -c 'import ctypes; l = ctypes.CDLL(None); assert l.unshare(0x10000000) == 0'",
        "ip link set lo down",
        "kill -9 1; sleep 0.2; kill -0 1 && exit 1",
    ],
    ids=[
        "mount",
        "unshare-user",
        "unshare-mount",
        "setuid",
        "chroot",
        "mknod",
        "unshare-syscall",
        "netadmin",
        "kill-agent",
    ],
)
def test_privilege_escalation_fails(hostile, cmd):
    r = hostile.exec(cmd, timeout=10)
    assert r.exit_code != 0, (cmd, r)
    assert "0000000000000000" in hostile.exec("grep CapEff /proc/self/status").stdout_text


def test_state_is_invisible_to_the_next_sandbox(backend):
    """Pool hygiene: files, processes, env of one sandbox are invisible to a fresh one and after restore."""
    with backend.create(SPEC) as first, backend.create(SPEC) as second:
        clean = first.snapshot()
        first.exec("echo a > /workspace/left; echo b > /tmp/left; echo c > /dev/shm/left; export SECRET=1; sleep 600 &")
        probe = "ls -A /workspace /tmp /dev/shm; ps -eo comm= | grep -c sleep; echo ${SECRET:-none}"
        seen = second.exec(probe).stdout_text
        assert "left" not in seen and seen.split()[-2:] == ["0", "none"]
        first.restore(clean)
        seen = first.exec(probe).stdout_text
        assert "left" not in seen and seen.split()[-2:] == ["0", "none"]


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


def test_host_stays_responsive_under_cpu_burn(hostile):
    hostile.exec("for i in 1 2 3 4; do (while :; do :; done) & done; sleep 0.1")
    t = time.monotonic()
    subprocess.run(["python3", "-c", "sum(range(10**6))"], check=True)
    assert time.monotonic() - t < 30  # generous: the point is that the host is not starved
    hostile.kill_all()


def test_setuid_binaries_grant_no_capabilities(hostile):
    r = hostile.exec(
        "cp /bin/bash /tmp/sh && chmod u+s /tmp/sh; cp /bin/cat /workspace/cat && chmod u+s /workspace/cat; "
        "/tmp/sh -p -c 'grep CapEff /proc/self/status'; /workspace/cat /proc/self/status | grep CapEff"
    )
    caps = [line.split()[1] for line in r.stdout_text.splitlines() if line.startswith("CapEff")]
    assert caps and all(int(c, 16) == 0 for c in caps), r


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
