"""A warm pool of sandboxes over one or more hosts: leased in milliseconds, reset and probed between uses.

The pool keeps sandboxes per spec, hands an idle one out on
:meth:`WarmPool.acquire`, and on :meth:`~WarmPool.release` puts it back only
after a reset and a hygiene probe (:mod:`sandbox.pool.lifecycle`). A sandbox
that fails either, whose host went down, or that ran a job that timed out is
destroyed instead; the next acquire makes a new one.

Elastic: sandboxes are made on demand (or ahead of it, :meth:`~WarmPool.want`)
up to each host's ``max_sandboxes``; idle ones beyond ``min_idle`` go after
``idle_ttl_s``. Leases go to the host with the most free capacity; a host whose
daemon stops answering leaves the rotation until a probe with backoff says it
is back (:mod:`sandbox.pool.upkeep`).

Envs use it through a factory: ``pool.open(spec)`` returns a sandbox whose
``close()`` hands it back (see :class:`~sandbox.pool.pooled.PooledSandbox`), or
``pool.acquire`` / ``pool.release`` as the env's ``sandbox_factory`` /
``sandbox_release``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from sandbox.backends.base import Sandbox, live_sandbox_ids
from sandbox.errors import (
    HostUnavailable,
    ImageMissing,
    PoolTimeout,
    SandboxClosed,
    SandboxInfraError,
    SandboxUsageError,
)
from sandbox.pool import cleanup
from sandbox.pool.config import PoolConfig
from sandbox.pool.hosts import Host, as_hosts, place
from sandbox.pool.lifecycle import Lifecycle
from sandbox.pool.metrics import Counters, Reservoir, UtilisationMeter, percentile_keys
from sandbox.pool.pooled import PooledSandbox
from sandbox.pool.state import Entry, PoolState
from sandbox.pool.upkeep import PoolUpkeep
from sandbox.spec import SandboxSpec, spec_key

log = logging.getLogger(__name__)

COUNTERS = ("created", "destroyed", "reused", "resets", "reset_failures", "probe_failures")


class WarmPool:
    """Pre-started, reusable sandboxes on one or more hosts.

    Args:
      hosts: ``"bwrap"``, ``"docker"``, a daemon URL, a :class:`Backend`, a :class:`Host`, or a list of them.
      capacity: leases at once per host for hosts given without one (default: the host's CPU count).
      config: see :class:`PoolConfig`.

    ``state`` is the pool's bookkeeping (:class:`~sandbox.pool.state.PoolState`), readable
    under ``state.lock`` for inspection; ``meter``, ``counters`` and ``acquire_wait`` feed :meth:`stats`.
    """

    def __init__(self, hosts: Any = "bwrap", *, capacity: int | None = None, config: PoolConfig | None = None):
        self.config = config or PoolConfig()
        if not isinstance(self.config, PoolConfig):
            raise SandboxUsageError(f"config: expected a PoolConfig, got {type(self.config).__name__}")
        self.hosts: list[Host] = as_hosts(hosts, capacity)
        self.state = PoolState(self.hosts)
        self.meter = UtilisationMeter()
        self.counters = Counters(COUNTERS)
        self.acquire_wait = Reservoir()
        self._lifecycle = Lifecycle(probe=self.config.probe, meter=self.meter, counters=self.counters)
        self._upkeep = PoolUpkeep(self.state, self.config, self._lifecycle, self.release)
        now = time.monotonic()
        for host in self.hosts:
            try:
                host.capacity  # noqa: B018 - resolve it now (a docker host asks its daemon), not under the lock
                host.backend.gc()  # containers / cgroups leaked by dead processes
            except SandboxInfraError as exc:
                host.mark_down(str(exc), now, first_probe_s=self.config.health_first_probe_s)
        self._upkeep.start()
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
        victims: list[Entry] = []
        state = self.state
        with state.cond:
            self._upkeep.note_use(key, spec)
            while True:
                if state.closed:
                    raise SandboxClosed("[pool] the warm pool is closed")
                now = time.monotonic()
                host = place(self.hosts, spec.image, key, avoid, now)
                if host is not None:
                    entry = state.take_idle(host, key)
                    if entry is not None:
                        self._lease(entry)
                        self.counters.add("reused")
                        self.acquire_wait.add(time.monotonic() - start)
                        return entry.sandbox
                    # One of this spec being reset is milliseconds from idle: cheaper to wait than to
                    # create (and keeps the pool at the size the load needs, so utilisation stays high).
                    resetting = host.resetting.get(key, 0) > 0
                    full = host.total >= host.max_sandboxes
                    victim = state.evict_lru(host, key) if full and not resetting else None
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
                if no_host_since is not None:
                    # The cause, not the symptom: with every host out of rotation, waiting for a free
                    # slot can only end in a time-out that hides why. A pool none of whose hosts ever
                    # answered stops at once; one whose hosts went down waits out a daemon restart.
                    down = "; ".join(f"{h.name}: {h.down_reason}" for h in self.hosts)
                    never = not any(h.answered for h in self.hosts)
                    waited = now - no_host_since
                    if (
                        never
                        or waited >= self.config.no_host_timeout_s
                        or (timeout is not None and now - start >= timeout)
                    ):
                        what = (
                            "no host in rotation: none has answered since the pool started"
                            if never
                            else f"no host in rotation for {waited:.0f}s"
                        )
                        raise HostUnavailable(f"{what} ({down})", backend="pool")
                if timeout is not None and now - start >= timeout:
                    raise PoolTimeout(f"no sandbox free within {timeout}s (pool saturated)", backend="pool")
                state.cond.wait(0.25 if timeout is None else max(0.0, min(0.25, start + timeout - now)))
        for victim in victims:
            self._lifecycle.destroy(victim)
        try:
            entry = self._lifecycle.create(host, spec, key)
        except BaseException as exc:
            with state.cond:
                host.leased -= 1
                state.cond.notify_all()
            if isinstance(exc, SandboxInfraError):
                self.report(host, exc, spec)
            raise
        with state.cond:
            host.leased -= 1
            host.answered = True
            closed = state.closed
            if not closed:
                state.add(entry)
                self._lease(entry)
        if closed:
            self._lifecycle.destroy(entry)
            raise SandboxClosed("[pool] the warm pool is closed")
        self.acquire_wait.add(time.monotonic() - start)
        return entry.sandbox

    def release(self, sandbox: Sandbox, reusable: bool = True, *, error: BaseException | None = None) -> None:
        """Hands a leased sandbox back: reset and probed for reuse if ``reusable``, else destroyed.

        ``error``: the infrastructure error the lease ended with, if any, so the host's
        health is re-assessed (a lost daemon takes the host out of rotation).
        """
        state = self.state
        with state.cond:
            entry = state.unlease(getattr(sandbox, "id", ""))
            if entry is None:
                if state.closed or self._lifecycle.made(sandbox):
                    return  # released twice, or after close() / a forced release: nothing left to do
                raise SandboxUsageError(f"release(sandbox=): {sandbox!r} is not leased from this pool")
            host = entry.host
            self.meter.change(busy=-1)
            limit = self.config.max_uses
            keep = (
                reusable
                and not state.closed
                and host.healthy
                and sandbox.healthy
                and entry.spec.read_only_root  # a writable root is not restored by a reset
                and (limit is None or entry.uses < limit)
            )
            if keep:
                host.resetting[entry.key] = host.resetting.get(entry.key, 0) + 1
            else:
                state.forget(entry)
            state.cond.notify_all()
        if isinstance(error, SandboxInfraError):
            self.report(host, error, entry.spec)
        if not keep:
            self._lifecycle.destroy(entry)
            return
        ok = self._lifecycle.reset(entry)
        with state.cond:
            host.resetting[entry.key] -= 1
            ok = ok and not state.closed and host.healthy
            if ok:
                state.park(entry)
            else:
                state.forget(entry)
            state.cond.notify_all()
        if not ok:
            self._lifecycle.destroy(entry)

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
        if self.state.closed:
            raise SandboxClosed("[pool] the warm pool is closed")
        return self._upkeep.prewarm(SandboxSpec() if spec is None else spec, n, timeout)

    def want(self, spec: SandboxSpec, n: int) -> None:
        """Demand hint (the scheduler's queue depth for ``spec``): keep up to ``n`` sandboxes of it warm."""
        self._upkeep.want(spec, n)

    # -- health ---------------------------------------------------------------
    def report(self, host: Host | str, error: SandboxInfraError, spec: SandboxSpec | None = None) -> None:
        """Re-assesses a host after an infrastructure error surfaced on it (see :meth:`PoolUpkeep.report`)."""
        if not isinstance(host, Host):
            host = next(h for h in self.hosts if h.name == host)
        self._upkeep.report(host, error, spec)

    def host_of(self, sandbox: Sandbox) -> Host | None:
        with self.state.lock:
            entry = self.state.entry(getattr(sandbox, "id", ""))
            return entry.host if entry else None

    def capacity(self) -> int:
        """Leases that may run at once on the hosts now in rotation."""
        with self.state.lock:
            return sum(h.capacity for h in self.hosts if h.healthy)

    # -- metrics --------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Pool and host gauges, counters, utilisation and acquire latency, with ``sandbox/`` keys."""
        with self.state.lock:
            rows = [(h.healthy, h.capacity, h.n_idle, h.leased, sum(h.resetting.values()), h.total) for h in self.hosts]
        healthy, capacity, idle, leased, resetting, size = (list(col) for col in zip(*rows, strict=True))
        util = self.meter.snapshot()
        out = {f"sandbox/pool_{k}": float(v) for k, v in self.counters.snapshot().items()}
        out.update(percentile_keys("sandbox/pool_acquire", self.acquire_wait))
        out.update(
            {
                "sandbox/hosts": float(len(rows)),
                "sandbox/hosts_healthy": float(sum(healthy)),
                "sandbox/capacity": float(sum(c for c, ok in zip(capacity, healthy, strict=True) if ok)),
                "sandbox/pool_idle": float(sum(idle)),
                "sandbox/pool_leased": float(sum(leased)),
                "sandbox/pool_resetting": float(sum(resetting)),
                "sandbox/pool_size": float(sum(size)),
                "sandbox/utilisation": util["utilisation"],
                "sandbox/held_s": util["held_s"],
                "sandbox/busy_s": util["busy_s"],
            }
        )
        return out

    # -- lifecycle --------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.state.closed

    def shutdown(self, reason: str = "shutdown") -> None:
        """What the cleanup hooks call (signals, interpreter exit)."""
        if not self.state.closed:
            log.info("closing warm pool (%s)", reason)
        self.close()

    def close(self) -> None:
        """Destroys every sandbox (leased ones are killed under their holders) and sweeps the hosts.

        Returns only when they are gone: no container or bwrap process of this pool is left running,
        so a leak check or an exiting process can rely on it.
        """
        state = self.state
        with state.cond:
            if state.closed:
                return
            state.closed = True
            idle = [e for h in self.hosts for e in state.drop_idle(h)]
            leased = state.leased()
            self._upkeep.wake()
            state.cond.notify_all()
        for entry in idle:
            self._lifecycle.destroy(entry)
        for entry in leased:
            entry.sandbox.abort()  # holders see their calls fail now and release (destroy) them
        with state.cond:  # closing a sandbox another thread is blocked on is unsafe: give holders a moment
            deadline = time.monotonic() + 2.0
            while state.leased() and time.monotonic() < deadline:
                state.cond.wait(0.05)
            stuck = state.clear()
        for entry in stuck:
            self.meter.change(busy=-1)
            self._lifecycle.destroy(entry)
        # Sandboxes still being made or reset in the background are destroyed by their workers when
        # they see the pool closed: wait for them, so that nothing of this pool outlives close().
        self._upkeep.stop()
        live = live_sandbox_ids()
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

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __deepcopy__(self, memo: dict) -> WarmPool:
        return self  # shared, never copied (gymnasium deep-copies the kwargs of gym.make, factories included)

    def __repr__(self) -> str:
        return f"WarmPool({[h.name for h in self.hosts]}, closed={self.state.closed})"

    def _lease(self, entry: Entry) -> None:
        self.state.lease(entry)
        self.meter.change(busy=1)
