"""The scheduler: ordering, results vs anomalies, retries, timeouts, priorities, caps, cancellation, metrics."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time

import pytest

from sandbox import (
    Host,
    Job,
    JobResult,
    RetryPolicy,
    SandboxClosed,
    SandboxSpec,
    SandboxUsageError,
    Scheduler,
    WarmPool,
)
from sandbox.pool.metrics import format_line
from tests.sandbox.conftest import backend_or_skip, kill_underneath
from tests.sandbox.test_pool import SPEC, fast_config, wait_for

FAST_RETRY = RetryPolicy(max_attempts=3, backoff_s=0.05, backoff_max_s=0.2)


@pytest.fixture
def sched(backend):
    with (
        WarmPool(Host(backend, capacity=2), config=fast_config()) as pool,
        Scheduler(pool, retry=FAST_RETRY, log_interval_s=None) as s,
    ):
        yield s


@pytest.fixture
def local():
    """A bwrap scheduler for behaviour that does not depend on the backend."""
    with (
        WarmPool(Host(backend_or_skip("bwrap"), capacity=2), config=fast_config()) as pool,
        Scheduler(pool, retry=FAST_RETRY, log_interval_s=None) as s,
    ):
        yield s


def square_after(delay: float, i: int):
    return Job(lambda sb: int(sb.exec(f"sleep {delay}; echo $(( {i} * {i} ))").stdout), spec=SPEC, key=f"sq{i}")


def test_results_in_submission_order_and_as_they_complete(sched):
    delays = [3.0, 0.0, 0.3, 0.0]  # sq0 holds one of the 2 slots while the others pass through the other
    batch = sched.submit_batch(square_after(d, i) for i, d in enumerate(delays))
    completed = [r.key for r in batch.as_completed(timeout=120)]
    assert completed.index("sq1") < completed.index("sq0") and completed.index("sq3") < completed.index("sq0")
    results = batch.results()
    assert [r.key for r in results] == ["sq0", "sq1", "sq2", "sq3"]
    assert [r.value for r in results] == [0, 1, 4, 9] and all(r.ok and r.is_sample for r in results)
    assert all(r.attempts == 1 and r.host == sched.pool.hosts[0].name for r in results)


def test_async_iteration_and_gather(local):
    async def collect():
        batch = local.submit_batch(square_after(0.0, i) for i in range(4))
        seen = [r.value async for r in batch]
        ordered = await local.submit_batch(square_after(0.0, i) for i in range(4, 6)).gather()
        single = await local.submit(Job(lambda sb: sb.exec("echo one").stdout, spec=SPEC))
        return seen, ordered, single

    seen, ordered, single = asyncio.run(collect())
    assert sorted(seen) == [0, 1, 4, 9]
    assert [r.value for r in ordered] == [16, 25] and single.value == b"one\n"


def test_code_failures_are_results_never_retried(sched):
    calls = collections.Counter()

    def job(name, fn):
        def run(sb):
            calls[name] += 1
            return fn(sb)

        return Job(run, spec=SPEC, key=name)

    results = sched.run(
        [
            job("raises", lambda sb: 1 / 0),
            job("exit3", lambda sb: sb.exec("exit 3")),
            job("oom", lambda sb: sb.exec("python3 -c 'x = bytearray(2 << 30)'", timeout=20)),
            job("slow-cmd", lambda sb: sb.exec("sleep 5", timeout=0.3)),
        ]
    )
    by = {r.key: r for r in results}
    assert by["raises"].status == "error" and "ZeroDivisionError" in by["raises"].error
    assert by["exit3"].ok and by["exit3"].value.exit_code == 3
    assert by["oom"].ok and by["oom"].value.oom_killed
    assert by["slow-cmd"].ok and by["slow-cmd"].value.timed_out
    assert all(r.is_sample and r.attempts == 1 for r in results)
    assert set(calls.values()) == {1}
    assert sched.metrics()["sandbox/retried"] == 0


def test_job_timeout_destroys_the_sandbox(sched):
    seen = []

    def hang(sb):
        seen.append(sb)
        return sb.exec("sleep 60", timeout=120)

    result = sched.run([Job(hang, spec=SPEC, timeout_s=0.5)])[0]
    assert result.status == "timeout" and result.is_sample and result.attempts == 1
    assert "0.5s" in result.error
    wait_for(lambda: seen[0].closed, 30, "the timed-out sandbox to be destroyed")
    after = sched.run([Job(lambda sb: sb.id, spec=SPEC)])[0]
    assert after.value != seen[0].id  # never handed out again


def test_job_stuck_outside_the_sandbox_times_out_and_its_sandbox_is_reclaimed(backend):
    with (
        WarmPool(Host(backend, capacity=1), config=fast_config()) as pool,
        Scheduler(pool, log_interval_s=None, abort_grace_s=0.5) as sched,
    ):
        seen = []
        release = threading.Event()

        def stuck(sb):
            seen.append(sb)
            release.wait(30)  # pure Python: killing the sandbox cannot interrupt it

        result = sched.run([Job(stuck, spec=SPEC, timeout_s=0.3)])[0]
        assert result.status == "timeout"
        wait_for(lambda: seen[0].closed, 30, "the grace period to reclaim the sandbox")
        assert sched.run([Job(lambda sb: sb.exec("echo next").stdout, spec=SPEC)])[0].value == b"next\n"
        release.set()


def test_infrastructure_failures_are_retried_then_become_anomalies(sched):
    attempts = collections.defaultdict(list)

    def flaky(times: int):
        def run(sb):
            attempts[times].append(time.monotonic())
            if len(attempts[times]) <= times:
                kill_underneath(sb)
            return sb.exec("echo survived").stdout_text.strip()

        return Job(run, spec=SPEC, key=f"flaky{times}")

    once, always = sched.run([flaky(1), flaky(99)])
    assert once.ok and once.value == "survived" and once.attempts == 2
    assert once.infra_errors and once.infra_errors[0].startswith("sandbox_vanished")
    assert always.status == "anomaly" and not always.is_sample and always.attempts == 3
    assert always.cause == "sandbox_vanished" and len(always.infra_errors) == 3
    gaps = [b - a for a, b in zip(attempts[99], attempts[99][1:], strict=False)]
    assert gaps[0] >= FAST_RETRY.delay(1) and gaps[1] >= FAST_RETRY.delay(2)  # backed off
    m = sched.metrics()
    assert m["sandbox/retried"] == 3 and m["sandbox/anomalies"] == 1 and m["sandbox/anomaly/sandbox_vanished"] == 1


def test_priorities_then_deadlines_then_fifo(local):
    order: list[str] = []
    gate = threading.Event()
    local.max_running = 1
    blocker = local.submit(Job(lambda sb: gate.wait(30), spec=SPEC))
    wait_for(lambda: local.metrics()["sandbox/running"] == 1, 30, "the blocker to start")

    def rec(name, **kw):
        return Job(lambda sb: order.append(name), spec=SPEC, key=name, **kw)

    batch = local.submit_batch(
        [rec("low", priority=-1), rec("a"), rec("b"), rec("urgent", deadline_s=60), rec("high", priority=5)]
    )
    gate.set()
    batch.results(timeout=60)
    assert blocker.result().ok
    assert order == ["high", "urgent", "a", "b", "low"]


def test_domain_caps_bound_a_domain_not_the_queue():
    running, peak, lock = collections.Counter(), collections.Counter(), threading.Lock()

    def job(domain):
        def run(sb):
            with lock:
                running[domain] += 1
                peak[domain] = max(peak[domain], running[domain])
            sb.exec("sleep 1")  # long enough to overlap however slowly sandboxes start
            with lock:
                running[domain] -= 1

        return Job(run, spec=SPEC, domain=domain)

    with (
        WarmPool(Host(backend_or_skip("bwrap"), capacity=4), config=fast_config()) as pool,
        Scheduler(pool, domain_caps={"swe": 1}, log_interval_s=None) as sched,
    ):
        # The capped domain's jobs are first in the queue: the others must run past them.
        results = sched.run([job("swe") for _ in range(3)] + [job("math") for _ in range(4)])
    assert all(r.ok for r in results)
    assert peak["swe"] == 1 and peak["math"] >= 2


def test_idempotency_key_runs_a_job_once(local):
    calls = []
    job = Job(lambda sb: calls.append(1) or len(calls), spec=SPEC, key="task-17/sample-3")
    first, second = local.submit(job), local.submit(job)
    assert first is second
    assert first.result(60).value == 1 and local.submit(job).result().value == 1
    assert calls == [1] and local.metrics()["sandbox/deduplicated"] == 2


def test_enough_results_cancels_the_rest_of_the_batch(sched):
    seen = []

    def slow(sb):
        seen.append(sb)
        return sb.exec("sleep 60", timeout=120)

    jobs = [square_after(0.0, i) for i in range(3)] + [Job(slow, spec=SPEC, key=f"slow{i}") for i in range(4)]
    results = sched.run(jobs, enough=3)
    statuses = collections.Counter(r.status for r in results)
    assert statuses == {"ok": 3, "cancelled": 4}
    assert all(not r.is_sample for r in results if r.status == "cancelled")
    wait_for(lambda: all(sb.closed for sb in seen), 30, "cancelled jobs' sandboxes to be destroyed")
    wait_for(lambda: sched.pool.stats()["sandbox/pool_leased"] == 0, 30, "leases to be returned")


def test_deadline_passing_in_the_queue_is_an_anomaly(local):
    local.max_running = 1
    gate = threading.Event()
    local.submit(Job(lambda sb: gate.wait(30), spec=SPEC))
    wait_for(lambda: local.metrics()["sandbox/running"] == 1, 30, "the blocker to start")
    late = local.submit(Job(lambda sb: "ran", spec=SPEC, deadline_s=0.3))
    result = late.result(30)
    gate.set()
    assert result.status == "anomaly" and result.cause == "deadline_exceeded" and result.value is None


def test_no_host_in_rotation_ends_queued_jobs_as_anomalies():
    backend_or_skip("docker")
    pool = WarmPool(Host("tcp://127.0.0.1:9", capacity=2), config=fast_config(no_host_timeout_s=0.5))
    with pool, Scheduler(pool, log_interval_s=None, no_host_timeout_s=0.5) as sched:
        result = sched.run([Job(lambda sb: 1, spec=SPEC)], timeout=60)[0]
    assert result.status == "anomaly" and result.cause == "host_unavailable"


def test_metrics_snapshot_and_periodic_log_line(local, caplog):
    local.reset_metrics()
    local.run([square_after(0.05, i) for i in range(6)])
    m = local.metrics()
    assert m["sandbox/done"] == 6 and m["sandbox/ok"] == 6 and m["sandbox/queued"] == 0
    assert m["sandbox/queue_wait_count"] == 6 and m["sandbox/run_p99_s"] >= m["sandbox/run_p50_s"] > 0.05
    assert 0 < m["sandbox/utilisation"] <= 1 and m["sandbox/jobs_per_s"] > 0
    assert all(k.startswith("sandbox/") for k in m)
    assert "done 6 (ok 6" in format_line(m)
    with caplog.at_level(logging.INFO, logger="sandbox.scheduler"):
        with Scheduler(local.pool, log_interval_s=0.1) as chatty:
            chatty.run([square_after(0.3, i) for i in range(2)])
        assert any("jobs/s" in rec.message and "ETA" in rec.message for rec in caplog.records)


def test_closed_scheduler_refuses_jobs_and_validation_names_the_field(local):
    with pytest.raises(SandboxUsageError, match=r"Job\.fn"):
        Job(fn=3)
    with pytest.raises(SandboxUsageError, match=r"Job\.timeout_s"):
        Job(lambda sb: 1, timeout_s=-1)
    with pytest.raises(SandboxUsageError, match=r"RetryPolicy\.max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(SandboxUsageError, match=r"domain_caps\['x'\]"):
        Scheduler(local.pool, domain_caps={"x": 0})
    with pytest.raises(SandboxUsageError, match="status"):
        JobResult(key="k", status="great")
    other = Scheduler(local.pool, log_interval_s=None)
    other.close()
    with pytest.raises(SandboxClosed):
        other.submit(Job(lambda sb: 1, spec=SandboxSpec()))


def test_a_job_that_brings_its_own_sandbox_leases_nothing_and_is_not_retried(local):
    """``spec=None``: an episode's step on the sandbox it holds: ordered, timed, metered, never retried."""
    from sandbox import SandboxInfraError

    calls = collections.Counter()
    pool_before = local.pool.stats().get("pool/leased", 0.0)

    def own(sb):
        calls["own"] += 1
        assert sb is None
        return "done"

    def broken(sb):
        calls["broken"] += 1
        raise SandboxInfraError("its own sandbox died", cause="sandbox_lost")

    ok, failed, slow = local.run(
        [
            Job(own, spec=None, domain="d"),
            Job(broken, spec=None),
            Job(lambda sb: time.sleep(5), spec=None, timeout_s=0.2),
        ],
        timeout=60,
    )
    assert (ok.status, ok.value, ok.host) == ("ok", "done", None)
    assert (failed.status, failed.cause, failed.attempts, calls["broken"]) == ("anomaly", "sandbox_lost", 1, 1)
    assert slow.status == "timeout"
    assert local.pool.stats().get("pool/leased", 0.0) == pool_before
    assert local.metrics()["sandbox/done"] == 3
    with pytest.raises(SandboxUsageError, match=r"Job\.spec"):
        Job(own, spec="bwrap")
