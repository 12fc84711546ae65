"""The fleet's engine: its nodes joining and leaving, Ray failures attributed, demand hints sent.

Split from :mod:`sandbox.fleet.ray_fleet` (the public, pool-shaped API) so each reads on its own,
as the scheduler is split from its core. The state here — nodes in rotation, the nodes that left,
leases — is guarded by ``lock``; the :class:`~sandbox.fleet.membership.NodeWatcher` reports joins
and losses, and a call or lease that Ray could not complete reports its node through
:meth:`FleetCore._node_failed`, whichever comes first.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sandbox.errors import HostUnavailable, SandboxInfraError
from sandbox.fleet.membership import NodeWatcher
from sandbox.fleet.nodes import FleetNode, demand_changes
from sandbox.fleet.ray_api import attribute, connect, import_ray, ray_failure_types
from sandbox.fleet.remote import RemoteSandbox
from sandbox.pool.config import PoolConfig
from sandbox.pool.metrics import Counters, Reservoir, UtilisationMeter
from sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)

COUNTERS = ("leases", "nodes_joined", "nodes_lost", "leases_lost", "failed_acquires")
HINT_INTERVAL_S = 0.1  # demand hints to the agents are coalesced over this long


class FleetCore:
    """State and node mechanics of :class:`~sandbox.fleet.ray_fleet.RayFleet` (which adds the pool's API)."""

    def __init__(
        self,
        backend: Any,
        address: str,
        hosts: tuple[str, ...],
        resource: str | None,
        *,
        capacity: int | None,
        max_sandboxes: int | None,
        config: PoolConfig | None,
        batch_calls: bool,
        poll_s: float,
        no_host_timeout_s: float,
    ):
        self.backend, self.address, self.resource, self.hosts = backend, address, resource, hosts
        self._capacity, self._max, self._batch_calls = capacity, max_sandboxes, batch_calls
        self.config = dataclasses.replace(config or PoolConfig(), handle_signals=False)
        self.no_host_timeout_s = no_host_timeout_s
        self._ray = import_ray()
        self._owns_ray = connect(address)
        self.ray_failures = ray_failure_types()
        self.lock = threading.Lock()
        self._cond = threading.Condition(self.lock)
        self.nodes: dict[str, FleetNode] = {}  # node id -> the node in rotation (or just lost)
        self.departed: list[FleetNode] = []  # nodes lost, kept for their counters
        self._leases: dict[str, RemoteSandbox] = {}
        self._demand: dict[tuple, tuple[SandboxSpec, int]] = {}
        self._closed = False
        self.meter = UtilisationMeter()  # held: lease slots of nodes in rotation; busy: leases
        self.counters = Counters(COUNTERS)
        self.acquire_wait = Reservoir()
        self._drainers = ThreadPoolExecutor(max_workers=64, thread_name_prefix="agentrl-fleet-drain")
        self._watcher = NodeWatcher(
            self._agent_args, self._join, self._lost_node, resource=resource, poll_s=poll_s,
            max_concurrency=lambda node: 4 * self._node_capacity(node) + 16,
        )  # fmt: skip
        self._hints = threading.Thread(target=self._hint_loop, name="agentrl-fleet-hints", daemon=True)

    def _per_host(self, node: dict[str, Any]) -> tuple[int, int]:
        """(capacity, max_sandboxes) of each host of ``node``: as given, else from the node's Ray CPUs."""
        capacity = self._capacity or max(1, int(node.get("Resources", {}).get("CPU", 1)))
        return capacity, max(self._max or 2 * capacity, capacity)

    def _node_capacity(self, node: dict[str, Any]) -> int:
        return self._per_host(node)[0] * max(1, len(self.hosts))

    def _agent_args(self, node: dict[str, Any]) -> tuple:
        return (self.backend, *self._per_host(node), self.config, self.hosts)

    def _join(self, node: dict[str, Any], actor: Any, info: dict[str, Any]) -> None:
        capacity = self._node_capacity(node)
        joined = FleetNode(
            node["NodeID"], node.get("NodeManagerAddress", "?"), actor, capacity=capacity,
            max_sandboxes=self._per_host(node)[1] * max(1, len(self.hosts)), batch_calls=self._batch_calls,
            drainers=self._drainers,
        )  # fmt: skip
        joined.info = info
        with self._cond:
            if self._closed:
                self._ray.kill(actor)
                return
            self.nodes[joined.node_id] = joined
            self.counters.add("nodes_joined")
            self._cond.notify_all()
        self.meter.change(held=capacity)
        log.info("fleet: %s (%s) serves %d sandboxes at once", joined.name, joined.address, capacity)

    def _lost_node(self, node_id: str, reason: str) -> None:
        node = self.nodes.get(node_id)
        if node is not None:
            self._lose(node, SandboxInfraError(f"{node.name}: {reason}", backend="ray", cause="node_lost"))

    def _node_failed(self, node: FleetNode, exc: BaseException) -> SandboxInfraError:
        """Attributes a Ray failure on ``node``; a node or agent that is gone leaves the rotation."""
        alive = None
        if not isinstance(exc, TimeoutError):  # a timeout says nothing of the node: don't ask
            try:
                alive = any(n["NodeID"] == node.node_id and n["Alive"] for n in self._ray.nodes())
            except Exception:  # noqa: BLE001 - the control store is busy: Ray's own message decides
                alive = None
        error = attribute(exc, node.name, alive)
        if error.cause in ("node_lost", "actor_lost"):
            self._lose(node, error)
        return error

    def _lose(self, node: FleetNode, error: SandboxInfraError) -> None:
        """Takes ``node`` out of rotation: its leases fail their next call with ``error``'s cause."""
        with self._cond:
            if not node.healthy or self.nodes.get(node.node_id) is not node:
                return
            node.healthy, node.down_reason = False, str(error)
            stranded = [sb for sb in self._leases.values() if sb.node is node]
            for sandbox in stranded:
                sandbox.lost = error
            node.counters["lost"] += len(stranded)
            self.counters.add("nodes_lost")
            self.counters.add("leases_lost", len(stranded))
            del self.nodes[node.node_id]
            self.departed.append(node)
            self._cond.notify_all()
        self.meter.change(held=-node.capacity)
        log.warning("fleet: %s left the rotation (%s); %d leases lost with it", node.name, error, len(stranded))
        self._watcher.forget(node.node_id)
        try:
            self._ray.kill(node.actor)  # an agent that is unreachable but alive must not serve anyone
        except Exception:  # noqa: BLE001 - already gone with its node
            pass

    def _await_nodes(self, min_nodes: int | None, timeout: float) -> None:
        """Until ``min_nodes`` serve (None: every live node has an agent that answered or failed, and
        one serves); a node whose agent cannot start is reported, not waited for."""
        deadline = time.monotonic() + timeout
        while True:
            self._watcher.poll()
            with self.lock:
                serving = sum(n.healthy for n in self.nodes.values())
            settled = self._watcher.pending() == 0
            if serving >= (min_nodes or 1) and (min_nodes is not None or settled):
                return
            failed = "; ".join(f"{nid[:8]}: {why}" for nid, why in self._watcher.failures.items())
            if time.monotonic() >= deadline or (min_nodes is None and settled):
                raise HostUnavailable(
                    f"RayFleet: {serving} of {min_nodes or 1} nodes serving sandboxes after "
                    f"{time.monotonic() - deadline + timeout:.0f}s (resource={self.resource!r}); "
                    f"agents that failed: {failed or 'none'}",
                    backend="ray",
                )
            time.sleep(0.1)

    def _unreserve(self, node: FleetNode) -> None:
        with self._cond:
            node.leased -= 1
            node.counters["failed_acquires"] += 1
            self.counters.add("failed_acquires")
            self._cond.notify_all()

    def _release_orphan(self, node: FleetNode, done: Any) -> None:
        """A lease made after its caller stopped waiting: nobody holds it, so it goes back at once."""
        if done.exception() is None and done.result()[0]:
            try:
                node.actor.release.remote([(done.result()[1][0], True)])
            except Exception:  # noqa: BLE001 - the node went away with it
                pass

    def _note_idle(self, node: FleetNode, done: Any) -> None:
        if done.exception() is None:
            with self.lock:
                node.idle = done.result()

    def _hint_loop(self) -> None:
        """Sends the agents their share of the demand, coalesced: one message per node per change."""
        while not self._closed:
            time.sleep(HINT_INTERVAL_S)
            with self.lock:
                demand = list(self._demand.values())
                self._demand = {k: v for k, v in self._demand.items() if v[1] > 0}
                sends = demand_changes(demand, [n for n in self.nodes.values() if n.healthy])
            for node, changed in sends:
                try:
                    node.actor.want.remote(changed)
                except Exception:  # noqa: BLE001 - a node on its way out
                    pass
