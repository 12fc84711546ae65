"""What the scheduler runs (`Job`) and what comes back (`JobResult`), plus handles to wait on them.

The one rule that matters downstream: a result is either a *sample* — the
code ran and did something (``ok``, ``error``, ``timeout``) — or *no sample*
(``anomaly``: the infrastructure failed past the retry budget; ``cancelled``).
A verifier or the rollout must drop no-sample results from the batch, never
score them 0: a dead Docker daemon says nothing about the policy.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import math
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandbox.errors import SandboxUsageError
from sandbox.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.backends.base import Sandbox

OK, ERROR, TIMEOUT, ANOMALY, CANCELLED = "ok", "error", "timeout", "anomaly", "cancelled"
STATUSES = (OK, ERROR, TIMEOUT, ANOMALY, CANCELLED)
SAMPLE_STATUSES = (OK, ERROR, TIMEOUT)


def _positive(value: Any, field: str, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok:
        raise SandboxUsageError(f"{field}: expected a finite number of seconds > 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Job:
    """A function that needs a sandbox, and how to run it.

    Attributes:
      fn: called as ``fn(sandbox)`` with a clean sandbox; its return value is the
        result's ``value``. It must keep its effects inside the sandbox: after an
        infrastructure failure it runs again in a fresh one.
      spec: the sandbox it needs; None for a job that brings its own (an episode's step on the
        sandbox it holds) or needs none: it is ordered, capped, timed and metered like any other
        and gets ``fn(None)``, but nothing is leased, so there is nothing to retry on: an
        infrastructure failure it raises ends it as an ``anomaly``.
      priority: higher runs sooner; ties go to the earlier deadline, then FIFO.
      timeout_s: wall-clock limit of one run of ``fn``, enforced from outside the
        sandbox; exceeding it is a ``timeout`` result (the code's doing) and the
        sandbox is destroyed, never reused. None: no limit.
      deadline_s: seconds after submission by which the job must be finished,
        retries included; past it the job ends as an ``anomaly`` with cause
        ``deadline_exceeded`` (it never got a fair run). None: no deadline.
      key: idempotency key; submitting a key the scheduler has seen returns the
        first submission's handle instead of running the job again.
      domain: for per-domain concurrency caps and metrics (e.g. ``"swe"``, ``"math"``).
      max_attempts: overrides the scheduler's retry policy for this job.
      metadata: carried through to the result untouched (task ids, group ids).
    """

    fn: Callable[[Sandbox], Any]
    spec: SandboxSpec | None = dataclasses.field(default_factory=SandboxSpec)
    priority: int = 0
    timeout_s: float | None = None
    deadline_s: float | None = None
    key: str | None = None
    domain: str = "default"
    max_attempts: int | None = None
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not callable(self.fn):
            raise SandboxUsageError(f"Job.fn: expected a callable taking a Sandbox, got {self.fn!r:.80}")
        if self.spec is not None and not isinstance(self.spec, SandboxSpec):
            raise SandboxUsageError(f"Job.spec: expected a SandboxSpec or None, got {type(self.spec).__name__}")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise SandboxUsageError(f"Job.priority: expected an int, got {self.priority!r}")
        _positive(self.timeout_s, "Job.timeout_s")
        _positive(self.deadline_s, "Job.deadline_s")
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise SandboxUsageError(f"Job.key: expected a non-empty str or None, got {self.key!r}")
        if not isinstance(self.domain, str) or not self.domain:
            raise SandboxUsageError(f"Job.domain: expected a non-empty str, got {self.domain!r}")
        if self.max_attempts is not None and (
            not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 1
        ):
            raise SandboxUsageError(f"Job.max_attempts: expected an int >= 1 or None, got {self.max_attempts!r}")
        if not isinstance(self.metadata, Mapping):
            raise SandboxUsageError(f"Job.metadata: expected a mapping, got {type(self.metadata).__name__}")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Retries of infrastructure failures only: exponential backoff, then an anomaly.

    Attempt ``n`` (1-based) that fails waits ``min(backoff_s * 2**(n-1), backoff_max_s)``
    before attempt ``n + 1``; after ``max_attempts`` the job is an anomaly.
    """

    max_attempts: int = 3
    backoff_s: float = 0.25
    backoff_max_s: float = 10.0

    def __post_init__(self):
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise SandboxUsageError(f"RetryPolicy.max_attempts: expected an int >= 1, got {self.max_attempts!r}")
        _positive(self.backoff_s, "RetryPolicy.backoff_s", allow_none=False)
        _positive(self.backoff_max_s, "RetryPolicy.backoff_max_s", allow_none=False)

    def delay(self, failed_attempt: int) -> float:
        return min(self.backoff_s * 2 ** max(0, failed_attempt - 1), self.backoff_max_s)


@dataclasses.dataclass(frozen=True)
class JobResult:
    """How one job ended. Exactly one per job, however many attempts it took.

    Attributes:
      key: the job's idempotency key (or the one the scheduler made up).
      status: ``ok`` (fn returned), ``error`` (fn raised something that is not an
        infrastructure failure), ``timeout`` (fn exceeded ``timeout_s``),
        ``anomaly`` (infrastructure failed on every attempt, or the deadline
        passed), ``cancelled``.
      value: what ``fn`` returned (``ok`` only).
      error: the exception, formatted, for ``error`` / ``anomaly``.
      cause: machine-readable reason for ``anomaly`` / ``cancelled``
        (``daemon_unreachable``, ``image_missing``, ``deadline_exceeded``, ``shutdown``...).
      attempts: runs started (retries of infrastructure failures included).
      host: where the final attempt ran.
      infra_errors: ``cause: message`` of each failed attempt, oldest first.
    """

    key: str
    status: str
    value: Any = None
    error: str | None = None
    cause: str | None = None
    attempts: int = 0
    host: str | None = None
    domain: str = "default"
    queue_wait_s: float = 0.0
    run_s: float = 0.0
    total_s: float = 0.0
    infra_errors: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise SandboxUsageError(f"JobResult.status: expected one of {STATUSES}, got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def is_sample(self) -> bool:
        """True if the code really ran (ok / error / timeout); False for anomaly / cancelled: drop, don't score."""
        return self.status in SAMPLE_STATUSES

    @property
    def anomaly(self) -> bool:
        return self.status == ANOMALY

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form for trajectories and logs (``value`` via its ``to_dict`` if it has one)."""
        value = self.value.to_dict() if hasattr(self.value, "to_dict") else self.value
        if not isinstance(value, (str, int, float, bool, dict, list, type(None))):
            value = repr(value)
        out = dataclasses.asdict(dataclasses.replace(self, value=None, metadata={}))
        out.update(value=value, metadata=dict(self.metadata), infra_errors=list(self.infra_errors))
        return out


class JobHandle:
    """A submitted job: wait on it, await it, or cancel it. Its future never raises: it holds a JobResult."""

    def __init__(self, key: str, job: Job, canceller: Callable[[], bool]):
        self.key = key
        self.job = job
        self.future: cf.Future[JobResult] = cf.Future()
        self._canceller = canceller  # ends this job in the scheduler that queued it
        self.job_state: object = None  # the scheduler's state of this job, for cancelling a batch at once

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> JobResult:
        """Blocks until the job has ended; ``TimeoutError`` if ``timeout`` passes first."""
        return self.future.result(timeout)

    def cancel(self) -> bool:
        """Cancels the job if it has not ended (a running one has its sandbox destroyed); True if it did."""
        return self._canceller()

    def __await__(self):
        import asyncio  # deferred, like the other async entry points: `import sandbox` stays light

        return asyncio.wrap_future(self.future).__await__()

    def __repr__(self) -> str:
        state = self.future.result().status if self.future.done() else "pending"
        return f"JobHandle({self.key!r}, {state})"


class Batch:
    """Handles of jobs submitted together: results in submission or completion order, sync or async."""

    def __init__(self, handles: Sequence[JobHandle], canceller: Callable[[Sequence[JobHandle]], int] | None = None):
        self.handles = list(handles)
        self._canceller = canceller  # ends several jobs at once in the scheduler that queued them

    def __len__(self) -> int:
        return len(self.handles)

    def results(self, *, timeout: float | None = None) -> list[JobResult]:
        """All results, in submission order (blocks until every job has ended)."""
        futures = [h.future for h in self.handles]
        _, pending = cf.wait(futures, timeout=timeout)
        if pending:
            raise TimeoutError(f"{len(pending)} of {len(futures)} jobs still pending after {timeout}s")
        return [f.result() for f in futures]

    def as_completed(self, timeout: float | None = None) -> Iterator[JobResult]:
        """Results as they finish (blocking iterator)."""
        for future in cf.as_completed([h.future for h in self.handles], timeout=timeout):
            yield future.result()

    async def __aiter__(self) -> AsyncIterator[JobResult]:
        """``async for result in batch``: results as they finish."""
        import asyncio

        for waiter in asyncio.as_completed([asyncio.wrap_future(h.future) for h in self.handles]):
            yield await waiter

    async def gather(self) -> list[JobResult]:
        """All results in submission order, awaited."""
        import asyncio

        return list(await asyncio.gather(*(asyncio.wrap_future(h.future) for h in self.handles)))

    def cancel(self) -> int:
        """Cancels every job of the batch that has not ended, all at once; returns how many it cancelled.

        At once, not one by one: cancelling a running job frees its slot, and a queued job of the
        same batch not yet cancelled would start in it (a sandbox made for a cancelled batch).
        """
        pending = [h for h in self.handles if not h.done()]
        if self._canceller is not None:
            return self._canceller(pending)
        return sum(h.cancel() for h in pending)

    def done(self) -> bool:
        return all(h.done() for h in self.handles)
