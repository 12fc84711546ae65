"""The warm pool: clean reuse, hygiene, elasticity, saturation, lease handles, cleanup — on both backends."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandbox import (
    Host,
    PoolConfig,
    PoolTimeout,
    SandboxClosed,
    SandboxInfraError,
    SandboxSpec,
    SandboxUsageError,
    WarmPool,
)
from sandbox.backends.base import LABEL, owner_tag
from sandbox.backends.cgroups import ROOT as CGROUP_ROOT
from tests.sandbox.conftest import backend_or_skip

REPO = Path(__file__).resolve().parents[2]
SPEC = SandboxSpec(memory_mb=384, workspace_mb=64, tmp_mb=32, pids=128, timeout_s=30)
DIRTY = (
    "echo secret > /workspace/left; mkdir -p /workspace/d/e; echo x > /tmp/left; echo y > /dev/shm/left; "
    "chmod 777 /workspace; (setsid sleep 600 &) ; nohup sleep 600 >/dev/null 2>&1 &"
)
PROBE = "ls -A /workspace /tmp /dev/shm; ps -eo comm= | grep -c sleep; stat -c %a /workspace"


def fast_config(**overrides) -> PoolConfig:
    """Short intervals so elasticity and health checks happen within a test."""
    base = dict(maintenance_interval_s=0.05, health_first_probe_s=0.1, health_max_backoff_s=1.0, idle_ttl_s=60.0)
    base.update(overrides)
    return PoolConfig(**base)


def our_containers(url: str, owner: str | None = None) -> list[str]:
    """Names of containers this process (or ``owner``) labelled on the daemon at ``url``."""
    import docker

    client = docker.APIClient(base_url=url, version="auto", timeout=10)
    try:
        found = client.containers(all=True, filters={"label": [LABEL, f"agentrl.owner={owner or owner_tag()}"]})
    finally:
        client.close()
    # A container being removed can be listed without a name: its id stands in for it.
    return [(c.get("Names") or [c["Id"][:12]])[0].lstrip("/") for c in found]


def our_cgroups(pid: int | None = None) -> list[Path]:
    return list(CGROUP_ROOT.glob(f"*/agentrl/{pid or os.getpid()}-*")) + list(
        CGROUP_ROOT.glob(f"agentrl/{pid or os.getpid()}-*")
    )


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def assert_nothing_left(pool: WarmPool, made: list) -> None:
    """After close: every sandbox the pool made is destroyed, with its container or cgroup."""
    assert pool.closed and all(sb.closed for sb in made)
    for host in pool.hosts:  # at once: close() returns only when they are gone
        if host.backend.name == "docker":
            assert not our_containers(host.backend.address), f"containers left on {host.name} after close()"
    ids = {sb.id for sb in made}
    assert not [d for d in our_cgroups() if d.name.split("-", 1)[1] in ids]


@pytest.fixture
def pool(backend):
    with WarmPool(Host(backend, capacity=2), config=fast_config()) as p:
        yield p


def test_close_returns_only_when_every_sandbox_is_gone(backend):
    pool = WarmPool(Host(backend, capacity=4), config=fast_config())
    assert pool.prewarm(SPEC, 3, timeout=120) == 3
    leased = pool.acquire(SPEC)
    pool.want(SPEC, 4)  # more being made in the background while it closes
    with pool.state.lock:
        made = [leased, *(e.sandbox for e in pool.state.entries())]
    pool.close()
    assert_nothing_left(pool, made)
    if backend.name == "bwrap":
        assert all(sb._proc.poll() is not None for sb in made)


def test_reuse_hands_back_the_same_sandbox_clean(pool):
    sb = pool.acquire(SPEC)
    sb.exec(DIRTY)
    sb.exec("export LEAK=1")
    pool.release(sb)
    again = pool.acquire(SPEC)
    try:
        assert again.id == sb.id  # reused, not recreated
        assert again.exec(PROBE).stdout_text.split() == ["/dev/shm:", "/tmp:", "/workspace:", "0", "755"]
        assert again.ping()["processes"] == 0
        assert again.exec("echo ${LEAK:-unset}").stdout_text.strip() == "unset"
    finally:
        pool.release(again)
    stats = pool.stats()
    assert stats["sandbox/pool_created"] == 1 and stats["sandbox/pool_reused"] == 1
    assert stats["sandbox/pool_probe_failures"] == 0


def test_probe_sees_what_a_job_left_and_abort_unblocks_another_thread(backend):
    with backend.create(SPEC) as sb:
        fresh = sb.probe()
        roots = fresh.pop("roots")
        assert fresh == {"entries": [], "truncated": False, "ipc": [], "processes": 0}
        assert {r[0] for r in roots} >= {"/workspace", "/tmp", "/dev/shm"} and all(r[3] == [] for r in roots), roots
        sb.exec("mkdir -p d; echo hi > d/f; ln -s /etc l; echo x > /dev/shm/s; sleep 600 >/dev/null 2>&1 &")
        seen = sb.probe()
        assert seen["processes"] == 1
        assert ["/workspace/d/f", "f", 3, 0o644, 1000] in seen["entries"]
        assert ["/workspace/l", "l", 0, 0o777, 1000] in seen["entries"]
        assert ["/dev/shm/s", "f", 2, 0o644, 1000] in seen["entries"]
        threading.Timer(0.3, sb.abort).start()
        with pytest.raises(SandboxInfraError):
            sb.exec("sleep 60", timeout=120)  # blocked in this thread; killed from the timer's
        assert not sb.healthy


def test_failed_probe_or_reset_destroys_and_replaces(pool):
    sb = pool.acquire(SPEC)
    # A reset that misses something cannot be produced from inside (the agent empties every writable
    # dir and kills every process), so tamper with what "clean" means for this one sandbox instead.
    with pool.state.lock:
        pool.state.entry(sb.id).fingerprint += "\n/workspace/ghost f 1 644"
    pool.release(sb)
    assert sb.closed and pool.stats()["sandbox/pool_probe_failures"] == 1
    broken = pool.acquire(SPEC)
    assert broken.id != sb.id
    broken.abort()  # the sandbox dies under its holder: the reset fails
    pool.release(broken)
    assert broken.closed and pool.stats()["sandbox/pool_reset_failures"] == 1
    fresh = pool.acquire(SPEC)
    assert fresh.id not in (sb.id, broken.id) and fresh.exec("echo ok").stdout == b"ok\n"
    pool.release(fresh)


def test_unreusable_sandboxes_are_destroyed(pool, backend):
    if backend.name == "docker":  # bwrap refuses a writable root (its root filesystem is shared)
        writable_root = SPEC.replace(read_only_root=False)  # a reset does not restore the root filesystem
        sb = pool.acquire(writable_root)
        pool.release(sb)
        assert sb.closed
    sb = pool.acquire(SPEC)
    pool.release(sb, reusable=False)
    assert sb.closed
    with backend_or_skip("bwrap").create(SPEC) as stranger, pytest.raises(SandboxUsageError, match="not leased"):
        pool.release(stranger)


def test_pooled_handle_returns_to_the_pool_and_refuses_later_calls(pool):
    with pool.lease(SPEC) as sb:
        first = sb.id
        assert sb.exec("echo hi").stdout == b"hi\n"
    assert sb.closed
    with pytest.raises(SandboxClosed, match="returned to the pool"):
        sb.exec("echo stale")
    handle = pool.open(SPEC)
    assert handle.id == first  # the same sandbox, reset: a stale handle can never reach it
    handle.discard()
    assert handle.closed
    assert pool.open(SPEC).id != first


def test_saturation_waits_then_times_out_and_never_exceeds_capacity(pool):
    a, b = pool.acquire(SPEC), pool.acquire(SPEC)
    with pytest.raises(PoolTimeout):
        pool.acquire(SPEC, timeout=0.3)
    pool.release(a)
    c = pool.acquire(SPEC, timeout=30)
    pool.release(b)
    pool.release(c)
    active, peak, lock = [0], [0], threading.Lock()

    def worker():
        for _ in range(4):
            sb = pool.acquire(SPEC)
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            sb.exec("sleep 0.02")
            with lock:
                active[0] -= 1
            pool.release(sb)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert peak[0] == 2
    assert pool.stats()["sandbox/pool_size"] <= pool.hosts[0].max_sandboxes


def test_elastic_growth_and_idle_shrink(backend):
    with WarmPool(Host(backend, capacity=3), config=fast_config(idle_ttl_s=0.5)) as pool:
        pool.want(SPEC, 3)  # the scheduler's queue depth for this spec
        wait_for(lambda: pool.stats()["sandbox/pool_idle"] == 3, 60, "the pool to warm 3 sandboxes")
        assert pool.stats()["sandbox/pool_created"] == 3
        pool.want(SPEC, 0)
        wait_for(lambda: pool.stats()["sandbox/pool_destroyed"] == 3, 30, "idle sandboxes to be shrunk away")
        assert pool.stats()["sandbox/pool_size"] == 0


def test_other_specs_are_evicted_least_recently_used_first():
    backend = backend_or_skip("bwrap")
    with WarmPool(Host(backend, capacity=1, max_sandboxes=2), config=fast_config()) as pool:
        specs = [SPEC.replace(env={"K": str(i)}) for i in range(3)]
        made = []
        for spec in specs[:2]:
            sb = pool.acquire(spec)
            made.append(sb)
            pool.release(sb)
        third = pool.acquire(specs[2])  # the host is full of idle sandboxes of other specs
        assert made[0].closed and not made[1].closed
        assert third.exec("echo $K").stdout == b"2\n"
        pool.release(third)


def test_close_leaves_no_container_or_cgroup(backend):
    pool = WarmPool(Host(backend, capacity=2), config=fast_config())
    made = [pool.acquire(SPEC), pool.acquire(SPEC)]
    pool.release(made[0])
    made[1].exec("sleep 600 >/dev/null 2>&1 &")  # still leased when the pool closes
    pool.close()
    assert_nothing_left(pool, made)
    with pytest.raises(SandboxClosed):
        pool.acquire(SPEC)


_SIGNALS = """
import os, signal, sys, threading
sys.path.insert(0, {repo!r})
from sandbox import Host, SandboxSpec, WarmPool, get_backend
if {mode!r} == "custom":
    signal.signal(signal.SIGTERM, lambda s, f: (print("custom handler ran", flush=True), sys.exit(3)))
if {mode!r} == "thread":
    threading.Thread(target=lambda: WarmPool(get_backend("bwrap"), capacity=1)).start()
    print("handler installed:", signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, flush=True)
    sys.exit(0)
pool = WarmPool(Host(get_backend("bwrap"), capacity=1))
sb = pool.acquire(SandboxSpec())
print(sb.id, flush=True)
try:
    os.kill(os.getpid(), {sig})
    threading.Event().wait(30)
except KeyboardInterrupt:
    print("KeyboardInterrupt; sandbox closed:", sb.closed, flush=True)
    sys.exit(4)
"""


@pytest.mark.parametrize(
    ("mode", "sig", "code", "said"),
    [
        ("custom", "signal.SIGTERM", 3, "custom handler ran"),  # chained to the previous handler
        ("default", "signal.SIGINT", 4, "KeyboardInterrupt; sandbox closed: True"),  # Python's default
        ("default", "signal.SIGTERM", -15, ""),  # default action, after cleanup
        ("thread", "0", 0, "handler installed: False"),  # never installed off the main thread
    ],
)
def test_signal_cleanup_chains_to_the_previous_handler(mode, sig, code, said):
    backend_or_skip("bwrap")
    script = _SIGNALS.format(repo=str(REPO), mode=mode, sig=sig)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert said in proc.stdout
    if mode != "thread":
        sandbox_id = proc.stdout.split()[0]
        assert sandbox_id.startswith("agentrl-")
        assert not [d for d in CGROUP_ROOT.glob("*/agentrl/*") if d.name.endswith(sandbox_id)]
