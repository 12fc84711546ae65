"""The scheduler: thousands of sandbox jobs in priority order, each ending in exactly one result.

    from sandbox import Job, Scheduler
    with Scheduler("bwrap", capacity=2) as sched:  # makes (and closes) its own WarmPool
        results = sched.run([Job(lambda sb: sb.exec("python3 -c 'print(1)'").stdout) for _ in range(100)])

A job is a function that gets a clean pooled sandbox. Jobs wait in a priority
queue (per-domain concurrency caps skip a full domain's jobs, not the queue);
a dispatcher thread starts as many as the pool's hosts in rotation can run,
each on its own thread. Wall-clock timeouts are enforced from outside: the
sandbox is killed under the job (:meth:`Sandbox.abort`) and destroyed, never
reused. Only infrastructure failures (:class:`SandboxInfraError`) are retried,
with exponential backoff and preferably on another host; a job whose code
failed, timed out or was OOM-killed is a result. When the retry budget is
spent, the result is an ``anomaly`` — "no sample", never a reward of 0.

Results are set before the sandbox is reset for its next job, so a job's
latency never includes the cleanup after it.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sandbox.errors import SandboxClosed, SandboxUsageError
from sandbox.pool import cleanup
from sandbox.pool.metrics import format_line, percentile_keys
from sandbox.pool.warm_pool import WarmPool
from sandbox.scheduler.core import JobState, SchedulerCore
from sandbox.scheduler.jobs import CANCELLED, Batch, Job, JobHandle, JobResult, RetryPolicy

log = logging.getLogger(__name__)
POOL_API = ("acquire", "release", "abort", "want", "capacity", "host_of", "stats")


class Scheduler(SchedulerCore):
    """Runs :class:`Job` s on a :class:`WarmPool`; see the module docstring.

    Args:
      pool: a :class:`WarmPool` or a :class:`~sandbox.fleet.ray_fleet.RayFleet` (any object with their
        interface, ``POOL_API``), or what a WarmPool accepts (``"bwrap"``, a daemon URL, hosts): then the
        scheduler owns the pool and closes it.
      capacity: per-host leases for a pool the scheduler makes.
      retry: retry policy for infrastructure failures.
      domain_caps: at most this many running jobs per ``Job.domain``.
      max_running: overall cap on running jobs (default: the capacity of the hosts in rotation).
      log_interval_s: period of the progress log line (None: never).
      abort_grace_s: after killing a timed-out or cancelled job's sandbox, how long its thread
        has to notice before the sandbox is destroyed from outside.
      no_host_timeout_s: queued jobs become anomalies (``host_unavailable``) once no host has
        been in rotation for this long.
      max_remembered_keys: idempotency keys remembered; the oldest *finished* ones beyond this are
        forgotten (a key resubmitted after that many newer keyed jobs runs again).
    """

    def __init__(
        self,
        pool: Any = "bwrap",
        *,
        capacity: int | None = None,
        retry: RetryPolicy | None = None,
        domain_caps: Mapping[str, int] | None = None,
        max_running: int | None = None,
        log_interval_s: float | None = 30.0,
        abort_grace_s: float = 5.0,
        no_host_timeout_s: float = 300.0,
        max_remembered_keys: int = 100_000,
    ):
        self.retry = retry or RetryPolicy()
        if not isinstance(self.retry, RetryPolicy):
            raise SandboxUsageError(f"retry: expected a RetryPolicy, got {type(self.retry).__name__}")
        self.domain_caps = dict(domain_caps or {})
        for domain, cap in self.domain_caps.items():
            if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
                raise SandboxUsageError(f"domain_caps[{domain!r}]: expected an int >= 1, got {cap!r}")
        if max_running is not None and (not isinstance(max_running, int) or max_running < 1):
            raise SandboxUsageError(f"max_running: expected an int >= 1 or None, got {max_running!r}")
        for name, value in (("abort_grace_s", abort_grace_s), ("no_host_timeout_s", no_host_timeout_s)):
            if not isinstance(value, (int, float)) or not value > 0:
                raise SandboxUsageError(f"{name}: expected seconds > 0, got {value!r}")
        if log_interval_s is not None and (not isinstance(log_interval_s, (int, float)) or not log_interval_s > 0):
            raise SandboxUsageError(f"log_interval_s: expected seconds > 0 or None, got {log_interval_s!r}")
        if not isinstance(max_remembered_keys, int) or max_remembered_keys < 1:
            raise SandboxUsageError(f"max_remembered_keys: expected an int >= 1, got {max_remembered_keys!r}")
        self.max_remembered_keys = max_remembered_keys
        # A WarmPool, or anything with its interface (a RayFleet): used as is, closed by its maker.
        self._owns_pool = not (isinstance(pool, WarmPool) or all(callable(getattr(pool, m, None)) for m in POOL_API))
        pool = WarmPool(pool, capacity=capacity) if self._owns_pool else pool
        super().__init__(pool, self.retry, self.domain_caps, max_running, abort_grace_s, no_host_timeout_s)
        self._logger = None
        if log_interval_s:
            self._logger = threading.Thread(target=self._log_loop, args=(log_interval_s,), daemon=True)
            self._logger.start()
        cleanup.register(self)

    # -- submitting -------------------------------------------------------------
    def submit(self, job: Job | Callable, **fields: Any) -> JobHandle:
        """Queues a job (or ``fn`` plus :class:`Job` fields); a known ``key`` returns the first handle."""
        if not isinstance(job, Job):
            job = Job(job, **fields)
        elif fields:
            raise SandboxUsageError(f"submit: pass Job fields either in the Job or as keywords, not both: {fields}")
        with self._cond:
            if self._closing:
                raise SandboxClosed("[scheduler] the scheduler is closed")
            if job.key is not None and job.key in self._by_key:
                self.counters.add("deduplicated")
                return self._by_key[job.key]
            seq = next(self._seq)
            key = job.key or f"job-{seq}"
            # The handle cancels through this job's state, which needs the handle: bound late.
            handle = JobHandle(key, job, lambda: self._cancel(st))
            now = time.monotonic()
            deadline = now + job.deadline_s if job.deadline_s else float("inf")
            st = JobState(seq, key, job, handle, now, deadline, job.max_attempts or self.retry.max_attempts)
            handle.job_state = st  # for Batch.cancel, which ends several jobs under one lock
            if job.key is not None:
                self._by_key[key] = handle
                while len(self._by_key) > self.max_remembered_keys and next(iter(self._by_key.values())).done():
                    self._by_key.popitem(last=False)
            heapq.heappush(self._ready.setdefault(job.domain, []), (st.order, st))
            if job.deadline_s:
                heapq.heappush(self._timers, (deadline, seq, "deadline", st, 0))
            self._change_demand(st, +1)
            self.counters.add("submitted")
            self._cond.notify_all()
        return handle

    def submit_batch(self, jobs: Iterable[Job | Callable]) -> Batch:
        """Queues several jobs; the :class:`Batch` gives their results in order, as completed, or async."""
        return Batch([self.submit(job) for job in jobs], canceller=self._cancel_handles)

    def _cancel_handles(self, handles: Sequence[JobHandle]) -> int:
        return self._cancel_many([h.job_state for h in handles if h.job_state is not None])

    def run(
        self, jobs: Iterable[Job | Callable], *, enough: int | None = None, timeout: float | None = None
    ) -> list[JobResult]:
        """Runs jobs and returns their results in submission order (blocking).

        ``enough``: once this many *samples* (ok / error / timeout results) are in, cancel the
        rest of the batch — the long-tail cut for group sampling. Cancelled jobs come back as
        ``cancelled`` results.
        """
        batch = self.submit_batch(jobs)
        if enough is not None:
            if not isinstance(enough, int) or enough < 1:
                raise SandboxUsageError(f"run(enough=): expected an int >= 1, got {enough!r}")
            samples = 0
            for result in batch.as_completed(timeout=timeout):
                samples += result.is_sample
                if samples >= enough:
                    batch.cancel()
                    break
        return batch.results(timeout=timeout)

    # -- metrics ------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """A snapshot with namespaced keys (``sandbox/queue_wait_p50_s``, ``sandbox/utilisation``, ...)."""
        with self._lock:
            queued = sum(1 for heap in self._ready.values() for _, st in heap if st.phase == "queued")
            queued += sum(1 for _, _, st in self._delayed if st.phase == "delayed")
            running = len(self._running)
        counts = self.counters.snapshot()
        elapsed = max(time.monotonic() - self._window_start, 1e-9)
        out = {f"sandbox/{name}": float(value) for name, value in counts.items()}
        out.update({"sandbox/queued": float(queued), "sandbox/running": float(running)})
        out["sandbox/jobs_per_s"] = counts["done"] / elapsed
        out.update(percentile_keys("sandbox/queue_wait", self.queue_wait))
        out.update(percentile_keys("sandbox/run", self.run_time))
        out.update({f"sandbox/anomaly/{c}": float(n) for c, n in self._anomaly_causes.snapshot().items()})
        out.update(self.pool.stats())
        return out

    def reset_metrics(self) -> None:
        """Starts a new measurement window: counts, percentiles, utilisation and jobs/s restart from zero."""
        self.counters.clear()
        self._anomaly_causes.clear()
        self.queue_wait.clear()
        self.run_time.clear()
        self.pool.meter.reset_window()
        self._window_start = time.monotonic()

    # -- lifecycle ------------------------------------------------------------------
    def close(self, *, cancel: bool = False, reason: str = "shutdown") -> None:
        """Stops the scheduler: drains (waits for every job) or, with ``cancel``, cancels what is left."""
        with self._cond:
            self._closing = True
            self._cancelling = self._cancelling or cancel
            if cancel:
                for st in [*self._running.values(), *self._queued_states()]:
                    self._end(st, CANCELLED, cause="shutdown", error=reason)
            self._cond.notify_all()
        self._flush()
        with self._cond:
            while not cancel and (self._running or self._queued_states()):
                self._cond.wait(0.1)
            self._stopped = True
            self._stop_event.set()
            self._cond.notify_all()
            threads = [self._dispatcher, *self._threads]
        deadline = time.monotonic() + self.abort_grace_s + 1
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        cleanup.unregister(self)
        if self._owns_pool:
            self.pool.close()

    def shutdown(self, reason: str = "shutdown") -> None:
        """What the cleanup hooks call on SIGINT/SIGTERM and at exit: cancel everything, now."""
        if not self._stopped:
            self.close(cancel=True, reason=reason)

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(cancel=exc_type is not None)

    def _log_loop(self, interval: float) -> None:
        last = None
        while not self._stop_event.wait(interval):
            m = self.metrics()
            state = (m["sandbox/done"], m["sandbox/queued"], m["sandbox/running"])
            if state != last and not self._stopped:
                log.info(format_line(m))
            last = state
