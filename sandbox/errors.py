"""Error types that separate infrastructure failures from what sandboxed code did.

What the code inside a sandbox does — exit non-zero, time out, get OOM-killed —
is a *result* and comes back in :class:`~sandbox.spec.ExecResult`. Only a
failure of the machinery itself (daemon unreachable, container vanished, image
missing, the in-sandbox agent lost) raises :class:`SandboxInfraError`. The
scheduler retries only those, and verifiers report them as anomalies instead of
scoring them as model failures.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base class of every error raised by :mod:`sandbox`."""


class SandboxUsageError(SandboxError, ValueError):
    """The caller passed a bad argument (a spec field, a path, a timeout)."""


class SandboxInfraError(SandboxError):
    """The sandbox machinery failed; the code inside is not to blame.

    Attributes:
      backend: name of the backend (``"docker"``, ``"bwrap"``).
      cause: short machine-readable cause used in metrics (``"daemon_unreachable"``).
    """

    cause = "infra"

    def __init__(self, message: str, *, backend: str = "", cause: str | None = None):
        self.backend = backend
        if cause is not None:
            self.cause = cause
        prefix = f"[{backend}] " if backend else ""
        super().__init__(prefix + message)


class BackendUnavailable(SandboxInfraError):
    """The backend cannot run on this machine (bwrap not installed, no cgroups)."""

    cause = "backend_unavailable"


class DaemonUnreachable(SandboxInfraError):
    """The Docker daemon at the configured URL did not answer."""

    cause = "daemon_unreachable"


class ImageMissing(SandboxInfraError):
    """The sandbox image (or its root filesystem) does not exist; says how to build it."""

    cause = "image_missing"


class SandboxVanished(SandboxInfraError):
    """The container or namespace disappeared under us (killed, daemon restarted)."""

    cause = "sandbox_vanished"


class AgentUnresponsive(SandboxInfraError):
    """The in-sandbox agent stopped answering within its own deadline."""

    cause = "agent_unresponsive"


class SandboxStartError(SandboxInfraError):
    """Creating or starting the sandbox failed for another reason."""

    cause = "start_failed"


class HostUnavailable(SandboxInfraError):
    """No healthy host can run the sandbox (all daemons down, or none has the image)."""

    cause = "host_unavailable"


class PoolTimeout(SandboxInfraError):
    """No pooled sandbox became free within the caller's timeout (the pool is saturated)."""

    cause = "pool_timeout"


class SandboxFileError(SandboxError, OSError):
    """A file operation inside the sandbox failed for a reason inside it (missing, no space)."""


class SandboxClosed(SandboxError):
    """The sandbox was used after :meth:`Sandbox.close` (a caller bug)."""
