"""Isolated, resource-limited execution of untrusted code: one API, two real backends.

    from sandbox import SandboxSpec, get_backend
    with get_backend("bwrap").create(SandboxSpec()) as sb:
        result = sb.exec("python3 -c 'print(6*7)'", timeout=5)

At scale: a :class:`WarmPool` of reusable sandboxes over one or more hosts and a
:class:`Scheduler` that runs :class:`Job` s on it (priorities, timeouts, retries
of infrastructure failures only, metrics):

    with Scheduler("bwrap", capacity=2) as sched:  # or Scheduler(WarmPool([...hosts...]))
        results = sched.run([Job(fn, spec=SandboxSpec()) for fn in fns])

Over a Ray cluster, a :class:`RayFleet` (``pip install 'agentrl[ray]'``) stands in for the pool:
``Scheduler(RayFleet("bwrap", address="auto"))``.

Layout, one layer a line; each imports only from the lines above it:

    errors.py               what can go wrong: failures of the machinery apart from what the code did
    images.py               the root filesystem / Docker image every sandbox runs on
    spec.py                 what a sandbox may use (SandboxSpec) and what one command did (ExecResult)
    identity.py seccomp.py  who is who inside (uids) and the syscall filter, shared by both backends
    agent/                  the in-sandbox agent (PID 1), shipped to each sandbox as sources
    backends/               the Sandbox / Backend API, the host end of the agent channel, bwrap, Docker
    pool/                   WarmPool over hosts: leasing, reset and probe, upkeep, metrics, exit cleanup
    scheduler/              Scheduler and Job: priorities, timeouts, retries, one result per job
    fleet/                  RayFleet: a pool's interface over a Ray cluster, one agent per node (optional Ray)
    demo.py dockerd.py      tools run as ``python -m sandbox.<name>`` (images and identity are too)

``sandbox`` imports nothing from ``rl``, ``envs``, JAX or gymnasium: an eval
harness can use it alone.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public names -> the module that defines them. Imported on first use (PEP 562), so that
# `python -m sandbox.images` / `python -m sandbox.identity` run their module once, and
# `import sandbox` stays cheap for code that needs only a part of it.
_EXPORTS = {
    "sandbox.backends.base": ("Backend", "Sandbox", "Snapshot"),
    "sandbox.errors": (
        "AgentUnresponsive",
        "BackendUnavailable",
        "DaemonUnreachable",
        "HostUnavailable",
        "ImageMissing",
        "PoolTimeout",
        "SandboxClosed",
        "SandboxError",
        "SandboxFileError",
        "SandboxInfraError",
        "SandboxStartError",
        "SandboxUsageError",
        "SandboxVanished",
    ),
    "sandbox.fleet.ray_fleet": ("RayFleet",),
    "sandbox.fleet.remote": ("RemoteSandbox",),
    "sandbox.images": ("DEFAULT_IMAGE",),
    "sandbox.pool.config": ("PoolConfig",),
    "sandbox.pool.hosts": ("Host",),
    "sandbox.pool.pooled": ("PooledSandbox",),
    "sandbox.pool.warm_pool": ("WarmPool",),
    "sandbox.scheduler.jobs": ("Batch", "Job", "JobHandle", "JobResult", "RetryPolicy"),
    "sandbox.scheduler.scheduler": ("Scheduler",),
    "sandbox.spec": ("ExecResult", "SandboxSpec"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

if TYPE_CHECKING:
    from sandbox.backends.base import Backend, Sandbox, Snapshot  # noqa: F401
    from sandbox.errors import (  # noqa: F401
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
    from sandbox.fleet.ray_fleet import RayFleet  # noqa: F401
    from sandbox.fleet.remote import RemoteSandbox  # noqa: F401
    from sandbox.images import DEFAULT_IMAGE  # noqa: F401
    from sandbox.pool.config import PoolConfig  # noqa: F401
    from sandbox.pool.hosts import Host  # noqa: F401
    from sandbox.pool.pooled import PooledSandbox  # noqa: F401
    from sandbox.pool.warm_pool import WarmPool  # noqa: F401
    from sandbox.scheduler.jobs import Batch, Job, JobHandle, JobResult, RetryPolicy  # noqa: F401
    from sandbox.scheduler.scheduler import Scheduler  # noqa: F401
    from sandbox.spec import ExecResult, SandboxSpec  # noqa: F401


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


BACKENDS = ("bwrap", "docker")


def get_backend(name: str, **kwargs: Any) -> Backend:  # noqa: F821 - resolved lazily
    """Returns a backend by name: ``"bwrap"`` (local, fast) or ``"docker"`` (``url=`` for a remote daemon)."""
    if name == "bwrap":
        from sandbox.backends.bwrap import BwrapBackend

        return BwrapBackend(**kwargs)
    if name == "docker":
        from sandbox.backends.docker import DockerBackend

        return DockerBackend(**kwargs)
    from sandbox.errors import SandboxUsageError

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
    "RayFleet",
    "RemoteSandbox",
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
