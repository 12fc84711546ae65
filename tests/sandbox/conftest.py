"""Backend fixtures: every sandbox test runs on bwrap and on Docker.

With ``REQUIRE_DOCKER=1`` (CI, via ``make test``) a backend that cannot run is
a test *failure*, never a skip.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from sandbox import Host, SandboxInfraError, SandboxSpec, WarmPool, get_backend
from tests.conftest import REQUIRED

_backends: dict[str, object] = {}


def backend_or_skip(name: str):
    if name not in _backends:
        try:
            backend = get_backend(name)
            backend.check(SandboxSpec())
            _backends[name] = backend
        except SandboxInfraError as exc:
            _backends[name] = exc
    backend = _backends[name]
    if isinstance(backend, Exception):
        if REQUIRED:
            pytest.fail(f"{name} backend required (REQUIRE_DOCKER=1) but unavailable: {backend}")
        pytest.skip(f"{name} backend unavailable: {backend}")
    return backend


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request):
    return backend_or_skip(request.param)


@pytest.fixture
def sandbox(backend):
    with backend.create(SandboxSpec(timeout_s=30)) as sb:
        yield sb


def kill_underneath(sb, *, wait: bool = False) -> None:
    """Destroys a sandbox behind the API's back, as a crashed host or ``docker kill`` would.

    ``wait``: return only once a bwrap sandbox's process is reaped. Not from a thread racing a
    call on the sandbox: that call's diagnosis must see the exit itself (``SandboxVanished``).
    """
    if sb.backend == "docker":
        subprocess.run(["docker", "kill", sb.id], check=True, capture_output=True)
    else:
        sb._proc.kill()
        if wait:
            sb._proc.wait()


# A small sandbox for hostile programs: limits low enough that bombs hit them fast.
HOSTILE_SPEC = SandboxSpec(memory_mb=384, workspace_mb=64, tmp_mb=32, pids=128, timeout_s=20, max_output_bytes=1 << 16)


@pytest.fixture(params=["fresh", "pooled"])
def target(backend, request):
    """A sandbox as code meets it: fresh from the backend, or reused from a warm pool after a dirty lease."""
    if request.param == "fresh":
        with backend.create(HOSTILE_SPEC) as sb:
            yield sb
        return
    with WarmPool(Host(backend, capacity=1)) as pool:
        with pool.lease(HOSTILE_SPEC) as first:
            first.exec("echo dirty > /workspace/x; sleep 600 >/dev/null 2>&1 &")
            first_id = first.id
        with pool.lease(HOSTILE_SPEC) as sb:
            assert sb.id == first_id, "the pool did not reuse the sandbox"
            yield sb


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
    neighbour = backend.create(HOSTILE_SPEC)
    sb = backend.create(HOSTILE_SPEC)
    yield sb
    assert neighbour.exec("echo ok", timeout=10).stdout == b"ok\n", "neighbour sandbox stopped answering"
    neighbour.close()
    sb.close()
    assert_gone(sb)


def only_agent_left(sb) -> bool:
    return sb.ping()["processes"] == 0
