"""The warm pool's settings, its hygiene check, and the sandbox handle it lends out (`PooledSandbox`).

``PooledSandbox`` is what envs receive from the pool's factory (``pool.open``):
it behaves like a :class:`~sandbox.base.Sandbox` — same methods, same results —
but ``close()`` hands the sandbox back to the pool to be reset and reused
instead of destroying it, and once closed the handle refuses every call. That
last part matters: a stale reference kept by an env must never reach a
sandbox that has since been leased to another episode.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from sandbox.errors import SandboxClosed, SandboxInfraError, SandboxUsageError
from sandbox.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.base import Sandbox
    from sandbox.pool import WarmPool


def _check_seconds(value: Any, field: str) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        raise SandboxUsageError(f"PoolConfig.{field}: expected a finite number of seconds > 0, got {value!r}")


def _check_int(value: Any, field: str, low: int, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise SandboxUsageError(
            f"PoolConfig.{field}: expected an int >= {low}{' or None' if optional else ''}, got {value!r}"
        )


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """How the warm pool behaves.

    Attributes:
      min_idle: idle sandboxes kept per spec once the spec has been used (not shrunk below).
      idle_ttl_s: an idle sandbox beyond ``min_idle`` unused this long is destroyed.
      probe: run the hygiene probe after every reset (a listing of the writable
        dirs compared with the one at creation, and a process count of zero).
      max_uses: destroy a sandbox after this many leases (None: never).
      warm_workers: threads creating sandboxes ahead of demand and destroying old ones.
      health_first_probe_s / health_max_backoff_s: a host out of rotation is probed
        after ``health_first_probe_s``, then at doubling intervals up to the max.
      image_recheck_s / image_recheck_max_s: the same backoff for a host that lacked an image.
      probe_timeout_s: how long one health probe may wait for a daemon.
      no_host_timeout_s: :meth:`WarmPool.acquire` raises ``HostUnavailable`` once no
        host has been in rotation for this long.
      maintenance_interval_s: period of the background pass (probes, shrinking, warming).
      handle_signals: on SIGINT/SIGTERM destroy the pool's sandboxes, then run the
        previous handler (installed from the main thread only).
    """

    min_idle: int = 0
    idle_ttl_s: float = 120.0
    probe: bool = True
    max_uses: int | None = None
    warm_workers: int = 4
    health_first_probe_s: float = 0.25
    health_max_backoff_s: float = 30.0
    image_recheck_s: float = 10.0
    image_recheck_max_s: float = 300.0
    probe_timeout_s: float = 5.0
    no_host_timeout_s: float = 60.0
    maintenance_interval_s: float = 0.5
    handle_signals: bool = True

    def __post_init__(self):
        _check_int(self.min_idle, "min_idle", 0)
        _check_int(self.max_uses, "max_uses", 1, optional=True)
        _check_int(self.warm_workers, "warm_workers", 1)
        for field in (
            "idle_ttl_s",
            "health_first_probe_s",
            "health_max_backoff_s",
            "image_recheck_s",
            "image_recheck_max_s",
            "probe_timeout_s",
            "no_host_timeout_s",
            "maintenance_interval_s",
        ):
            _check_seconds(getattr(self, field), field)
        for field in ("probe", "handle_signals"):
            if not isinstance(getattr(self, field), bool):
                raise SandboxUsageError(f"PoolConfig.{field}: expected a bool, got {getattr(self, field)!r}")


def hygiene_fingerprint(sandbox: Sandbox) -> str:
    """What the writable places hold: one line per entry (path, kind, size, mode, owner) and per IPC object.

    Taken when a sandbox is created and compared after every reset. The agent
    lists every directory a command can write (workspace, /tmp, /dev/shm,
    /dev/mqueue) and the System V IPC namespace itself (:meth:`Sandbox.probe`):
    one round trip, no process spawned. The environment needs no check: each
    exec starts from the agent's pristine copy, so nothing a job exported can persist.
    """
    return _listing(sandbox.probe())


def check_clean(sandbox: Sandbox, expected: str) -> str | None:
    """None if the sandbox looks as it did when created, else what is wrong (after a reset)."""
    seen = sandbox.probe()
    if seen["processes"]:
        return f"{seen['processes']} processes survived the reset"
    listing = _listing(seen)
    if listing != expected:
        extra = sorted(set(listing.splitlines()) ^ set(expected.splitlines()))[:5]
        return f"writable places differ from a fresh sandbox: {extra}"
    return None


def _listing(seen: dict[str, Any]) -> str:
    lines = [" ".join(str(x) for x in entry) for entry in seen["entries"]]
    lines += ["ipc " + " ".join(str(x) for x in obj) for obj in seen.get("ipc", ())]
    return "\n".join(lines) + ("\n(truncated)" if seen["truncated"] else "")


def spec_key(spec: SandboxSpec) -> tuple:
    """A hashable identity of a spec (the spec itself is not hashable: its ``env`` is a dict)."""
    fields = tuple((f.name, getattr(spec, f.name)) for f in dataclasses.fields(spec) if f.name != "env")
    return (*fields, ("env", tuple(sorted(spec.env.items()))))


class PooledSandbox:
    """A sandbox leased from a :class:`~sandbox.pool.WarmPool`; ``close()`` returns it there.

    Every :class:`~sandbox.base.Sandbox` method and attribute (``exec``,
    ``write_files``, ``read_file``, ``snapshot``, ``restore``, ``ping``, ``id``,
    ``spec``, ...) is forwarded. ``close()`` releases it for reuse if it is still
    healthy; ``discard()`` releases it to be destroyed (use it when the episode
    left the sandbox in a state nobody should inherit, e.g. after a timeout).
    Used as a context manager, an infrastructure error escaping the block discards it.
    """

    def __init__(self, pool: WarmPool, sandbox: Sandbox):
        self._pool = pool
        self._sandbox = sandbox
        self._released = False

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not defined on this class: the Sandbox API. After release only
        # the sandbox's identity stays readable (for logs); everything that acts on it refuses.
        if self.__dict__.get("_released", True) and name not in ("id", "spec", "backend"):
            raise SandboxClosed(f"[pool] sandbox was returned to the pool; {name!r} needs a new lease")
        return getattr(self._sandbox, name)

    @property
    def sandbox(self) -> Sandbox:
        """The underlying sandbox (valid only while this lease is open)."""
        if self._released:
            raise SandboxClosed("[pool] sandbox was returned to the pool")
        return self._sandbox

    @property
    def closed(self) -> bool:
        return self._released

    @property
    def healthy(self) -> bool:
        return not self._released and self._sandbox.healthy

    def close(self, reusable: bool | None = None) -> None:
        """Returns the sandbox to the pool (reset and reused if healthy). Idempotent."""
        if self._released:
            return
        self._released = True
        self._pool.release(self._sandbox, self._sandbox.healthy if reusable is None else reusable)

    def discard(self) -> None:
        """Returns the sandbox to the pool to be destroyed, not reused."""
        self.close(reusable=False)

    def __enter__(self) -> PooledSandbox:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(reusable=None if not isinstance(exc, SandboxInfraError) else False)

    def __repr__(self) -> str:
        state = "released" if self._released else self._sandbox.id
        return f"PooledSandbox({state})"
