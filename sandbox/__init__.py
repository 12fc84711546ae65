"""Isolated, resource-limited execution of untrusted code: one API, two real backends.

    from sandbox import SandboxSpec, get_backend
    with get_backend("bwrap").create(SandboxSpec()) as sb:
        result = sb.exec("python3 -c 'print(6*7)'", timeout=5)

At scale: a :class:`WarmPool` of reusable sandboxes over one or more hosts and a
:class:`Scheduler` that runs :class:`Job` s on it (priorities, timeouts, retries
of infrastructure failures only, metrics):

    with Scheduler("bwrap", capacity=2) as sched:  # or Scheduler(WarmPool([...hosts...]))
        results = sched.run([Job(fn, spec=SandboxSpec()) for fn in fns])

``sandbox`` imports nothing from ``rl``, ``envs``, JAX or gymnasium: an eval
harness can use it alone.
"""

from __future__ import annotations

from typing import Any

from sandbox.base import Backend, Sandbox, Snapshot
from sandbox.errors import (
    AgentUnresponsive,
    BackendUnavailable,
    DaemonUnreachable,
    HostUnavailable,
    ImageMissing,
    PoolTimeout,
    SandboxClosed,
    SandboxError,
    SandboxFileError,
    SandboxInfraError,
    SandboxStartError,
    SandboxUsageError,
    SandboxVanished,
)
from sandbox.hosts import Host
from sandbox.images import DEFAULT_IMAGE
from sandbox.jobs import Batch, Job, JobHandle, JobResult, RetryPolicy
from sandbox.pool import WarmPool
from sandbox.pooled import PoolConfig, PooledSandbox
from sandbox.scheduler import Scheduler
from sandbox.spec import ExecResult, SandboxSpec

BACKENDS = ("bwrap", "docker")


def get_backend(name: str, **kwargs: Any) -> Backend:
    """Returns a backend by name: ``"bwrap"`` (local, fast) or ``"docker"`` (``url=`` for a remote daemon)."""
    if name == "bwrap":
        from sandbox.bwrap_backend import BwrapBackend

        return BwrapBackend(**kwargs)
    if name == "docker":
        from sandbox.docker_backend import DockerBackend

        return DockerBackend(**kwargs)
    raise SandboxUsageError(f"backend: expected one of {BACKENDS}, got {name!r}")


__all__ = [
    "BACKENDS",
    "DEFAULT_IMAGE",
    "AgentUnresponsive",
    "Backend",
    "BackendUnavailable",
    "Batch",
    "DaemonUnreachable",
    "ExecResult",
    "Host",
    "HostUnavailable",
    "ImageMissing",
    "Job",
    "JobHandle",
    "JobResult",
    "PoolConfig",
    "PoolTimeout",
    "PooledSandbox",
    "RetryPolicy",
    "Sandbox",
    "SandboxClosed",
    "SandboxError",
    "SandboxFileError",
    "SandboxInfraError",
    "SandboxSpec",
    "SandboxStartError",
    "SandboxUsageError",
    "SandboxVanished",
    "Scheduler",
    "Snapshot",
    "WarmPool",
    "get_backend",
]
