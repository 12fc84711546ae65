"""A warm pool of sandboxes over one or more hosts: leased in milliseconds, reset and probed between uses.

Creating a sandbox costs ~45 ms (bwrap) to ~250 ms (Docker); restoring one to
the state it was created in costs ~2 ms. So the pool keeps sandboxes per spec,
hands an idle one out on :meth:`WarmPool.acquire`, and on :meth:`release`
puts it back only after a reset (every process killed, workspace, /tmp and
/dev/shm restored from the snapshot taken at creation) and a hygiene probe (the
writable directories list exactly as at creation, no process is left). A
sandbox that fails either, whose host went down, or that ran a job that timed
out is destroyed instead; the next acquire makes a new one.

Elastic: sandboxes are made on demand (or ahead of it, :meth:`want`) up to
each host's ``max_sandboxes``; idle ones beyond ``min_idle`` go after
``idle_ttl_s``. Leases go to the host with the most free capacity; a host whose
daemon stops answering leaves the rotation until a probe with backoff says it
is back (:mod:`sandbox.pool_maintenance`).

Envs use it through a factory: ``pool.open(spec)`` returns a sandbox whose
``close()`` hands it back (see :class:`PooledSandbox`).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from sandbox import base, cleanup
from sandbox.base import Sandbox, Snapshot
from sandbox.errors import (
    HostUnavailable,
    ImageMissing,
    PoolTimeout,
    SandboxClosed,
    SandboxError,
    SandboxInfraError,
    SandboxUsageError,
)
from sandbox.hosts import Host, as_hosts, place
from sandbox.metrics import Counters, Reservoir, UtilisationMeter
from sandbox.pool_maintenance import maintenance_pass, pool_stats, prewarm, report_infra_error
from sandbox.pooled import PoolConfig, PooledSandbox, check_clean, hygiene_fingerprint, spec_key
from sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class _Entry:
    sandbox: Sandbox
    host: Host
    key: tuple
    spec: SandboxSpec
    clean: Snapshot
    fingerprint: str
    last_used: float
    uses: int = 0


class WarmPool:
    """Pre-started, reusable sandboxes on one or more hosts.

    Args:
      hosts: ``"bwrap"``, ``"docker"``, a daemon URL, a :class:`Backend`, a :class:`Host`, or a list of them.
      capacity: leases at once per host for hosts given without one (default: the host's CPU count).
      config: see :class:`PoolConfig`.
    """

    def __init__(self, hosts: Any = "bwrap", *, capacity: int | None = None, config: PoolConfig | None = None):
        self.config = config or PoolConfig()
        if not isinstance(self.config, PoolConfig):
            raise SandboxUsageError(f"config: expected a PoolConfig, got {type(self.config).__name__}")
        self.hosts: list[Host] = as_hosts(hosts, capacity)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._entries: dict[str, _Entry] = {}  # every sandbox the pool owns, by sandbox id
        self._made: weakref.WeakSet[Sandbox] = weakref.WeakSet()  # every sandbox it ever created
        self._leased: dict[str, _Entry] = {}
        self._wanted: dict[tuple, tuple[SandboxSpec, int]] = {}  # demand hints from the scheduler
        self._seen: dict[tuple, SandboxSpec] = {}  # specs leased so far (min_idle applies to them)
        self._warming: dict[tuple, int] = {}  # sandboxes being created ahead of demand, per spec
        self._suspects: set[str] = set()  # healthy hosts to probe soon (an error surfaced on them)
        self._wake = threading.Event()  # wakes the maintenance thread early (new demand, a suspect host)
        self._closed = False
        self.meter = UtilisationMeter()
        self.counters = Counters(["created", "destroyed", "reused", "resets", "reset_failures", "probe_failures"])
        self.acquire_wait = Reservoir()
        self._executor = cf.ThreadPoolExecutor(self.config.warm_workers, thread_name_prefix="agentrl-pool")
        now = time.monotonic()
        for host in self.hosts:
            try:
                host.capacity  # noqa: B018 - resolve it now (a docker host asks its daemon), not under the lock
                host.backend.gc()  # containers / cgroups leaked by dead processes
            except SandboxInfraError as exc:
                host.mark_down(str(exc), now, first_probe_s=self.config.health_first_probe_s)
        self._thread = threading.Thread(target=self._maintain, name="agentrl-pool", daemon=True)
        self._thread.start()
        cleanup.register(self)
        if self.config.handle_signals:
            cleanup.install_signal_handlers()

    # -- leasing --------------------------------------------------------------
    def acquire(
        self, spec: SandboxSpec | None = None, *, timeout: float | None = None, avoid: Iterable[str] = ()
    ) -> Sandbox:
        """A clean sandbox of ``spec`` (blocks while every host is full). Give it back with :meth:`release`.

        Raises :class:`ImageMissing` if every healthy host lacks the image, :class:`HostUnavailable`
        if no host has been healthy for ``no_host_timeout_s``, :class:`PoolTimeout` past ``timeout``,
        :class:`SandboxClosed` once the pool is closed. ``avoid``: host names to use only if no other fits.
        """
        spec = SandboxSpec() if spec is None else spec
        if not isinstance(spec, SandboxSpec):
            raise SandboxUsageError(f"acquire(spec=): expected a SandboxSpec, got {type(spec).__name__}")
        key, start = spec_key(spec), time.monotonic()
        avoid = tuple(avoid)
        no_host_since: float | None = None
        victims: list[_Entry] = []
        with self._cond:
            self._seen.setdefault(key, spec)
            while True:
                if self._closed:
                    raise SandboxClosed("[pool] the warm pool is closed")
                now = time.monotonic()
                host = place(self.hosts, spec.image, key, avoid, now)
                if host is not None:
                    idle = host.idle.get(key)
                    if idle:
                        entry = idle.pop()  # most recently used: the spare ones age out and shrink
                        self._lease(entry)
                        self.counters.add("reused")
                        self.acquire_wait.add(time.monotonic() - start)
                        return entry.sandbox
                    # One of this spec being reset is milliseconds from idle: cheaper to wait than to
                    # create (and keeps the pool at the size the load needs, so utilisation stays high).
                    resetting = host.resetting.get(key, 0) > 0
                    full = host.total >= host.max_sandboxes
                    victim = self._evictable(host, key) if full and not resetting else None
                    if not resetting and (not full or victim is not None):
                        if victim is not None:
                            victims.append(victim)
                        host.leased += 1  # reserved while we create it
                        break
                healthy = [h for h in self.hosts if h.healthy]
                if healthy and all(not h.can_run(spec.image, now) for h in healthy):
                    errors = [h.missing_images[spec.image][2] for h in healthy if spec.image in h.missing_images]
                    raise ImageMissing(f"no healthy host has {spec.image}: {errors[-1]}", backend="pool")
                no_host_since = None if healthy else (no_host_since or now)
                if no_host_since is not None and now - no_host_since >= self.config.no_host_timeout_s:
                    down = "; ".join(f"{h.name}: {h.down_reason}" for h in self.hosts)
                    raise HostUnavailable(
                        f"no host in rotation for {now - no_host_since:.0f}s ({down})", backend="pool"
                    )
                if timeout is not None and now - start >= timeout:
                    raise PoolTimeout(f"no sandbox free within {timeout}s (pool saturated)", backend="pool")
                self._cond.wait(0.25 if timeout is None else max(0.0, min(0.25, start + timeout - now)))
        for victim in victims:
            self._destroy(victim)
        try:
            entry = self._create(host, spec, key)
        except BaseException as exc:
            with self._cond:
                host.leased -= 1
                self._cond.notify_all()
            if isinstance(exc, SandboxInfraError):
                self.report(host, exc, spec)
            raise
        with self._cond:
            host.leased -= 1
            closed = self._closed
            if not closed:
                self._entries[entry.sandbox.id] = entry
                self._lease(entry)
        if closed:
            self._destroy(entry)
            raise SandboxClosed("[pool] the warm pool is closed")
        self.acquire_wait.add(time.monotonic() - start)
        return entry.sandbox

    def release(self, sandbox: Sandbox, reusable: bool = True, *, error: BaseException | None = None) -> None:
        """Hands a leased sandbox back: reset and probed for reuse if ``reusable``, else destroyed.

        ``error``: the infrastructure error the lease ended with, if any, so the host's
        health is re-assessed (a lost daemon takes the host out of rotation).
        """
        with self._cond:
            entry = self._leased.pop(getattr(sandbox, "id", None), None)
            if entry is None:
                if self._closed or sandbox in self._made:
                    return  # released twice, or after close() / a forced release: nothing left to do
                raise SandboxUsageError(f"release(sandbox=): {sandbox!r} is not leased from this pool")
            host = entry.host
            host.leased -= 1
            self.meter.change(busy=-1)
            limit = self.config.max_uses
            keep = (
                reusable
                and not self._closed
                and host.healthy
                and sandbox.healthy
                and entry.spec.read_only_root  # a writable root is not restored by a reset
                and (limit is None or entry.uses < limit)
            )
            if keep:
                host.resetting[entry.key] = host.resetting.get(entry.key, 0) + 1
            else:
                del self._entries[sandbox.id]
            self._cond.notify_all()
        if isinstance(error, SandboxInfraError):
            self.report(host, error, entry.spec)
        if not keep:
            self._destroy(entry)
            return
        ok = self._reset(entry)
        with self._cond:
            host.resetting[entry.key] -= 1
            ok = ok and not self._closed and host.healthy
            if ok:
                entry.last_used = time.monotonic()
                host.idle.setdefault(entry.key, []).append(entry)
            else:
                self._entries.pop(sandbox.id, None)
            self._cond.notify_all()
        if not ok:
            self._destroy(entry)

    def open(self, spec: SandboxSpec | None = None, *, timeout: float | None = None) -> PooledSandbox:
        """The injectable factory for envs: a leased sandbox whose ``close()`` returns it to the pool."""
        return PooledSandbox(self, self.acquire(spec, timeout=timeout))

    @contextmanager
    def lease(self, spec: SandboxSpec | None = None, *, timeout: float | None = None) -> Iterator[PooledSandbox]:
        """``with pool.lease(spec) as sb:`` — released (reset for reuse unless the sandbox broke) on exit."""
        with self.open(spec, timeout=timeout) as sb:
            yield sb

    def abort(self, sandbox: Sandbox) -> None:
        """Kills a leased sandbox from any thread (see :meth:`Sandbox.abort`); its holder still releases it."""
        sandbox.abort()

    def prewarm(self, spec: SandboxSpec | None = None, n: int = 1, *, timeout: float | None = 300.0) -> int:
        """Creates idle sandboxes of ``spec`` (in parallel) until ``n`` exist; returns how many it made."""
        return prewarm(self, SandboxSpec() if spec is None else spec, n, timeout)

    def want(self, spec: SandboxSpec, n: int) -> None:
        """Demand hint (the scheduler's queue depth for ``spec``): keep up to ``n`` sandboxes of it warm."""
        with self._cond:
            key = spec_key(spec)
            previous = self._wanted.get(key, (spec, 0))[1]
            if n > 0:
                self._wanted[key] = (spec, n)
            else:
                self._wanted.pop(key, None)
        if n > previous:
            self._wake.set()

    # -- health ---------------------------------------------------------------
    def report(self, host: Host | str, error: SandboxInfraError, spec: SandboxSpec | None = None) -> None:
        """Re-assesses a host after an infrastructure error surfaced on it (see :func:`report_infra_error`)."""
        report_infra_error(self, host if isinstance(host, Host) else self._host(host), error, spec)

    def _host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def host_of(self, sandbox: Sandbox) -> Host | None:
        with self._lock:
            entry = self._entries.get(getattr(sandbox, "id", ""))
            return entry.host if entry else None

    def capacity(self) -> int:
        """Leases that may run at once on the hosts now in rotation."""
        with self._lock:
            return sum(h.capacity for h in self.hosts if h.healthy)

    # -- metrics --------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Pool and host gauges, counters, utilisation and acquire latency, with ``sandbox/`` keys."""
        return pool_stats(self)

    # -- lifecycle --------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self, reason: str = "shutdown") -> None:
        """What the cleanup hooks call (signals, interpreter exit)."""
        if not self._closed:
            log.info("closing warm pool (%s)", reason)
        self.close()

    def close(self) -> None:
        """Destroys every sandbox (leased ones are killed under their holders) and sweeps the hosts.

        Returns only when they are gone: no container or bwrap process of this pool is left running,
        so a leak check or an exiting process can rely on it.
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            idle = [e for h in self.hosts for e in self._drop_idle(h)]
            leased = list(self._leased.values())
            self._wake.set()
            self._cond.notify_all()
        for entry in idle:
            self._destroy(entry)
        for entry in leased:
            entry.sandbox.abort()  # holders see their calls fail now and release (destroy) them
        with self._cond:  # closing a sandbox another thread is blocked on is unsafe: give holders a moment
            deadline = time.monotonic() + 2.0
            while self._leased and time.monotonic() < deadline:
                self._cond.wait(0.05)
            stuck = list(self._leased.values())
            self._leased.clear()
            self._entries.clear()
        for entry in stuck:
            self.meter.change(busy=-1)
            self._destroy(entry)
        # Sandboxes still being made or reset in the background are destroyed by their workers when
        # they see the pool closed: wait for them, so that nothing of this pool outlives close().
        in_worker = threading.current_thread().name.startswith("agentrl-pool")
        self._executor.shutdown(wait=not in_worker, cancel_futures=True)
        self._thread.join(timeout=5)
        live = {sb.id for sb in list(base._live) if not sb.closed}
        for host in self.hosts:
            try:
                host.sweep(live)
            except Exception as exc:  # noqa: BLE001 - a down host is swept by gc() on its next use
                log.info("close: could not sweep %s: %s", host.name, exc)
        cleanup.unregister(self)
        if cleanup.live_count() == 0:
            cleanup.uninstall_signal_handlers()

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"WarmPool({[h.name for h in self.hosts]}, closed={self._closed})"

    # -- internals --------------------------------------------------------------
    def _lease(self, entry: _Entry) -> None:
        entry.host.leased += 1
        entry.uses += 1
        self._leased[entry.sandbox.id] = entry
        self.meter.change(busy=1)

    def _evictable(self, host: Host, key: tuple) -> _Entry | None:
        """The least recently used idle sandbox of another spec on ``host`` (removed from idle)."""
        others = [(entries[0].last_used, k) for k, entries in host.idle.items() if k != key and entries]
        if not others:
            return None
        victim = host.idle[min(others)[1]].pop(0)
        self._entries.pop(victim.sandbox.id, None)
        return victim

    def _create(self, host: Host, spec: SandboxSpec, key: tuple) -> _Entry:
        sandbox = host.backend.create(spec)
        try:
            clean = sandbox.snapshot()
            fingerprint = hygiene_fingerprint(sandbox) if self.config.probe else ""
        except BaseException:
            sandbox.close()
            raise
        self._made.add(sandbox)
        self.meter.change(held=1)
        self.counters.add("created")
        return _Entry(sandbox, host, key, spec, clean, fingerprint, last_used=time.monotonic())

    def _reset(self, entry: _Entry) -> bool:
        try:
            entry.sandbox.restore(entry.clean)
            self.counters.add("resets")
            problem = check_clean(entry.sandbox, entry.fingerprint) if self.config.probe else None
        except SandboxError as exc:
            self.counters.add("reset_failures")
            log.info("reset of %s failed (%s); destroying it", entry.sandbox.id, exc)
            return False
        if problem:
            self.counters.add("probe_failures")
            log.warning("sandbox %s not clean after reset (%s); destroying it", entry.sandbox.id, problem)
        return problem is None

    def _destroy(self, entry: _Entry) -> None:
        entry.sandbox.close()
        self.meter.change(held=-1)
        self.counters.add("destroyed")

    def _drop_idle(self, host: Host) -> list[_Entry]:
        dropped = [e for entries in host.idle.values() for e in entries]
        host.idle.clear()
        for entry in dropped:
            self._entries.pop(entry.sandbox.id, None)
        return dropped

    def _maintain(self) -> None:
        """Background: probe down or suspect hosts, shrink idle sandboxes, warm ahead of demand."""
        # Its own event, not the pool's condition: that one is notified on every lease and release,
        # and a full pass per job would be pure overhead.
        while not self._closed:
            self._wake.wait(self.config.maintenance_interval_s)
            self._wake.clear()
            if self._closed:
                return
            try:
                maintenance_pass(self)
            except Exception:  # noqa: BLE001 - the maintainer must outlive one bad pass
                log.exception("warm pool maintenance pass failed")
