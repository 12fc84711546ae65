"""The driver's view of one node of a Ray fleet: its agent, capacity, leases, warm sandboxes, health.

:class:`FleetNode` has the attributes :func:`sandbox.pool.hosts.place` reads of a
:class:`~sandbox.pool.hosts.Host` (``name``, ``capacity``, ``free``, ``idle``, ``total``,
``can_run``), so the fleet places a lease on a node exactly as the warm pool places one on a
Docker host: not where the job failed before, then where a sandbox of the spec is warm, then
the largest share of free capacity. Its mutable state is guarded by the fleet's lock.

A node's counters (leases, calls, leases lost with it) are what the fleet's metrics report per
node, so a run's metrics say which node did what.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sandbox.fleet.batching import CallBatcher
from sandbox.spec import SandboxSpec, spec_key

GAUGES = ("leased", "healthy")


class FleetNode:
    """One Ray node in the fleet's rotation, as the driver knows it.

    Args:
      node_id: Ray's id of the node (hex).
      address: the node's IP, for logs.
      actor: its :class:`~sandbox.fleet.agent.NodeAgent` (a Ray actor handle).
      capacity / max_sandboxes: leases at once, sandboxes at once on this node.
    """

    def __init__(
        self,
        node_id: str,
        address: str,
        actor: Any,
        *,
        capacity: int,
        max_sandboxes: int,
        batch_calls: bool,
        drainers: ThreadPoolExecutor,
    ):
        self.node_id, self.address, self.actor = node_id, address, actor
        self.name = f"ray-{node_id[:8]}"
        self.capacity, self.max_sandboxes = capacity, max_sandboxes
        self.calls = CallBatcher(actor, batch=batch_calls, drainers=drainers)
        self.info: dict[str, Any] = {}  # what the agent said of itself (pid, hostname)
        # -- state, guarded by the fleet's lock -------------------------------------------
        self.healthy = True
        self.down_reason = ""
        self.leased = 0  # leases out, or being made for a waiting acquire
        self.idle: dict[tuple, int] = {}  # spec key -> idle sandboxes there (the agent's last word)
        self.missing_images: dict[str, float] = {}  # image -> when to try this node again
        self.demand_sent: dict[tuple, int] = {}  # spec key -> the warm-ahead hint the agent last got
        self.counters = {"leases": 0, "lost": 0, "failed_acquires": 0}

    @property
    def free(self) -> int:
        return self.capacity - self.leased

    @property
    def total(self) -> int:
        return self.leased + sum(self.idle.values())

    def can_run(self, image: str, now: float) -> bool:
        """In rotation, and not known to lack ``image`` (until it is time to look again)."""
        return self.healthy and now >= self.missing_images.get(image, 0.0)

    def metrics(self) -> dict[str, float]:
        """Per-node keys: ``sandbox/node/<name>/leases`` etc."""
        prefix = f"sandbox/node/{self.name}"
        out = {f"{prefix}/{k}": float(v) for k, v in self.counters.items()}
        out.update(
            {
                f"{prefix}/calls": float(self.calls.calls),
                f"{prefix}/round_trips": float(self.calls.submissions),
                f"{prefix}/leased": float(self.leased),
                f"{prefix}/healthy": float(self.healthy),
            }
        )
        return out

    def __repr__(self) -> str:
        return f"FleetNode({self.name}, {self.address}, capacity={self.capacity}, healthy={self.healthy})"


def node_metrics(nodes: Sequence[FleetNode]) -> dict[str, float]:
    """Every node's keys; a node whose agent was replaced appears twice: its counters add up, and its
    gauges are the serving agent's. List departed nodes first."""
    out: dict[str, float] = {}
    for node in nodes:
        for key, value in node.metrics().items():
            if key.rsplit("/", 1)[-1] in GAUGES:
                out[key] = value if node.healthy else out.get(key, 0.0)
            else:
                out[key] = out.get(key, 0.0) + value
    return out


def demand_changes(
    demand: Sequence[tuple[SandboxSpec, int]], nodes: Sequence[FleetNode]
) -> list[tuple[FleetNode, list[tuple[SandboxSpec, int]]]]:
    """Each node's share of the demand per spec (by capacity), where it changed since last sent:
    ``[(node, [(spec, sandboxes to keep warm), ...]), ...]``. Records what is sent (fleet lock held)."""
    total = sum(n.capacity for n in nodes) or 1
    sends = []
    for node in nodes:
        changed = []
        for spec, n in demand:
            key, share = spec_key(spec), math.ceil(n * node.capacity / total)
            if node.demand_sent.get(key) != share:
                node.demand_sent[key] = share
                changed.append((spec, share))
        if changed:
            sends.append((node, changed))
    return sends
