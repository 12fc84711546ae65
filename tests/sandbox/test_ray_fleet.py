"""The Ray fleet on a real local multi-node Ray cluster: a head and two worker nodes, CPU only.

One cluster for the module (starting Ray is the slow part), small and fast to notice a dead node
(health checks every 300 ms). Every node runs a sandbox agent with a bwrap pool (and, for one test,
a second fleet's agent with a pool on the node's Docker daemon). The tests run
batches through the :class:`Scheduler` on a :class:`RayFleet` and check where jobs ran, that each
ends exactly once with its own result, that a node killed mid-batch costs no job (its jobs re-run
elsewhere, its held episodes become ``node_lost`` anomalies, nothing is scored), that a node added
mid-batch takes work, and finally that nothing of Ray or of any sandbox is left.
"""

from __future__ import annotations

import collections
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from sandbox import Job, RetryPolicy, SandboxSpec, Scheduler
from sandbox.errors import BackendUnavailable, HostUnavailable, SandboxFileError, SandboxUsageError
from tests.sandbox.conftest import REQUIRED, backend_or_skip
from tests.sandbox.test_pool import fast_config, our_containers, wait_for

try:
    import ray
    from ray.cluster_utils import Cluster
except ImportError:  # CI installs it (the test extra): there a missing Ray is a failure, never a skip
    if REQUIRED:
        raise
    pytest.skip("ray is not installed (pip install 'agentrl[ray]')", allow_module_level=True)

from sandbox.fleet import RayFleet

pytestmark = pytest.mark.slow
SYSTEM = {"health_check_period_ms": 300, "health_check_failure_threshold": 3, "health_check_initial_delay_ms": 0}
NODE = {"num_cpus": 1, "object_store_memory": 80 << 20}
RETRY = RetryPolicy(max_attempts=3, backoff_s=0.05, backoff_max_s=0.5)
SPEC = SandboxSpec(timeout_s=30)


class Ray:
    """The module's cluster and the fleet on it; records every process that must be gone at the end."""

    def __init__(self):
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={**NODE, "include_dashboard": False, "_system_config": SYSTEM},
        )
        self.workers = [self.cluster.add_node(**NODE) for _ in range(2)]
        self.session = self.cluster.head_node.session_name
        self.fleet = None
        try:
            ray.init(address=self.cluster.address, log_to_driver=False)
            self.fleet = RayFleet("bwrap", capacity=2, config=fast_config(), poll_s=0.2)
        except BaseException:
            ray.shutdown()
            self.cluster.shutdown()
            raise
        self.pids: set[int] = set()  # agents and their sandboxes, as seen while they ran

    def node(self, name: str):
        """The cluster's node the fleet calls ``name``."""
        return next(n for n in self.cluster.list_all_nodes() if f"ray-{n.node_id[:8]}" == name)

    def note_processes(self) -> None:
        """Agents, their sandboxes, and every process of the cluster (raylets, GCS, workers under them)."""
        roots = [node.info["pid"] for node in self.fleet.nodes.values()]
        roots += [int(line.split()[0]) for line in _session_processes(self.session)]
        for pid in roots:
            self.pids |= {pid, *_descendants(pid)}

    def close(self) -> dict:
        if self.fleet is None:
            return {}
        self.note_processes()
        report, self.fleet = self.fleet.close(), None
        ray.shutdown()
        self.cluster.shutdown()
        return report


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    children = collections.defaultdict(set)
    for child, parent in zip(out[::2], out[1::2], strict=True):
        children[int(parent)].add(int(child))
    found, todo = set(), [pid]
    while todo:
        for child in children[todo.pop()]:
            found.add(child)
            todo.append(child)
    return found


@pytest.fixture(scope="module")
def cluster():
    backend_or_skip("bwrap")
    c = Ray()
    try:
        yield c
    finally:
        c.close()


def _exec_job(i: int, runs: collections.Counter, command: str = "") -> Job:
    def fn(sb):
        runs[i] += 1
        out = sb.exec(f"{command}echo $(({i} * 3))").stdout.decode().strip()
        return int(out), sb.node.name

    return Job(fn, spec=SPEC, key=f"job-{i}-{time.monotonic_ns()}", metadata={"i": i})


def test_a_batch_spreads_over_the_nodes_and_each_job_ends_once_with_its_result(cluster):
    fleet = cluster.fleet
    assert len(fleet.nodes) == 3 and fleet.capacity() == 6
    runs: collections.Counter = collections.Counter()
    with Scheduler(fleet, retry=RETRY, log_interval_s=None) as sched:
        results = sched.run([_exec_job(i, runs, "sleep 0.2; ") for i in range(30)])
        metrics = sched.metrics()
    assert [r.status for r in results] == ["ok"] * 30
    assert [r.value[0] for r in results] == [3 * i for i in range(30)]
    assert runs == {i: 1 for i in range(30)}  # each ran exactly once
    assert all(r.host == r.value[1] and r.attempts == 1 for r in results)  # the job's calls went to its node
    per_node = collections.Counter(r.host for r in results)
    assert set(per_node) == {n.name for n in fleet.nodes.values()}  # every node took work
    for name, n in per_node.items():  # and the metrics say which did what
        assert metrics[f"sandbox/node/{name}/leases"] >= n
    cluster.note_processes()


@pytest.mark.docker
def test_a_docker_fleet_runs_on_each_nodes_daemon_and_leaves_no_container(cluster):
    daemon = backend_or_skip("docker").address
    fleet = RayFleet("docker", capacity=1, config=fast_config(), poll_s=0.2)  # beside the bwrap fleet
    owners = [f"{n.info['hostname']}:{n.info['pid']}" for n in fleet.nodes.values()]  # each agent's label
    runs: collections.Counter = collections.Counter()
    try:
        with Scheduler(fleet, retry=RETRY, log_interval_s=None) as sched:
            results = sched.run([_exec_job(i, runs) for i in range(6)])
        assert [r.value[0] for r in results if r.ok] == [3 * i for i in range(6)]
        assert len({r.host for r in results}) >= 2 and runs == {i: 1 for i in range(6)}
        assert any(our_containers(daemon, owner) for owner in owners)  # warm, kept for the next job
    finally:
        fleet.close()
    wait_for(lambda: not any(our_containers(daemon, owner) for owner in owners), 30, "the containers to go")


def test_calls_of_one_lease_stay_on_its_node_and_errors_come_back_as_themselves(cluster):
    fleet = cluster.fleet
    sb = fleet.acquire(SPEC)
    try:
        sb.write_files({"a.txt": "hello"})
        assert sb.read_file("a.txt") == b"hello"
        assert sb.exec("cat a.txt; exit 3").exit_code == 3  # the code's doing: a result, not an error
        with pytest.raises(SandboxFileError):
            sb.read_file("missing.txt")
        assert fleet.host_of(sb) is sb.node and sb.describe()["node"] == sb.node.name
    finally:
        fleet.release(sb)
    assert sb.closed and fleet.stats()["sandbox/pool_leased"] == 0


def test_calls_to_one_node_share_a_round_trip_and_each_comes_back_when_done(cluster):
    fleet = cluster.fleet
    a = fleet.acquire(SPEC)
    b = fleet.acquire(SPEC, avoid=[n.name for n in fleet.nodes.values() if n is not a.node])
    try:
        assert b.node is a.node
        batcher, trips = a.node.calls, a.node.calls.submissions
        with batcher._lock:
            batcher._sending = True  # as if another thread were sending: the next calls wait for it
        slow = batcher.submit((a.id, "exec", ("sleep 2; echo slow",), {}))
        fast = batcher.submit((b.id, "exec", ("echo fast",), {}))
        batcher._pump()  # ... which then sends them together
        assert fast.result(timeout=30)[1].stdout == b"fast\n" and not slow.done()  # not held back by the slow one
        assert slow.result(timeout=30)[1].stdout == b"slow\n"
        assert batcher.submissions == trips + 1
    finally:
        fleet.release(a)
        fleet.release(b)


def test_a_node_added_mid_batch_takes_work(cluster):
    fleet = cluster.fleet
    runs: collections.Counter = collections.Counter()
    with Scheduler(fleet, retry=RETRY, log_interval_s=None) as sched:
        batch = sched.submit_batch([_exec_job(i, runs, "sleep 0.5; ") for i in range(400)])
        wait_for(lambda: sched.metrics()["sandbox/running"] >= fleet.capacity(), 30, "the fleet to be busy")
        added = cluster.cluster.add_node(**NODE)
        name = f"ray-{added.node_id[:8]}"
        wait_for(lambda: any(r.status == "ok" and r.host == name for r in _done(batch)), 60, f"a job on {name}")
        batch.cancel()
        results = batch.results(timeout=60)
    assert {r.status for r in results} <= {"ok", "cancelled"}
    assert all(r.value[0] == 3 * r.metadata["i"] for r in results if r.ok)
    assert max(runs.values()) == 1
    assert fleet.stats()[f"sandbox/node/{name}/leases"] >= 1
    cluster.note_processes()


def test_a_node_killed_mid_batch_costs_no_job_and_scores_nothing(cluster):
    fleet = cluster.fleet
    head = f"ray-{cluster.cluster.head_node.node_id[:8]}"
    runs: collections.Counter = collections.Counter()
    started: dict[str, set[int]] = collections.defaultdict(set)  # node -> jobs that started a command there
    lock = threading.Lock()

    def job(i: int) -> Job:
        def fn(sb):
            runs[i] += 1
            with lock:
                started[sb.node.name].add(i)
            out = sb.exec(f"sleep 3; echo $(({i} * 3))").stdout.decode().strip()
            return int(out)  # the "reward" of this job: given only for a command that completed

        return Job(fn, spec=SPEC, metadata={"i": i})

    # An episode holding its sandbox for many steps (as a stateful environment does) on the victim.
    victim = next(n for n in fleet.nodes.values() if n.name != head)
    held = None
    while held is None or held.node is not victim:  # leases go to the freest node: take until one lands there
        spare = held
        held = fleet.acquire(SPEC, avoid=[n.name for n in fleet.nodes.values() if n is not victim])
        if spare is not None:
            fleet.release(spare)
    cluster.note_processes()
    with Scheduler(fleet, retry=RETRY, log_interval_s=None) as sched:
        batch = sched.submit_batch([job(i) for i in range(10)])
        wait_for(lambda: len(started[victim.name]) >= 1, 60, f"a job running on {victim.name}")
        step = sched.submit(Job(lambda _: held.exec("sleep 5; echo 1").stdout, spec=None))
        time.sleep(0.5)  # the step's command is running too
        cluster.cluster.remove_node(cluster.node(victim.name), allow_graceful=False)
        results = batch.results(timeout=120)
        step_result = step.result(timeout=60)
        metrics = sched.metrics()
    fleet.release(held)
    # Every job of the batch ended once, ok, with its own result, none on the dead node.
    assert [r.status for r in results] == ["ok"] * 10
    assert [r.value for r in results] == [3 * i for i in range(10)]
    lost = [r for r in results if r.infra_errors]
    assert started[victim.name] and started[victim.name] <= {r.metadata["i"] for r in lost}
    for r in lost:  # re-run elsewhere after an infrastructure failure attributed to the node
        assert r.attempts == 2 and r.host != victim.name
        assert r.infra_errors[0].startswith("node_lost:"), r.infra_errors
    # The held episode's step: an anomaly caused by the node's loss. No sample, so no reward.
    assert step_result.status == "anomaly" and step_result.cause == "node_lost"
    assert not step_result.is_sample and step_result.value is None
    assert metrics["sandbox/anomaly/node_lost"] == 1
    assert metrics["sandbox/fleet_nodes_lost"] == 1 and metrics["sandbox/retried"] == len(lost)
    assert metrics[f"sandbox/node/{victim.name}/lost"] >= 1 + len(started[victim.name])
    assert victim.name not in {n.name for n in fleet.nodes.values()}
    # The survivors keep serving.
    sb = fleet.acquire(SPEC)
    assert sb.exec("echo ok").stdout == b"ok\n" and sb.node is not victim
    fleet.release(sb)


def test_without_ray_the_error_names_the_extra(monkeypatch):
    from sandbox.fleet import ray_api

    monkeypatch.setitem(sys.modules, "ray", None)  # as if it were not installed
    with pytest.raises(BackendUnavailable, match=r"pip install 'agentrl\[ray\]'"):
        RayFleet("bwrap")
    with pytest.raises(SandboxUsageError, match="address: expected"):
        ray_api.connect("")
    with pytest.raises(SandboxUsageError, match=r"RayFleet\.backend: expected one of"):
        RayFleet("podman")


def test_a_fleet_whose_agents_cannot_start_says_why(cluster):
    with pytest.raises(HostUnavailable, match=r"agents that failed: .*host: expected 'bwrap', 'docker' or a daemon"):
        RayFleet("bwrap", hosts=("nonsense",), capacity=1, poll_s=0.2)


def test_nothing_is_left_after_close(cluster):
    cluster.note_processes()
    assert cluster.pids
    report = cluster.close()
    assert report and all(r["live"] == 0 for r in report.values()), report  # every agent destroyed its sandboxes
    assert not ray.is_initialized()
    wait_for(lambda: not [p for p in cluster.pids if _alive(p)], 30, "agents and sandboxes to exit")
    wait_for(lambda: not _session_processes(cluster.session), 30, "the cluster's processes to exit")


def _done(batch) -> list:
    return [h.result() for h in batch.handles if h.done()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def _session_processes(session: str) -> list[str]:
    """Processes of this cluster (raylets, GCS, workers name its session on their command line)."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if session in line and str(os.getpid()) != line.split()[0]]


def test_an_address_where_no_cluster_listens_is_named_at_once():
    assert not ray.is_initialized()  # after the module's cluster is gone (the test above)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    with pytest.raises(BackendUnavailable, match=rf"address='127\.0\.0\.1:{port}': no Ray cluster answers there"):
        RayFleet("bwrap", address=f"127.0.0.1:{port}")
    assert not ray.is_initialized()
