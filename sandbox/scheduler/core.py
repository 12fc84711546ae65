"""The scheduler's engine: job states, the dispatcher thread, attempts, retries and endings.

Split from :mod:`sandbox.scheduler.scheduler` (the public API) so each reads on its own.
Every method here runs under the scheduler's lock unless its name says
otherwise (``_attempt*`` run on a job's own thread; ``_flush`` outside the
lock). Results and sandbox kills are queued under the lock and delivered by
``_flush`` after it is released: a future's callbacks may call back into the
scheduler, and killing a Docker sandbox is an API call.

A job's phases: ``queued`` → ``running`` → ``done``, with ``delayed`` (waiting
out a retry backoff) between attempts. Every path into ``done`` goes through
``_end``, which is idempotent, so each job gets exactly one result however a
timeout, a cancel, a deadline and the job's own return race.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import logging
import threading
import time
import traceback
from typing import Any

from sandbox.errors import SandboxClosed, SandboxInfraError
from sandbox.pool.metrics import Counters, Reservoir
from sandbox.pool.warm_pool import WarmPool
from sandbox.scheduler.jobs import ANOMALY, CANCELLED, ERROR, OK, TIMEOUT, Job, JobHandle, JobResult, RetryPolicy
from sandbox.spec import spec_key

log = logging.getLogger(__name__)

COUNTERS = ("submitted", "done", "ok", "errors", "timeouts", "anomalies", "cancelled", "retried", "deduplicated")
_STATUS_COUNTER = {OK: "ok", ERROR: "errors", TIMEOUT: "timeouts", ANOMALY: "anomalies", CANCELLED: "cancelled"}


@dataclasses.dataclass(eq=False)
class JobState:
    """A job's life inside the scheduler (guarded by the scheduler's lock)."""

    seq: int
    key: str
    job: Job
    handle: JobHandle
    submitted: float
    deadline_at: float
    max_attempts: int
    phase: str = "queued"  # queued | delayed | running | done
    attempt: int = 0  # attempts started
    slot: int | None = None  # the attempt holding a running slot
    sandbox: Any = None
    host: str | None = None
    dispatched: float = 0.0  # first time it got a running slot
    run_started: float = 0.0  # when the current attempt got its sandbox (0: not yet)
    ended_by: str | None = None  # set when a timeout / cancel / deadline ended the running attempt
    infra_errors: list[str] = dataclasses.field(default_factory=list)
    failed_hosts: list[str] = dataclasses.field(default_factory=list)

    @property
    def order(self) -> tuple:
        return (-self.job.priority, self.deadline_at, self.seq)


class SchedulerCore:
    """State and mechanics of :class:`~sandbox.scheduler.scheduler.Scheduler` (which adds the public API)."""

    def __init__(
        self,
        pool: WarmPool,
        retry: RetryPolicy,
        domain_caps: dict[str, int],
        max_running: int | None,
        abort_grace_s: float,
        no_host_timeout_s: float,
    ):
        self.pool, self.retry, self.domain_caps = pool, retry, domain_caps
        self.max_running, self.abort_grace_s, self.no_host_timeout_s = max_running, abort_grace_s, no_host_timeout_s
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._seq = itertools.count()
        self._ready: dict[str, list[tuple]] = {}  # domain -> heap of (order, state)
        self._delayed: list[tuple] = []  # heap of (not_before, seq, state): infra retries in backoff
        self._timers: list[tuple] = []  # heap of (when, seq, kind, state, attempt)
        self._running: dict[int, JobState] = {}
        self._per_domain: dict[str, int] = {}
        # Idempotency keys -> handles, oldest first; finished ones beyond max_remembered_keys are forgotten.
        self._by_key: collections.OrderedDict[str, JobHandle] = collections.OrderedDict()
        self._demand: dict[tuple, list] = {}  # spec key -> [spec, jobs queued or running]
        self._outbox: list[tuple[JobHandle, JobResult]] = []
        self._aborts: list[Any] = []
        self._threads: set[threading.Thread] = set()
        self._closing = False  # no new submissions
        self._cancelling = False  # infrastructure failures end as cancelled, not retried
        self._stopped = False
        self._stop_event = threading.Event()
        self._no_host_since: float | None = None
        self.counters = Counters(COUNTERS)
        self.queue_wait, self.run_time = Reservoir(), Reservoir()
        self._anomaly_causes = Counters()
        self._window_start = time.monotonic()
        self._dispatcher = threading.Thread(target=self._loop, name="agentrl-scheduler", daemon=True)
        self._dispatcher.start()

    # -- the dispatcher -----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                now = time.monotonic()
                self._fire_timers(now)
                while self._delayed and self._delayed[0][0] <= now:
                    _, _, st = heapq.heappop(self._delayed)
                    if st.phase == "delayed":
                        st.phase = "queued"
                        heapq.heappush(self._ready.setdefault(st.job.domain, []), (st.order, st))
                self._check_hosts(now)
                self._dispatch(now)
                if not self._outbox and not self._aborts:
                    wake = [t[0] for t in (self._timers[:1] + self._delayed[:1])]
                    self._cond.wait(max(0.001, min([0.5, *(w - now for w in wake)])))
            self._flush()

    def _dispatch(self, now: float) -> None:
        limit = self.max_running or self.pool.capacity()
        while len(self._running) < limit:
            best = None
            for domain, heap in self._ready.items():
                while heap and heap[0][1].phase != "queued":
                    heapq.heappop(heap)  # lazily drop cancelled / expired entries
                room = self._per_domain.get(domain, 0) < self.domain_caps.get(domain, 1 << 30)
                if heap and room and (best is None or heap[0][0] < best[0]):
                    best = (heap[0][0], domain)
            if best is None:
                return
            _, st = heapq.heappop(self._ready[best[1]])
            st.attempt += 1
            st.phase, st.slot, st.ended_by, st.run_started = "running", st.attempt, None, 0.0
            self._running[st.seq] = st
            self._per_domain[st.job.domain] = self._per_domain.get(st.job.domain, 0) + 1
            if st.attempt == 1:
                st.dispatched = now
                self.queue_wait.add(now - st.submitted)
            thread = threading.Thread(target=self._attempt, args=(st, st.attempt), name=f"agentrl-job-{st.seq}")
            thread.daemon = True
            self._threads.add(thread)
            thread.start()

    def _fire_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, kind, st, attempt = heapq.heappop(self._timers)
            if kind == "grace":  # the job's thread never came back from a killed sandbox
                if st.slot == attempt and st.sandbox is not None:
                    log.warning(
                        "job %s ignored the kill of its sandbox for %.0fs; destroying it", st.key, self.abort_grace_s
                    )
                    threading.Thread(target=self.pool.release, args=(st.sandbox, False), daemon=True).start()
                    self._free_slot(st, attempt)
            elif st.phase == "done":
                continue
            elif kind == "timeout" and st.phase == "running" and st.attempt == attempt and st.ended_by is None:
                self._end(st, TIMEOUT, error=f"job exceeded its wall-clock limit of {st.job.timeout_s}s")
            elif kind == "deadline":
                self._end(
                    st, ANOMALY, cause="deadline_exceeded", error=f"not finished {st.job.deadline_s}s after submission"
                )

    def _check_hosts(self, now: float) -> None:
        if self.pool.capacity() > 0 or self._cancelling:
            self._no_host_since = None
            return
        self._no_host_since = self._no_host_since or now
        if now - self._no_host_since >= self.no_host_timeout_s:
            for st in self._queued_states():
                self._end(
                    st, ANOMALY, cause="host_unavailable", error=f"no host in rotation for {self.no_host_timeout_s}s"
                )

    def _queued_states(self) -> list[JobState]:
        states = [st for heap in self._ready.values() for _, st in heap] + [st for _, _, st in self._delayed]
        return [st for st in states if st.phase in ("queued", "delayed")]

    # -- one attempt, on its own thread --------------------------------------------------
    def _attempt(self, st: JobState, attempt: int) -> None:
        try:
            self._attempt_body(st, attempt)
        finally:
            with self._cond:
                self._threads.discard(threading.current_thread())
                self._free_slot(st, attempt)
                self._cond.notify_all()
            self._flush()

    def _attempt_body(self, st: JobState, attempt: int) -> None:
        job = st.job
        try:
            sandbox = None if job.spec is None else self.pool.acquire(job.spec, avoid=st.failed_hosts)
        except SandboxInfraError as exc:
            with self._cond:
                self._infra_failure(st, attempt, exc, host=None)
            return
        except SandboxClosed as exc:
            with self._cond:
                self._end(st, CANCELLED, cause="shutdown", error=str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - a bug below us: no sample, and said loudly
            log.exception("job %s: acquiring a sandbox failed unexpectedly", st.key)
            with self._cond:
                self._end(st, ANOMALY, cause="internal_error", error="".join(traceback.format_exception(exc)))
            return
        host = self.pool.host_of(sandbox) if sandbox is not None else None
        with self._cond:
            live = st.phase == "running" and st.attempt == attempt and st.ended_by is None
            if live:
                st.sandbox, st.host, st.run_started = sandbox, host.name if host else None, time.monotonic()
                if job.timeout_s:
                    heapq.heappush(self._timers, (st.run_started + job.timeout_s, st.seq, "timeout", st, attempt))
                    self._cond.notify_all()
        if not live:  # cancelled or expired while we waited for the sandbox: it was never used
            if sandbox is not None:
                self.pool.release(sandbox, reusable=True)
            return
        value, error, infra = None, None, None
        try:
            value = job.fn(sandbox)
        except SandboxInfraError as exc:
            infra = exc
        except BaseException as exc:  # noqa: BLE001 - whatever the job raised is its result
            error = "".join(traceback.format_exception(exc)).strip()
        run_s = time.monotonic() - st.run_started
        with self._cond:
            st.sandbox = None
            ended_from_outside = st.ended_by is not None or st.phase == "done"
            if not ended_from_outside:
                self.run_time.add(run_s)
                if infra is not None and sandbox is None:  # its own sandbox failed: nothing to retry on
                    self._end(st, ANOMALY, cause=infra.cause, error=str(infra), run_s=run_s)
                elif infra is not None:
                    self._infra_failure(st, attempt, infra, host=st.host)
                elif error is not None:
                    self._end(st, ERROR, error=error, run_s=run_s)
                else:
                    self._end(st, OK, value=value, run_s=run_s)
            self._free_slot(st, attempt)
            self._cond.notify_all()
        self._flush()  # the result goes out before the sandbox is reset for the next job
        if sandbox is None:
            return
        reusable = not ended_from_outside and infra is None
        try:
            self.pool.release(sandbox, reusable, error=infra)
        except Exception:  # noqa: BLE001 - the result is out; a failed cleanup must not kill the thread
            log.exception("job %s: releasing sandbox %s failed", st.key, sandbox.id)

    # -- endings (all under the lock) ------------------------------------------------------
    def _infra_failure(self, st: JobState, attempt: int, exc: SandboxInfraError, host: str | None) -> None:
        if st.phase == "done" or st.attempt != attempt:
            return
        st.infra_errors.append(f"{exc.cause}: {exc}")
        if host:
            st.failed_hosts.append(host)
        delay = self.retry.delay(attempt)
        if self._cancelling or self.pool.closed:
            self._end(st, CANCELLED, cause="shutdown", error=str(exc))
        elif attempt >= st.max_attempts:
            self._end(st, ANOMALY, cause=exc.cause, error=str(exc))
        elif time.monotonic() + delay >= st.deadline_at:
            self._end(st, ANOMALY, cause="deadline_exceeded", error=f"no time left to retry after: {exc}")
        else:
            log.info("job %s: attempt %d failed (%s); retrying in %.2fs", st.key, attempt, exc.cause, delay)
            self.counters.add("retried")
            st.phase = "delayed"
            self._free_slot(st, attempt)
            heapq.heappush(self._delayed, (time.monotonic() + delay, st.seq, st))

    def _end(self, st: JobState, status: str, *, run_s: float = 0.0, **fields: Any) -> None:
        """Gives ``st`` its one result; if it is still running, its sandbox is killed under it."""
        if st.phase == "done":
            return
        now = time.monotonic()
        if st.phase == "running" and status not in (OK, ERROR):  # ended from outside the job's thread
            st.ended_by = status
            if st.sandbox is not None:
                self._aborts.append(st.sandbox)
                heapq.heappush(self._timers, (now + self.abort_grace_s, st.seq, "grace", st, st.attempt))
            if not run_s and st.run_started:
                run_s = now - st.run_started
        st.phase = "done"
        self._change_demand(st, -1)
        result = JobResult(
            key=st.key,
            status=status,
            attempts=st.attempt,
            host=st.host,
            domain=st.job.domain,
            queue_wait_s=st.dispatched - st.submitted if st.dispatched else now - st.submitted,
            run_s=run_s,
            total_s=now - st.submitted,
            infra_errors=tuple(st.infra_errors),
            metadata=st.job.metadata,
            **fields,
        )
        self.counters.add("done")
        self.counters.add(_STATUS_COUNTER[status])
        if status == ANOMALY:
            self._anomaly_causes.add(result.cause or "unknown")
        self._outbox.append((st.handle, result))

    def _free_slot(self, st: JobState, attempt: int) -> None:
        if st.slot == attempt:
            st.slot = None
            self._running.pop(st.seq, None)
            self._per_domain[st.job.domain] -= 1

    def _change_demand(self, st: JobState, delta: int) -> None:
        if st.job.spec is None:  # leases nothing: no demand on the pool
            return
        key = spec_key(st.job.spec)
        entry = self._demand.setdefault(key, [st.job.spec, 0])
        entry[1] += delta
        self.pool.want(entry[0], entry[1])
        if entry[1] <= 0:
            del self._demand[key]

    def _cancel(self, st: JobState) -> bool:
        with self._cond:
            if st.phase == "done":
                return False
            self._end(st, CANCELLED, cause="cancelled", error="cancelled by the caller")
            self._cond.notify_all()
        self._flush()
        return True

    def _cancel_many(self, states: list[JobState]) -> int:
        """Cancels several jobs under one hold of the lock, so no slot one frees goes to another of them."""
        with self._cond:
            live = [st for st in states if st.phase != "done"]
            for st in sorted(live, key=lambda st: st.phase == "running"):  # queued ones first
                self._end(st, CANCELLED, cause="cancelled", error="cancelled by the caller")
            self._cond.notify_all()
        self._flush()
        return len(live)

    def _flush(self) -> None:
        """Delivers results and kills sandboxes outside the lock (callbacks may call back into us)."""
        with self._lock:
            outbox, self._outbox = self._outbox, []
            aborts, self._aborts = self._aborts, []
        for sandbox in aborts:
            self.pool.abort(sandbox)
        for handle, result in outbox:
            if not handle.future.done():
                handle.future.set_result(result)
