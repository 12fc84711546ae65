"""The warm pool's upkeep: host health (probes, reports), shrinking, warming ahead of demand.

:class:`PoolUpkeep` runs one pass every ``maintenance_interval_s`` on its own
thread, sooner when woken (new demand, a suspect host): it probes hosts that
are out of rotation or under suspicion, frees the slots of leases whose holder
closed the sandbox instead of releasing it, destroys idle sandboxes past
``idle_ttl_s`` and creates sandboxes for queued demand and ``min_idle``.

It reaches the pool only through what it is given — the shared
:class:`~sandbox.pool.state.PoolState` (bookkeeping, one lock), the
:class:`~sandbox.pool.lifecycle.Lifecycle` (making and destroying sandboxes)
and a ``release`` callable — and the pool reaches it only through its public
methods (:meth:`PoolUpkeep.want`, :meth:`report`, :meth:`prewarm`, ...). The
demand hints, the specs seen and the suspect hosts are the upkeep's own,
guarded by the state's lock. Talking to daemons and creating or destroying
sandboxes happens outside that lock; only bookkeeping happens inside it, so a
slow or dead daemon never stalls a lease on a healthy host.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sandbox.backends.base import Sandbox, live_sandbox_ids
from sandbox.errors import DaemonUnreachable, ImageMissing, SandboxError, SandboxInfraError
from sandbox.pool.config import PoolConfig
from sandbox.pool.hosts import Host
from sandbox.pool.lifecycle import Lifecycle
from sandbox.pool.state import Entry, PoolState
from sandbox.spec import SandboxSpec, spec_key

log = logging.getLogger(__name__)

THREAD_PREFIX = "agentrl-pool"  # the upkeep's thread and its workers


class PoolUpkeep:
    """Keeps a warm pool's hosts checked and its idle sandboxes at the size demand needs.

    Args:
      state: the pool's bookkeeping (its lock guards this object's demand and suspects too).
      config: the pool's settings.
      lifecycle: makes and destroys the pool's sandboxes.
      release: ``release(sandbox, reusable)`` of the pool, for abandoned leases.
    """

    def __init__(
        self,
        state: PoolState,
        config: PoolConfig,
        lifecycle: Lifecycle,
        release: Callable[[Sandbox, bool], None],
    ):
        self._state = state
        self._config = config
        self._lifecycle = lifecycle
        self._release = release
        self._wanted: dict[tuple, tuple[SandboxSpec, int]] = {}  # demand hints from the scheduler
        self._seen: dict[tuple, SandboxSpec] = {}  # specs leased so far (min_idle applies to them)
        self._warming: dict[tuple, int] = {}  # sandboxes being created ahead of demand, per spec
        self._suspects: set[str] = set()  # healthy hosts to probe soon (an error surfaced on them)
        # Its own event, not the state's condition: that one is notified on every lease and release,
        # and a full pass per job would be pure overhead.
        self._wake = threading.Event()
        self._executor = cf.ThreadPoolExecutor(config.warm_workers, thread_name_prefix=THREAD_PREFIX)
        self._thread = threading.Thread(target=self._run, name=THREAD_PREFIX, daemon=True)

    # -- what the pool tells it ----------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Runs a pass now rather than at the next interval (or lets the thread see the pool closed)."""
        self._wake.set()

    def note_use(self, key: tuple, spec: SandboxSpec) -> None:
        """A lease of ``spec`` was asked for: ``min_idle`` applies to it from now on (state lock held)."""
        self._seen.setdefault(key, spec)

    def want(self, spec: SandboxSpec, n: int) -> None:
        """Demand hint: keep up to ``n`` sandboxes of ``spec`` warm (see :meth:`WarmPool.want`)."""
        with self._state.lock:
            key = spec_key(spec)
            previous = self._wanted.get(key, (spec, 0))[1]
            if n > 0:
                self._wanted[key] = (spec, n)
            else:
                self._wanted.pop(key, None)
        if n > previous:
            self.wake()

    def prewarm(self, spec: SandboxSpec, n: int, timeout: float | None) -> int:
        """Creates idle sandboxes of ``spec`` in parallel until ``n`` exist; returns how many it made."""
        key = spec_key(spec)
        futures: list[cf.Future] = []
        with self._state.lock:
            have = self._state.count_by_key().get(key, 0) + self._warming.get(key, 0)
            for _ in range(max(0, n - have)):
                future = self._start_warming(spec, key)
                if future is None:
                    break
                futures.append(future)
        return sum(f.result() is not None for f in cf.as_completed(futures, timeout=timeout))

    def report(self, host: Host, error: SandboxInfraError, spec: SandboxSpec | None = None) -> None:
        """What an infrastructure error says about its host.

        A missing image marks the host as lacking it (re-checked with backoff); an
        unreachable daemon takes the host out of rotation at once and drops its idle
        sandboxes; anything else (a container killed on a live daemon) only makes
        the host a suspect, probed on the next pass.
        """
        cfg, now = self._config, time.monotonic()
        drop: list[Entry] = []
        with self._state.cond:
            if isinstance(error, ImageMissing) and spec is not None:
                host.mark_missing(spec.image, error, now, first_s=cfg.image_recheck_s, max_s=cfg.image_recheck_max_s)
            elif isinstance(error, DaemonUnreachable):
                if host.mark_down(str(error), now, first_probe_s=cfg.health_first_probe_s):
                    drop = self._state.drop_idle(host)
            else:
                self._suspects.add(host.name)
                self.wake()
            self._state.cond.notify_all()
        for entry in drop:  # closing them may wait on the dead daemon: not on this thread
            if not self._submit(self._lifecycle.destroy, entry):
                self._lifecycle.destroy(entry)

    def stop(self) -> None:
        """After the pool closed: waits for sandboxes still being made (their workers destroy them)."""
        self.wake()
        in_worker = threading.current_thread().name.startswith(THREAD_PREFIX)
        self._executor.shutdown(wait=not in_worker, cancel_futures=True)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    # -- the passes ------------------------------------------------------------------
    def run_pass(self) -> None:
        """One round of upkeep; see the module docstring."""
        self._probe_hosts()
        self._collect_abandoned_leases()
        self._shrink()
        self._warm()

    def _run(self) -> None:
        while not self._state.closed:
            self._wake.wait(self._config.maintenance_interval_s)
            self._wake.clear()
            if self._state.closed:
                return
            try:
                self.run_pass()
            except Exception:  # noqa: BLE001 - the upkeep must outlive one bad pass
                log.exception("warm pool maintenance pass failed")

    def _probe_hosts(self) -> None:
        cfg, state = self._config, self._state
        now = time.monotonic()
        with state.lock:
            down = [h for h in state.hosts if not h.healthy and now >= h.next_probe]
            suspects = [h for h in state.hosts if h.healthy and h.name in self._suspects]
            self._suspects.clear()
        for host in down:
            try:
                host.probe(cfg.probe_timeout_s)
                # Back up: first remove what a restart may have left of our containers there.
                host.sweep(live_sandbox_ids())
            except Exception as exc:  # noqa: BLE001 - any failure keeps it out of rotation
                with state.lock:
                    host.probe_failed(
                        f"{exc.__class__.__name__}: {exc}", time.monotonic(), max_backoff_s=cfg.health_max_backoff_s
                    )
                continue
            with state.cond:
                host.mark_up()
                state.cond.notify_all()
        for host in suspects:
            try:
                host.probe(cfg.probe_timeout_s)
            except SandboxInfraError as exc:
                self.report(host, exc)  # a DaemonUnreachable: out of rotation, idle sandboxes dropped

    def _collect_abandoned_leases(self) -> None:
        """A holder that closed its sandbox instead of releasing it still frees the slot."""
        with self._state.lock:
            abandoned = self._state.abandoned()
        for sandbox in abandoned:
            self._release(sandbox, False)

    def _shrink(self) -> None:
        with self._state.lock:
            wanted = {key: n for key, (_, n) in self._wanted.items()}
            victims = self._state.expire_idle(time.monotonic() - self._config.idle_ttl_s, self._config.min_idle, wanted)
        for entry in victims:
            self._submit(self._lifecycle.destroy, entry)

    def _warm(self) -> None:
        """Creates sandboxes for queued demand (:meth:`want`) and to keep ``min_idle``."""
        state, min_idle = self._state, self._config.min_idle
        with state.lock:
            if state.closed:
                return
            capacity = sum(h.capacity for h in state.hosts if h.healthy)
            count = state.count_by_key()
            for key, n in self._warming.items():
                count[key] = count.get(key, 0) + n
            idle = state.idle_by_key()
            plans = [(key, spec, min(n, capacity) - count.get(key, 0)) for key, (spec, n) in self._wanted.items()]
            if min_idle:
                for key, spec in self._seen.items():
                    plans.append((key, spec, min_idle - idle.get(key, 0) - self._warming.get(key, 0)))
            for key, spec, missing in plans:
                for _ in range(max(0, missing)):
                    if self._start_warming(spec, key) is None:
                        break

    # -- making sandboxes ahead of demand --------------------------------------------------
    def _start_warming(self, spec: SandboxSpec, key: tuple) -> cf.Future | None:
        """Starts making one idle sandbox on the emptiest host with room; None if none has (lock held)."""
        now = time.monotonic()
        room = [h for h in self._state.hosts if h.can_run(spec.image, now) and h.total < h.max_sandboxes]
        if not room:
            return None
        host = min(room, key=lambda h: (h.total / h.max_sandboxes, h.total))
        host.warming += 1
        self._warming[key] = self._warming.get(key, 0) + 1
        try:
            return self._executor.submit(self._warm_one, host, spec, key)
        except RuntimeError:  # executor shut down: the pool is closing
            host.warming -= 1
            self._warming[key] -= 1
            return None

    def _warm_one(self, host: Host, spec: SandboxSpec, key: tuple) -> Entry | None:
        """Makes one idle sandbox on ``host`` (its ``warming`` count was raised by the caller)."""
        state = self._state
        try:
            entry = self._lifecycle.create(host, spec, key)
        except SandboxError as exc:
            with state.lock:
                host.warming -= 1
                self._warming[key] -= 1
            if isinstance(exc, SandboxInfraError):
                self.report(host, exc, spec)
            log.info("warming a sandbox on %s failed: %s", host.name, exc)
            return None
        with state.cond:
            host.warming -= 1
            self._warming[key] -= 1
            keep = not state.closed and host.healthy
            if keep:
                state.add(entry)
                state.park(entry, fresh=True)
                state.cond.notify_all()
        if not keep:
            self._lifecycle.destroy(entry)
            return None
        return entry

    def _submit(self, fn: Callable[..., Any], *args: Any) -> bool:
        try:
            self._executor.submit(fn, *args)
            return True
        except RuntimeError:  # executor shut down: the pool is closing
            return False
