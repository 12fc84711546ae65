"""Which Ray nodes serve sandboxes: one agent started per live node, and a node's departure noticed.

Ray's control store (GCS) knows which nodes are alive; it declares a node dead once its health
checks fail (``health_check_period_ms`` x ``health_check_failure_threshold``). :class:`NodeWatcher`
polls that list: a node that joins gets a :class:`~sandbox.fleet.agent.NodeAgent` pinned to it
(node affinity, not soft: it never runs elsewhere) and enters the fleet's rotation as soon as the
agent answers — it gets work at once, being the freest node. A node the store calls dead leaves
the rotation with cause ``node_lost``; a call that fails first (Ray reports the actor's death
within milliseconds) gets there sooner through the fleet's own attribution. An agent that died on a
live node (``actor_lost``) is replaced on the next poll, with backoff if it keeps failing to start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sandbox.fleet.agent import NodeAgent
from sandbox.fleet.ray_api import import_ray

log = logging.getLogger(__name__)

START_BACKOFF_S = (1.0, 60.0)  # first and largest wait before starting an agent again on a node where it failed


class NodeWatcher:
    """Polls the cluster's nodes; starts agents on new ones and reports joins and losses.

    Args:
      agent_args: ``NodeAgent(*agent_args(node))`` for a node dict of ``ray.nodes()``.
      on_join: called with ``(node dict, actor, agent info)`` once a new agent answers.
      on_lost: called with ``(node id, reason)`` when a node with an agent leaves the cluster.
      resource: only nodes advertising this custom resource serve sandboxes (None: every node).
      max_concurrency: threads of each agent (leases, calls and resets run at once).
    """

    def __init__(
        self,
        agent_args: Callable[[dict[str, Any]], tuple],
        on_join: Callable[[dict[str, Any], Any, dict[str, Any]], None],
        on_lost: Callable[[str, str], None],
        *,
        resource: str | None,
        max_concurrency: Callable[[dict[str, Any]], int],
        poll_s: float,
    ):
        self._ray = import_ray()
        self._agent_args, self._on_join, self._on_lost = agent_args, on_join, on_lost
        self.resource, self.poll_s, self._max_concurrency = resource, poll_s, max_concurrency
        self._actor_class = self._ray.remote(NodeAgent)
        self._lock = threading.Lock()
        self._joined: set[str] = set()
        self._starting: dict[str, tuple[dict[str, Any], Any, Any]] = {}  # node id -> (node, actor, info ref)
        self._retry_at: dict[str, tuple[float, float]] = {}  # node id -> (not before, backoff)
        self.failures: dict[str, str] = {}  # node id -> why its agent did not start (until one does)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="agentrl-fleet-nodes", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def pending(self) -> int:
        """Live nodes whose agent has neither answered nor failed to start yet."""
        alive = self._alive()
        with self._lock:
            return sum(1 for nid in alive if nid not in self._joined and nid not in self.failures)

    def poll(self) -> None:
        """One pass: losses, new nodes, agents that answered (or failed to start)."""
        alive = self._alive()
        with self._lock:
            lost = [nid for nid in self._joined if nid not in alive]
            self._joined.difference_update(lost)
            stillborn = [self._starting.pop(nid)[1] for nid in list(self._starting) if nid not in alive]
            new = [node for nid, node in alive.items() if nid not in self._joined and nid not in self._starting]
        for actor in stillborn:
            self._kill(actor)
        for nid in lost:
            self._on_lost(nid, "the cluster declared the node dead")
        now = time.monotonic()
        for node in new:
            if now >= self._retry_at.get(node["NodeID"], (0.0, 0.0))[0]:
                self._start(node)
        self._collect()

    def forget(self, node_id: str) -> None:
        """The fleet dropped this node's agent (it died): a live node gets a new one on a later poll."""
        with self._lock:
            self._joined.discard(node_id)
            self._back_off(node_id)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * self.poll_s + 5)
        with self._lock:
            starting, self._starting = list(self._starting.values()), {}
        for _, actor, _ in starting:
            self._kill(actor)

    # -- internals ------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - a failed poll (GCS busy) is retried on the next tick
                log.exception("fleet: polling the Ray cluster's nodes failed")

    def _alive(self) -> dict[str, dict[str, Any]]:
        nodes = self._ray.nodes()
        return {
            n["NodeID"]: n
            for n in nodes
            if n.get("Alive") and (self.resource is None or self.resource in n.get("Resources", {}))
        }

    def _start(self, node: dict[str, Any]) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nid = node["NodeID"]
        actor = self._actor_class.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False),
            num_cpus=0,  # sandboxes use the node's cores outside Ray's accounting; the agent reserves none
            max_concurrency=self._max_concurrency(node),
            max_restarts=0,  # a dead agent's sandboxes died with it: the fleet starts a fresh one
        ).remote(*self._agent_args(node))
        with self._lock:
            self._starting[nid] = (node, actor, actor.info.remote())

    def _collect(self) -> None:
        with self._lock:
            refs = {info: nid for nid, (_, _, info) in self._starting.items()}
        if not refs:
            return
        ready, _ = self._ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in ready:
            nid = refs[ref]
            with self._lock:
                node, actor, _ = self._starting.pop(nid, (None, None, None))
            if node is None:
                continue
            try:
                info = self._ray.get(ref)
                if info.get("error"):
                    raise RuntimeError(info["error"])
            except Exception as exc:  # noqa: BLE001 - the agent could not start there (no bwrap, no daemon)
                why = " ".join(str(exc).split())[:300]
                log.warning("fleet: no sandbox agent on node %s: %s", nid[:8], why)
                with self._lock:
                    self._back_off(nid)
                    self.failures[nid] = why
                self._kill(actor)
                continue
            with self._lock:
                self._joined.add(nid)
                self._retry_at.pop(nid, None)
                self.failures.pop(nid, None)
            self._on_join(node, actor, info)

    def _back_off(self, nid: str) -> None:
        backoff = min(self._retry_at.get(nid, (0.0, START_BACKOFF_S[0] / 2))[1] * 2, START_BACKOFF_S[1])
        self._retry_at[nid] = (time.monotonic() + backoff, backoff)

    def _kill(self, actor: Any) -> None:
        try:
            self._ray.kill(actor)
        except Exception:  # noqa: BLE001 - already gone
            pass
