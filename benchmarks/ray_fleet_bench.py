"""What a command costs through the Ray fleet, against the same command in a local warm pool, in one run.

A local Ray cluster (a head and ``--nodes - 1`` workers, CPU only) gets a
:class:`~sandbox.fleet.ray_fleet.RayFleet` of bwrap sandboxes; beside it, a local
:class:`~sandbox.pool.warm_pool.WarmPool`. Both run the same short command (``true``: the
per-exec cost is all overhead) on a leased sandbox:

- sequentially, one sandbox (an episode's tool calls): median latency, and the ratio fleet / local;
- from ``--threads`` episodes at once, each on its own sandbox: throughput, with the fleet's
  per-node call batching on and off (concurrent calls to one node in one round trip).

    python benchmarks/ray_fleet_bench.py [--nodes 2] [--execs 200] [--threads 8]

On a real cluster the network adds its round trip; this measures what Ray and the agent add.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.machine import describe_machine  # noqa: E402
from sandbox import PoolConfig, SandboxSpec, WarmPool  # noqa: E402

SPEC = SandboxSpec(timeout_s=30)
NODE = {"num_cpus": 1, "object_store_memory": 80 << 20}


def sequential(sandbox, n: int) -> float:
    """Median seconds of one ``exec("true")``."""
    for _ in range(5):
        sandbox.exec("true")
    times = []
    for _ in range(n):
        t = time.perf_counter()
        sandbox.exec("true")
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def concurrent(sandboxes, n: int) -> float:
    """Execs per second with one thread per sandbox, ``n`` each."""
    barrier = threading.Barrier(len(sandboxes) + 1)

    def run(sb):
        barrier.wait()
        for _ in range(n):
            sb.exec("true")

    threads = [threading.Thread(target=run, args=(sb,)) for sb in sandboxes]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return len(sandboxes) * n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2, help="Ray nodes (head included)")
    parser.add_argument("--execs", type=int, default=200, help="sequential execs per measurement")
    parser.add_argument("--threads", type=int, default=8, help="concurrent episodes")
    args = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from sandbox.fleet import RayFleet

    print(describe_machine())
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    for _ in range(args.nodes - 1):
        cluster.add_node(**NODE)
    ray.init(address=cluster.address, log_to_driver=False)
    capacity = args.threads
    fleet = RayFleet("bwrap", capacity=capacity, config=PoolConfig(handle_signals=False))
    pool = WarmPool("bwrap", capacity=capacity, config=PoolConfig(handle_signals=False))
    try:
        local_sb, remote_sb = pool.acquire(SPEC), fleet.acquire(SPEC)
        local_s, remote_s = sequential(local_sb, args.execs), sequential(remote_sb, args.execs)
        pool.release(local_sb)
        fleet.release(remote_sb)
        print(f"sequential exec('true'), median of {args.execs}:")
        print(f"  local WarmPool   {local_s * 1e3:7.2f} ms")
        print(
            f"  Ray fleet        {remote_s * 1e3:7.2f} ms   overhead {(remote_s - local_s) * 1e3:+.2f} ms/exec, "
            f"ratio {remote_s / local_s:.2f}x"
        )

        n = max(10, args.execs // args.threads)
        local = [pool.acquire(SPEC) for _ in range(args.threads)]
        local_rate = concurrent(local, n)
        for sb in local:
            pool.release(sb)
        remote = [fleet.acquire(SPEC) for _ in range(args.threads)]
        rates = {}
        for batch in (False, True):
            for node in fleet.nodes.values():
                node.calls.batch = batch
            before = {name: (node.calls.calls, node.calls.submissions) for name, node in fleet.nodes.items()}
            rates[batch] = concurrent(remote, n)
            calls = sum(node.calls.calls - before[name][0] for name, node in fleet.nodes.items())
            trips = sum(node.calls.submissions - before[name][1] for name, node in fleet.nodes.items())
            rates[batch] = (rates[batch], calls / max(trips, 1))
        for sb in remote:
            fleet.release(sb)
        nodes = len({sb.node.name for sb in remote})
        print(f"{args.threads} episodes at once, {n} execs each ({nodes} nodes):")
        print(f"  local WarmPool            {local_rate:7.1f} execs/s")
        for batch, label in ((False, "Ray fleet, one call/trip"), (True, "Ray fleet, batched     ")):
            rate, per_trip = rates[batch]
            print(f"  {label}   {rate:7.1f} execs/s   ratio {local_rate / rate:.2f}x   {per_trip:.2f} calls/round trip")
    finally:
        pool.close()
        fleet.close()
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
