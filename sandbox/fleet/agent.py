"""What runs on each node of a Ray fleet: :class:`NodeAgent`, the owner of that node's warm pool.

One agent per node (a Ray actor pinned to it, see :mod:`sandbox.fleet.nodes`) keeps a local
:class:`~sandbox.pool.warm_pool.WarmPool` (bwrap or the node's Docker daemon) and lends its
sandboxes *by id*: the driver holds a :class:`~sandbox.fleet.remote.RemoteSandbox` naming the id,
and every call of an episode comes back to this agent, to the same sandbox. Sandboxes never cross
the network; commands, their output and files do.

A call's outcome travels as a value — ``(ok, value or exception, sandbox healthy)`` — not as a
raised error, so what the sandbox raised (a :class:`~sandbox.errors.SandboxInfraError`, a usage
error) reaches the driver as itself, and a Ray error there always means Ray failed, never the call.
Replies to lease changes carry the node's idle sandboxes per spec, which the driver places by.

This module imports no Ray: the fleet wraps the class with ``ray.remote`` when it starts agents.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from sandbox.backends.base import Backend, Sandbox, live_sandbox_ids
from sandbox.errors import SandboxClosed, SandboxUsageError
from sandbox.pool.config import PoolConfig
from sandbox.pool.hosts import Host
from sandbox.pool.warm_pool import WarmPool
from sandbox.spec import SandboxSpec

# The Sandbox methods a driver may call on a lent sandbox (the rest of the API is local state).
CALLS = (
    "exec",
    "write_files",
    "read_file",
    "snapshot",
    "restore",
    "kill_all",
    "ping",
    "probe",
    "resources",
    "describe",
)
Outcome = tuple[bool, Any, bool]  # (returned, value or the exception raised, the sandbox still healthy)


class NodeAgent:
    """One node's warm pool, its sandboxes lent by id. Runs inside a threaded Ray actor.

    Args:
      backend: ``"bwrap"``, ``"docker"`` (this node's default daemon), or a :class:`Backend` object.
      capacity: sandboxes leased at once, per host of this node.
      max_sandboxes: sandboxes existing at once (leased, idle and being reset), per host.
      config: the pool's :class:`PoolConfig` (signal handling is the Ray worker's, so it is off).
      hosts: daemon URLs as seen from this node (e.g. its own ``unix://`` socket); default ``backend``.
    """

    def __init__(
        self,
        backend: str | Backend,
        capacity: int,
        max_sandboxes: int,
        config: PoolConfig | None = None,
        hosts: Sequence[str] = (),
    ):
        self.leases: dict[str, Sandbox] = {}
        self._lock = threading.Lock()
        self._batch_threads = ThreadPoolExecutor(max_workers=max(4, capacity), thread_name_prefix="agentrl-batch")
        self.hosts: list[Host] = []
        self.pool: WarmPool | None = None
        self.error = ""  # why this node cannot serve: said by info(), not by a Ray traceback of __init__
        try:
            config = dataclasses.replace(config or PoolConfig(), handle_signals=False)
            self.hosts = [Host(t, capacity=capacity, max_sandboxes=max_sandboxes) for t in (hosts or [backend])]
            self.pool = WarmPool(self.hosts, config=config)
        except Exception as exc:  # noqa: BLE001 - reported to the fleet, which leaves this node out
            self.error = f"{type(exc).__name__}: {exc}"

    def info(self) -> dict[str, Any]:
        """Who this agent is (for names, logs and leak checks), or ``error``: why it cannot serve."""
        out = {"pid": os.getpid(), "hostname": socket.gethostname(), "hosts": [h.name for h in self.hosts]}
        return {**out, "error": self.error} if self.error else out

    # -- leases -------------------------------------------------------------------------
    def acquire(self, spec: SandboxSpec, timeout: float | None) -> tuple[bool, Any]:
        """Leases a sandbox of ``spec``: ``(True, (its id, what it is, idle sandboxes per spec))``,
        or ``(False, the error)`` (an image missing here, a sandbox that would not start)."""
        try:
            sandbox = self.pool.acquire(spec, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - goes back as itself
            return False, exc
        with self._lock:
            self.leases[sandbox.id] = sandbox
        return True, (sandbox.id, {"backend": sandbox.backend, "confinement": dict(sandbox.confinement)}, self.idle())

    def prewarm(self, spec: SandboxSpec, n: int) -> int:
        """Makes idle sandboxes of ``spec`` until ``n`` exist here; returns how many it made."""
        return self.pool.prewarm(spec, n)

    def release(self, sandbox_ids: Sequence[tuple[str, bool]]) -> dict[tuple, int]:
        """Gives leases back, each ``(id, reusable)`` (reset for reuse, or destroyed); idle per spec after."""
        for sandbox_id, reusable in sandbox_ids:
            with self._lock:
                sandbox = self.leases.pop(sandbox_id, None)
            if sandbox is not None:
                self.pool.release(sandbox, reusable)
        return self.idle()

    def abort(self, sandbox_id: str) -> None:
        """Kills a lent sandbox under its holder (a timeout or cancel); the holder still releases it."""
        with self._lock:
            sandbox = self.leases.get(sandbox_id)
        if sandbox is not None:
            self.pool.abort(sandbox)

    def want(self, demand: Sequence[tuple[SandboxSpec, int]]) -> None:
        """The scheduler's queue depth per spec, this node's share: sandboxes to keep warm."""
        for spec, n in demand:
            self.pool.want(spec, n)

    # -- calls --------------------------------------------------------------------------
    def call(self, sandbox_id: str, method: str, args: tuple, kwargs: dict[str, Any]) -> Outcome:
        """Runs ``sandbox.method(*args, **kwargs)`` on a lent sandbox; the outcome as a value."""
        with self._lock:
            sandbox = self.leases.get(sandbox_id)
        if sandbox is None:
            return False, SandboxClosed(f"[ray] sandbox {sandbox_id} is not leased on this node"), False
        if method not in CALLS:
            return False, SandboxUsageError(f"method: expected one of {CALLS}, got {method!r}"), sandbox.healthy
        try:
            value = getattr(sandbox, method)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - whatever the sandbox raised goes back as itself
            return False, exc, sandbox.healthy
        return True, value, sandbox.healthy

    def call_many(self, calls: Sequence[tuple[str, str, tuple, dict[str, Any]]]) -> Iterator[tuple[int, Outcome]]:
        """Several calls (of different sandboxes) in one round trip, run at once here and streamed back
        as each finishes — ``(index, outcome)`` — so a fast call never waits for a slow one."""
        futures = {self._batch_threads.submit(self.call, *c): i for i, c in enumerate(calls)}
        for future in as_completed(futures):
            yield futures[future], future.result()

    # -- state --------------------------------------------------------------------------
    def idle(self) -> dict[tuple, int]:
        idle: dict[tuple, int] = {}
        with self.pool.state.lock:
            for host in self.hosts:
                for key, entries in host.idle.items():
                    if entries:
                        idle[key] = idle.get(key, 0) + len(entries)
        return idle

    def stats(self) -> dict[str, float]:
        return self.pool.stats()

    def close(self) -> dict[str, int]:
        """Destroys every sandbox of this node, leased ones too: ``{"leased": n, "live": sandboxes left}``."""
        with self._lock:
            leased, self.leases = len(self.leases), {}
        if self.pool is not None:
            self.pool.close()
        self._batch_threads.shutdown(wait=False)
        return {"leased": leased, "live": len(live_sandbox_ids())}
