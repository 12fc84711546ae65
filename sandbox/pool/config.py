"""How the warm pool behaves: :class:`PoolConfig`, checked field by field when it is made.

A frozen dataclass rather than keyword arguments of the pool, so that a run's
config (``configs/``) can hold one and the pool's constructor stays short; a
bad value fails here, naming the field, not later in a background thread.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from sandbox.errors import SandboxUsageError


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
