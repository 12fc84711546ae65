"""Start-up errors, infrastructure failures, leaks and garbage collection."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from sandbox import (
    BackendUnavailable,
    DaemonUnreachable,
    ImageMissing,
    SandboxInfraError,
    SandboxSpec,
    SandboxVanished,
    get_backend,
)
from sandbox.backends.base import LABEL
from tests.sandbox.conftest import backend_or_skip, kill_underneath

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_unreachable_daemon_names_the_url():
    t = time.monotonic()
    with pytest.raises(DaemonUnreachable, match=r"tcp://127\.0\.0\.1:9") as info:
        get_backend("docker", url="tcp://127.0.0.1:9", timeout=3).create(SandboxSpec())
    assert isinstance(info.value, SandboxInfraError) and info.value.cause == "daemon_unreachable"
    assert time.monotonic() - t < 30


def test_missing_image_gives_the_build_command(backend):
    spec = SandboxSpec(image="agentrl-sandbox:does-not-exist")
    with pytest.raises(ImageMissing, match=r"python -m sandbox\.images build"):
        backend.create(spec)


def test_missing_bwrap_is_backend_unavailable(monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(BackendUnavailable, match="apt-get install -y bubblewrap"):
        get_backend("bwrap").create(SandboxSpec())


def test_host_system_mode_runs_without_an_image():
    backend = backend_or_skip("bwrap")
    with backend.create(SandboxSpec(image="agentrl-sandbox:not-built", host_system=True)) as sb:
        assert sb.exec("python3 -c 'print(1)'").stdout == b"1\n"
        # The host's /usr is bound read-only (the flag, not uid 1000's lack of permission); /tmp is the control.
        ro = "import os, sys; print(*[bool(os.statvfs(p).f_flag & os.ST_RDONLY) for p in sys.argv[1:]])"
        assert sb.exec(["python3", "-c", ro, "/usr", "/tmp"]).stdout_text.split() == ["True", "False"]


def test_sandbox_killed_mid_command_is_an_infra_error(backend):
    sb = backend.create(SandboxSpec())
    try:
        timer = threading.Timer(0.5, kill_underneath, args=(sb,))
        timer.start()
        with pytest.raises(SandboxVanished) as info:
            sb.exec("sleep 30", timeout=60)
        timer.join()
        assert info.value.cause == "sandbox_vanished"
        assert not sb.healthy
        with pytest.raises(SandboxInfraError):  # stays broken, never a result
            sb.exec("true")
    finally:
        sb.close()


_OWNER = """
import sys, time
sys.path.insert(0, {repo!r})
from sandbox import SandboxSpec, get_backend
sb = get_backend({name!r}).create(SandboxSpec())
sb.exec("sleep 600 >/dev/null 2>&1 &")
print(sb.id, flush=True)
time.sleep(600)
"""


def _docker_ids(label_filter: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", label_filter], capture_output=True, text=True)
    return out.stdout.split()


def test_sigkilled_owner_leaves_nothing(backend):
    """The owner dies with SIGKILL: its sandbox (and the sleep inside) must go too."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _OWNER.format(repo=REPO, name=backend.name)], stdout=subprocess.PIPE, text=True
    )
    sandbox_id = proc.stdout.readline().strip()
    assert sandbox_id.startswith("agentrl-")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 20
    if backend.name == "docker":
        while _docker_ids(f"name={sandbox_id}") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _docker_ids(f"name={sandbox_id}"), "container outlived its owner"
    else:
        from sandbox.backends.cgroups import ROOT

        def leftover_procs() -> list[str]:
            found = []
            for d in ROOT.glob(f"*/agentrl/{proc.pid}-{sandbox_id}"):
                found += (d / "cgroup.procs").read_text().split()
            return found

        while leftover_procs() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not leftover_procs(), "processes outlived their owner"
        assert backend.gc() >= 1
        assert not list(ROOT.glob(f"*/agentrl/{proc.pid}-{sandbox_id}"))


def test_docker_gc_removes_leaked_containers_only():
    backend = backend_or_skip("docker")
    client = backend.client
    dead_owner = f"{os.uname().nodename}:999999999"
    leaked = client.containers.create(
        SandboxSpec().image, command=["sleep", "600"], labels={LABEL: "1", "agentrl.owner": dead_owner}
    )
    with backend.create(SandboxSpec()) as live:
        assert backend.gc() >= 1
        assert leaked.id[:12] not in _docker_ids(f"label={LABEL}")
        assert live.exec("echo still-here").stdout == b"still-here\n"


def test_docker_gc_runs_on_start_up():
    backend_or_skip("docker")
    from sandbox.backends.docker import DockerBackend

    leaked = DockerBackend(gc_on_start=False).client.containers.create(
        SandboxSpec().image,
        command=["sleep", "600"],
        labels={LABEL: "1", "agentrl.owner": f"{os.uname().nodename}:999999998"},
    )
    DockerBackend().client  # noqa: B018 - connecting is what triggers the sweep
    assert leaked.id[:12] not in _docker_ids(f"label={LABEL}")


def test_docker_backend_takes_a_daemon_url():
    backend_or_skip("docker")
    backend = get_backend("docker", url="unix:///var/run/docker.sock")
    with backend.create(SandboxSpec()) as sb:
        assert sb.describe()["host"] == "unix:///var/run/docker.sock"
        assert sb.exec("hostname").stdout == b"sandbox\n"


def test_docker_container_is_locked_down():
    backend = backend_or_skip("docker")
    with backend.create(SandboxSpec(memory_mb=512, cpus=0.5, pids=99)) as sb:
        attrs = backend.client.api.inspect_container(sb.id)
        host = attrs["HostConfig"]
        assert host["NetworkMode"] == "none"
        assert host["CapDrop"] == ["ALL"]
        assert "no-new-privileges:true" in host["SecurityOpt"]
        assert host["ReadonlyRootfs"] is True
        assert host["Memory"] == 512 << 20 and host["NanoCpus"] == 500_000_000 and host["PidsLimit"] == 99
        assert attrs["Config"]["Labels"][LABEL] == "1"
