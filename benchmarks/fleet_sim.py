"""The scheduler and the Ray fleet at 1, 2, 4 and 8 nodes, with sandboxes stubbed: throughput and utilisation.

A local Ray cluster grows from one node to ``--nodes``; one :class:`~sandbox.fleet.ray_fleet.RayFleet`
picks each new node up as it joins. Its agents run a warm pool of *stub* sandboxes: a command
``sleep X`` just sleeps X seconds in the agent (no process is started), so what is measured is the
machinery — scheduler, fleet placement, Ray round trips, agents — not the sandboxes. At each size,
``--episodes`` episodes are submitted at once (1,000+ in flight: queued or running), each
holding one sandbox for ``--steps`` tool calls whose latencies are drawn from a log-normal
distribution (median ``--median-ms``).

Reported per size: episodes/s, tool calls/s, sandbox utilisation (leased slot-seconds over
slot-seconds of the nodes in rotation: goal >= 90%) over the whole batch and while work is still
queued (the steady state of a run that keeps the queue full; the batch figure adds the drain at
its end, when the last episodes run and slots empty), and efficiency (throughput over the ideal of
every slot always running a call back to back). ``driver ms/call`` is the CPU time the driver
process — scheduler, fleet placement, Ray client — spends per tool call: its ceiling in calls/s on
one core, whatever the nodes (here every node's raylet and agent share the same 2 cores).

    python benchmarks/fleet_sim.py [--nodes 8] [--capacity 8] [--episodes 1200] [--steps 4] [--median-ms 25]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.machine import describe_machine  # noqa: E402
from sandbox import Job, PoolConfig, SandboxSpec, Scheduler  # noqa: E402
from sandbox.backends.base import Backend  # noqa: E402
from sandbox.spec import ExecResult  # noqa: E402

NODE = {"num_cpus": 1, "object_store_memory": 80 << 20}
CLEAN = {"entries": [], "truncated": False, "ipc": [], "processes": 0}


class StubSandbox:
    """A sandbox that runs nothing: ``exec("sleep X")`` sleeps X seconds. The pool's reset and probe pass."""

    backend = "stub"

    def __init__(self, spec: SandboxSpec):
        self.spec, self.id = spec, f"stub-{uuid.uuid4().hex[:12]}"
        self.confinement: dict = {}
        self.healthy, self.closed = True, False

    def exec(self, cmd: str, **_: object) -> ExecResult:
        seconds = float(cmd.split()[1]) if cmd.startswith("sleep ") else 0.0
        time.sleep(seconds)
        return ExecResult(exit_code=0, stdout=b"", stderr=b"", duration_s=seconds)

    def snapshot(self) -> object:
        return None

    def restore(self, snapshot: object) -> None:
        pass

    def probe(self) -> dict:
        return CLEAN

    def abort(self) -> None:
        pass

    def close(self) -> None:
        self.closed, self.healthy = True, False


class StubBackend(Backend):
    """Makes :class:`StubSandbox` es; pickled to each node's agent."""

    name = "stub"

    def create(self, spec: SandboxSpec) -> StubSandbox:
        return StubSandbox(spec)

    def check(self, spec: SandboxSpec | None = None) -> None:
        pass

    def gc(self, *, all_owners: bool = False) -> int:
        return 0


def episode(latencies: list[float]):
    def fn(sb) -> int:
        for seconds in latencies:
            sb.exec(f"sleep {seconds:.4f}")
        return len(latencies)

    return fn


def measure(fleet, args, rng: random.Random) -> dict[str, float]:
    sigma = 0.5
    plans = [
        [rng.lognormvariate(math.log(args.median_ms / 1e3), sigma) for _ in range(args.steps)]
        for _ in range(args.episodes)
    ]
    work_s = sum(map(sum, plans))
    with Scheduler(fleet, log_interval_s=None) as sched:
        sched.reset_metrics()
        done = threading.Event()
        busy: list[float] = []  # leased / capacity, sampled while jobs are queued

        def sample() -> None:
            while not done.wait(0.25):
                m = sched.metrics()
                if m["sandbox/queued"] > 0 and m["sandbox/capacity"] > 0:
                    busy.append(m["sandbox/pool_leased"] / m["sandbox/capacity"])

        sampler = threading.Thread(target=sample, daemon=True)
        cpu0 = time.process_time()
        start = time.perf_counter()
        sampler.start()
        results = sched.run([Job(episode(p), spec=SandboxSpec()) for p in plans])
        wall = time.perf_counter() - start
        driver_cpu = time.process_time() - cpu0
        done.set()
        sampler.join()
        metrics = sched.metrics()
    assert all(r.ok for r in results), {r.status for r in results}
    capacity = fleet.capacity()
    return {
        "nodes": len(fleet.nodes),
        "capacity": capacity,
        "episodes_s": args.episodes / wall,
        "calls_s": args.episodes * args.steps / wall,
        "utilisation": metrics["sandbox/utilisation"],
        "queued_utilisation": statistics.mean(busy) if busy else float("nan"),
        "efficiency": work_s / (wall * capacity),
        "wall_s": wall,
        "driver_ms_per_call": 1e3 * driver_cpu / (args.episodes * args.steps),
        "queue_p50_s": metrics.get("sandbox/queue_wait_p50_s", 0.0),
        "run_p50_s": metrics.get("sandbox/run_p50_s", 0.0),
        "ideal_run_s": statistics.median(map(sum, plans)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8, help="largest cluster (sizes 1, 2, 4, ... up to it)")
    parser.add_argument("--capacity", type=int, default=8, help="stub sandboxes leased at once per node")
    parser.add_argument("--episodes", type=int, default=1200, help="episodes submitted at once per size")
    parser.add_argument("--steps", type=int, default=4, help="tool calls per episode")
    parser.add_argument("--median-ms", type=float, default=25.0, help="median tool-call latency")
    args = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from sandbox.fleet import RayFleet

    print(describe_machine())
    print(
        f"{args.episodes} episodes at once x {args.steps} calls (log-normal, median {args.median_ms:g} ms), "
        f"{args.capacity} sandboxes per node"
    )
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    ray.init(address=cluster.address, log_to_driver=False)
    config = PoolConfig(handle_signals=False, probe=False, maintenance_interval_s=0.2)
    fleet = RayFleet(StubBackend(), capacity=args.capacity, max_sandboxes=args.capacity, config=config)
    rng = random.Random(0)
    header = (
        "nodes  slots  episodes/s  calls/s  utilisation (while queued)  efficiency  driver ms/call  run p50 (ideal)"
    )
    print(header)
    try:
        sizes = [n for n in (1, 2, 4, 8, 16, 32) if n <= args.nodes]
        for size in sizes:
            while len(cluster.list_all_nodes()) < size:
                cluster.add_node(**NODE)
            deadline = time.monotonic() + 120
            while len(fleet.nodes) < size and time.monotonic() < deadline:
                time.sleep(0.2)
            fleet.prewarm(SandboxSpec(), args.capacity)
            m = measure(fleet, args, rng)
            print(
                f"{m['nodes']:5d}  {m['capacity']:5d}  {m['episodes_s']:10.1f}  {m['calls_s']:7.1f}  "
                f"{m['utilisation']:10.1%} ({m['queued_utilisation']:5.1%})  {m['efficiency']:10.1%}  {m['driver_ms_per_call']:14.2f}  "
                f"{m['run_p50_s']:.3f}s ({m['ideal_run_s']:.3f}s)",
                flush=True,
            )
    finally:
        fleet.close()
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
