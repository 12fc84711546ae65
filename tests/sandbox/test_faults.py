"""Fault injection: killed containers, missing images, saturation, cancelled batches, an interrupted host.

Each test checks the same three things: no job is lost or duplicated (one
result per key, no unexpected second run), infrastructure failures are
retried or end as anomalies while code failures are results, and nothing is
left behind — no container, cgroup, process or temp file.
"""

from __future__ import annotations

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandbox import Host, Job, RetryPolicy, Scheduler, WarmPool
from tests.sandbox.conftest import kill_underneath
from tests.sandbox.test_pool import REPO, SPEC, assert_nothing_left, fast_config, our_cgroups, our_containers, wait_for

RETRY = RetryPolicy(max_attempts=3, backoff_s=0.05, backoff_max_s=0.2)


def make(backend, capacity: int = 2):
    pool = WarmPool(Host(backend, capacity=capacity), config=fast_config())
    return pool, Scheduler(pool, retry=RETRY, log_interval_s=None)


def tracking(made: list):
    """Wraps a job function to record every sandbox it ran in (to check they are all destroyed)."""

    def wrap(fn):
        def run(sb):
            made.append(sb)
            return fn(sb)

        return run

    return wrap


def test_sandboxes_killed_mid_job_are_retried_once_each(backend):
    pool, sched = make(backend)
    started: queue.Queue = queue.Queue()
    runs = collections.Counter()
    made: list = []
    victims = {"k1", "k4"}

    def job(i):
        def fn(sb):
            runs[f"k{i}"] += 1
            if f"k{i}" in victims and runs[f"k{i}"] == 1:
                started.put(sb)
            return int(sb.exec(f"sleep 0.5; echo {i * 3}").stdout)

        return Job(tracking(made)(fn), spec=SPEC, key=f"k{i}")

    def killer():
        for _ in victims:
            sb = started.get(timeout=120)
            kill_underneath(sb)  # `docker kill` / SIGKILL of bwrap while its exec runs

    thread = threading.Thread(target=killer)
    thread.start()
    with pool, sched:
        results = sched.run([job(i) for i in range(6)], timeout=300)
    thread.join()
    assert [r.key for r in results] == [f"k{i}" for i in range(6)]
    assert [r.value for r in results] == [i * 3 for i in range(6)] and all(r.ok for r in results)
    assert {r.key: r.attempts for r in results if r.attempts > 1} == {"k1": 2, "k4": 2}
    assert all("sandbox_vanished" in r.infra_errors[0] for r in results if r.attempts > 1)
    assert runs == {f"k{i}": 2 if f"k{i}" in victims else 1 for i in range(6)}
    assert_nothing_left(pool, made)


def test_missing_image_ends_as_an_anomaly_beside_good_jobs(backend):
    pool, sched = make(backend)
    missing = SPEC.replace(image="agentrl-sandbox:no-such-version")
    with pool, sched:
        results = sched.run(
            [Job(lambda sb: sb.exec("echo fine").stdout, spec=SPEC, key="good")]
            + [Job(lambda sb: "never", spec=missing, key=f"bad{i}") for i in range(2)]
        )
    good, *bad = results
    assert good.ok and good.value == b"fine\n"
    for r in bad:
        assert r.status == "anomaly" and r.cause == "image_missing" and not r.is_sample
        assert r.attempts == RETRY.max_attempts and r.value is None
        assert "python -m sandbox.images build" in r.error


def test_saturated_pool_runs_each_job_exactly_once(backend):
    pool, sched = make(backend, capacity=3)
    runs = collections.Counter()
    active, peak, lock = [0], [0], threading.Lock()
    made: list = []

    def job(i):
        def fn(sb):
            with lock:
                runs[i] += 1
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            try:
                return sb.exec(f"sleep 0.05; echo {i}").stdout_text.strip()
            finally:
                with lock:
                    active[0] -= 1

        return Job(tracking(made)(fn), spec=SPEC, key=f"s{i}")

    with pool, sched:
        results = sched.run([job(i) for i in range(36)], timeout=300)
        m = sched.metrics()
    assert [r.value for r in results] == [str(i) for i in range(36)]
    assert set(runs.values()) == {1} and len(runs) == 36
    assert peak[0] == 3  # saturated, never beyond capacity
    assert m["sandbox/pool_created"] <= pool.hosts[0].max_sandboxes and m["sandbox/pool_reused"] >= 30
    assert_nothing_left(pool, made)


def test_cancelled_batch_leaves_nothing_running(backend):
    pool, sched = make(backend)
    made: list = []
    with pool, sched:
        batch = sched.submit_batch(
            Job(tracking(made)(lambda sb: sb.exec("sleep 120", timeout=300)), spec=SPEC) for _ in range(6)
        )
        wait_for(lambda: len(made) == 2, 60, "two jobs to be running")
        assert batch.cancel() == 6
        results = batch.results(timeout=60)
        assert [r.status for r in results] == ["cancelled"] * 6
        wait_for(lambda: all(sb.closed for sb in made), 30, "the running jobs' sandboxes to be destroyed")
        # A worker counts its job finished just after the job's sandbox is closed.
        wait_for(lambda: sched.metrics()["sandbox/running"] == 0, 10, "the scheduler to count no job running")
    assert len(made) == 2  # the four queued ones never started
    assert_nothing_left(pool, made)


def test_cancelling_a_batch_never_starts_its_queued_jobs_in_freed_slots(backend):
    """The flake's mechanism made certain: each abort returns only once the aborted job has freed its slot.

    Cancelled one handle at a time, the dispatcher then had a free slot and a queued job of the same
    batch not yet cancelled, and started it in a new sandbox. Control: a job submitted after the
    cancel does start in the slots the cancel freed, so the probe sees a start when there is one.
    """
    pool, sched = make(backend)
    made: list = []
    abort = pool.abort

    def slow_abort(sb):  # returns once the scheduler has had every chance to refill the slot
        abort(sb)
        wait_for(lambda: sched.metrics()["sandbox/running"] < 2 or len(made) > 2, 10, "a freed slot")
        time.sleep(0.5)

    pool.abort = slow_abort
    with pool, sched:
        batch = sched.submit_batch(
            Job(tracking(made)(lambda sb: sb.exec("sleep 120", timeout=300)), spec=SPEC) for _ in range(6)
        )
        wait_for(lambda: len(made) == 2, 60, "two jobs to be running")
        assert batch.cancel() == 6
        assert [r.status for r in batch.results(timeout=60)] == ["cancelled"] * 6
        assert len(made) == 2, "a queued job of the cancelled batch started"
        later = sched.submit(Job(tracking(made)(lambda sb: sb.exec("echo ok").stdout), spec=SPEC))
        assert later.result(timeout=60).value == b"ok\n" and len(made) == 3  # control


_INTERRUPTED = """
import json, sys
sys.path.insert(0, {repo!r})
from sandbox import Host, Job, SandboxSpec, Scheduler, WarmPool, get_backend

journal = open({journal!r}, "a", buffering=1)
spec = SandboxSpec(memory_mb=384, workspace_mb=64, tmp_mb=32)

def job(i):
    def fn(sb):
        pid = sb._proc.pid if sb.backend == "bwrap" else 0
        journal.write(f"start j{{i}} {{sb.id}} {{pid}}\\n")
        return int(sb.exec(f"sleep 0.3; echo {{i}}").stdout)
    return Job(fn, spec=spec, key=f"j{{i}}")

sched = Scheduler(WarmPool(Host(get_backend({backend!r}), capacity=2)), log_interval_s=None)
batch = sched.submit_batch(job(i) for i in range(40))
try:
    for n, _ in enumerate(batch.as_completed(), 1):
        if n == 3:
            print("READY", flush=True)
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
print(json.dumps({{h.key: [h.result(30).status, h.result().value] for h in batch.handles}}), flush=True)
"""


def test_sigint_mid_batch_cancels_cleanly_and_leaves_nothing(backend, tmp_path):
    journal, tmpdir = tmp_path / "journal", tmp_path / "tmp"
    tmpdir.mkdir()
    script = _INTERRUPTED.format(repo=str(REPO), journal=str(journal), backend=backend.name)
    env = dict(os.environ, TMPDIR=str(tmpdir))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "READY"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out.startswith("INTERRUPTED"), out
    results = json.loads(out.splitlines()[-1])
    assert sorted(results) == sorted(f"j{i}" for i in range(40))  # none lost
    statuses = collections.Counter(status for status, _ in results.values())
    assert set(statuses) <= {"ok", "cancelled"} and statuses["ok"] >= 3 and statuses["cancelled"] >= 1
    assert all(value == int(key[1:]) for key, (status, value) in results.items() if status == "ok")
    starts = [line.split() for line in journal.read_text().splitlines()]
    assert len({s[1] for s in starts}) == len(starts)  # no job started twice
    owner = f"{os.uname().nodename}:{proc.pid}"
    if backend.name == "docker":
        wait_for(lambda: not our_containers(backend.address, owner), 30, "the interrupted run's containers to go")
    else:
        assert not our_cgroups(proc.pid)
        for _, _, _, pid in starts:
            try:
                os.kill(int(pid), 0)
                state = Path(f"/proc/{pid}/stat").read_text().split()[2]
                assert state == "Z", f"bwrap {pid} outlived the interrupted run"
            except ProcessLookupError:
                pass
    assert not list(tmpdir.iterdir())  # no temp file or dir left behind


@pytest.mark.parametrize("code", ["exit 7", "kill -9 $$"])
def test_code_that_dies_is_a_result_not_an_infra_retry(backend, code):
    pool, sched = make(backend)
    with pool, sched:
        result = sched.run([Job(lambda sb: sb.exec(code), spec=SPEC)])[0]
    assert result.ok and result.attempts == 1 and result.value.exit_code in (7, 137)
