"""Isolated, resource-limited execution of untrusted code: one API, two real backends.

    from sandbox import SandboxSpec, get_backend
    with get_backend("bwrap").create(SandboxSpec()) as sb:
        result = sb.exec("python3 -c 'print(6*7)'", timeout=5)

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
    ImageMissing,
    SandboxClosed,
    SandboxError,
    SandboxFileError,
    SandboxInfraError,
    SandboxStartError,
    SandboxUsageError,
    SandboxVanished,
)
from sandbox.images import DEFAULT_IMAGE
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
    "DaemonUnreachable",
    "ExecResult",
    "ImageMissing",
    "Sandbox",
    "SandboxClosed",
    "SandboxError",
    "SandboxFileError",
    "SandboxInfraError",
    "SandboxSpec",
    "SandboxStartError",
    "SandboxUsageError",
    "SandboxVanished",
    "Snapshot",
    "get_backend",
]
