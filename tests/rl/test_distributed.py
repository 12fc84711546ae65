"""The job's channel and its failure attribution, on an in-memory stand-in for the coordination service.

The real service is exercised by tests/rl/test_multiprocess.py (two processes); these pin the
protocol: chunked, compressed posts; collect only once every process posted; keys deleted once
every process read them; a peer's failure raised where a process waits; which process a
failure is blamed on; SIGTERM.
"""

from __future__ import annotations

import os
import signal

import pytest

from rl.run import distributed
from rl.run.distributed import PeerFailed, ProcessGroup
from rl.run.job_guard import EXIT_FAILED, EXIT_TERMINATED, JobGuard, Terminated


class FakeService:
    """The key-value store and liveness of a coordination service, shared by the processes' clients."""

    def __init__(self):
        self.store: dict[str, bytes | str] = {}
        self.live: set[int] = set()


class FakeClient:
    def __init__(self, service: FakeService, index: int):
        self.service, self.index = service, index
        service.live.add(index)

    def key_value_set(self, key, value):
        self.service.store[key] = value

    key_value_set_bytes = key_value_set

    def key_value_try_get(self, key):
        if key not in self.service.store:
            raise RuntimeError(f"NOT_FOUND: Config key {key} not found.")
        return self.service.store[key]

    def key_value_dir_get(self, prefix):
        return [(k, v) for k, v in self.service.store.items() if k.startswith(prefix)]

    key_value_dir_get_bytes = key_value_dir_get

    def key_value_delete(self, prefix):
        for key in [k for k in self.service.store if k.startswith(prefix)]:
            del self.service.store[key]

    def get_live_nodes(self, ids):
        return {i: 1 for i in ids if i in self.service.live}


def _job(count: int = 2) -> tuple[FakeService, list[ProcessGroup]]:
    service = FakeService()
    return service, [ProcessGroup(i, count, FakeClient(service, i)) for i in range(count)]


def test_collect_waits_for_every_process_then_returns_their_data_in_process_order(monkeypatch):
    monkeypatch.setattr(distributed, "_CHUNK", 1000)  # several chunks per post
    _, (p0, p1) = _job()
    big = os.urandom(5000)  # incompressible: 5+ chunks
    p1.post("t", big)
    assert p1.collect("t") is None and p0.collect("t") is None  # process 0 has not posted
    p0.post("t", b"small")
    assert p0.collect("t") == [b"small", big]
    assert p1.collect("t") == [b"small", big]


def test_keys_are_deleted_once_every_process_read_them():
    service, (p0, p1) = _job()
    for group in (p0, p1):
        group.post("t", b"x")
    p0.collect("t")
    assert any(k.startswith("agentrl/data/t/") for k in service.store)  # process 1 has not read yet
    p1.collect("t")
    p0.post("u", b"y")
    p1.post("u", b"y")
    p0.collect("u")  # the main process cleans up what everyone read
    assert not [k for k in service.store if "/t/" in k]


def test_a_peer_failure_is_raised_where_a_process_waits():
    _, (p0, p1) = _job()
    p1.report_failure("process 1: RuntimeError: boom")
    with pytest.raises(PeerFailed, match="process 1 of the job failed: process 1: RuntimeError: boom"):
        p0.gather("t", b"x", poll_s=0.001)
    assert p1.peer_failures() == {}  # a process is not its own peer


def test_one_process_needs_no_service():
    group = ProcessGroup()
    assert group.is_main and group.lost() == [] and group.peer_failures() == {}
    assert group.gather("t", b"x") == [b"x"]


def test_own_failure_is_reported_to_the_peers_with_the_process_named():
    _, (p0, p1) = _job()
    message, code = JobGuard(p1).failed(RuntimeError("boom"))
    assert (message, code) == ("process 1: RuntimeError: boom", EXIT_FAILED)
    assert p0.peer_failures() == {1: "process 1: RuntimeError: boom"}


def test_a_broken_collective_is_blamed_on_the_process_that_went_away():
    service, (p0, _) = _job()
    service.live.discard(1)  # killed: no report, only silence
    message, code = JobGuard(p0).failed(ValueError("UNKNOWN: Gloo AllGather failed: Connection closed by peer"))
    assert message.startswith("the job stopped: process 1: stopped answering") and code == EXIT_FAILED
    assert p0.peer_failures() == {}  # a peer's failure is not reported again as this process's


def test_a_peer_sigterm_stops_this_process_with_the_sigterm_status():
    _, (p0, p1) = _job()
    p1.report_failure("process 1 received SIGTERM")
    message, code = JobGuard(p0).failed(KeyboardInterrupt())
    assert message == "the job stopped: process 1 received SIGTERM" and code == EXIT_TERMINATED


def test_sigterm_raises_terminated_on_the_main_thread():
    previous = signal.getsignal(signal.SIGTERM)
    guard = JobGuard(ProcessGroup()).install()
    try:
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next bytecode
        assert guard.failed(Terminated()) == ("received SIGTERM", EXIT_TERMINATED)
    finally:
        guard.close()
        signal.signal(signal.SIGTERM, previous)


def test_a_peer_that_leaves_after_close_is_not_taken_for_a_lost_one(monkeypatch):
    """At a normal end each process closes its guard, meets the others at the barrier and leaves. A
    watchdog still inside a slow look at the peers when close() gives up waiting for it must not then
    see the peer that left and interrupt the main thread (it did once, in CI, under load)."""
    import threading

    from rl.run import job_guard

    service, (p0, _) = _job()
    inside, release = threading.Event(), threading.Event()

    def slow_live_nodes(ids):
        inside.set()
        release.wait(10)
        return {i: 1 for i in ids if i in service.live}

    p0._client.get_live_nodes = slow_live_nodes
    interrupts = []
    monkeypatch.setattr(job_guard._thread, "interrupt_main", lambda: interrupts.append(1))
    previous = signal.getsignal(signal.SIGTERM)
    guard = JobGuard(p0, poll_s=0.01).install()
    try:
        assert inside.wait(10)
        guard.close()  # gives up on the thread after 2 * poll_s + 1 s: it is still in the look
        service.live.discard(1)  # the peer ended its run and left the service
        release.set()
        guard._thread.join(10)
        assert not guard._thread.is_alive() and interrupts == [] and guard._cause is None
    finally:
        release.set()
        signal.signal(signal.SIGTERM, previous)


def test_a_forced_exit_prints_its_error_on_a_line_of_its_own(monkeypatch, capsys):
    """The main thread stuck in C++ (a checkpoint barrier whose peer is gone) while the progress bar
    holds the current line: the forced exit's ``error:`` line must still start a line (it was once
    glued to the bar's, and whoever reads the last ``error:`` line found none)."""
    import sys

    from rl.run import job_guard

    service, (p0, _) = _job()
    service.live.discard(1)  # the peer was killed: leave() does not wait for it
    exits = []
    monkeypatch.setattr(job_guard.os, "_exit", exits.append)
    guard = JobGuard(p0, grace_s=0.0)
    guard._set_cause("the job stopped: process 1: stopped answering", EXIT_FAILED, report=False)
    sys.stderr.write("\ragentrl:  57%|#####7    | 4/7 [00:54<00:12,  4.19s/step, phase=sft]")
    guard._force_exit()
    assert exits == [EXIT_FAILED]
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors and "process 1" in errors[-1] and "forced exit" in errors[-1]
