"""A fleet of sandbox nodes on a Ray cluster, used exactly like a :class:`~sandbox.pool.warm_pool.WarmPool`.

    fleet = RayFleet("bwrap", address="auto")        # one agent per node of the running cluster
    with Scheduler(fleet) as sched:                   # the scheduler places jobs on its nodes
        results = sched.run(jobs)
    fleet.close()

Each node runs a :class:`~sandbox.fleet.agent.NodeAgent` that owns the node's local warm pool
(bwrap, or the node's Docker daemon). The fleet has the pool's interface — ``acquire`` /
``release`` / ``open`` / ``abort`` / ``want`` / ``capacity`` / ``host_of`` / ``stats`` /
``close`` — so :class:`~sandbox.scheduler.scheduler.Scheduler`, the rollouts and
``LentSandboxes`` take it in place of a pool. A lease goes to a node the way the pool places one
on a host (:func:`~sandbox.pool.hosts.place`: free capacity, warm sandboxes of the spec, not where
the job just failed) and yields a :class:`~sandbox.fleet.remote.RemoteSandbox`: every call of the
job or episode that holds it goes to that node.

Failures are Ray's to detect and ours to attribute: a node the cluster loses (or whose agent's
calls fail because it died) leaves the rotation, every sandbox leased there fails its next call
with cause ``node_lost``, and the scheduler re-runs those jobs elsewhere (an infrastructure retry,
never a score). A node that joins gets an agent and work at once. Per-node counters in
:meth:`RayFleet.stats` (``sandbox/node/<name>/...``) and ``JobResult.host`` say which node did what.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from sandbox import BACKENDS
from sandbox.backends.base import BOOT_TIMEOUT_S, Backend
from sandbox.errors import (
    HostUnavailable,
    ImageMissing,
    PoolTimeout,
    SandboxClosed,
    SandboxInfraError,
    SandboxUsageError,
)
from sandbox.fleet.core import FleetCore
from sandbox.fleet.nodes import FleetNode, node_metrics
from sandbox.fleet.remote import TRANSPORT_GRACE_S, RemoteSandbox
from sandbox.pool import cleanup
from sandbox.pool.config import PoolConfig
from sandbox.pool.hosts import place
from sandbox.pool.metrics import percentile_keys
from sandbox.pool.pooled import PooledSandbox
from sandbox.spec import SandboxSpec, spec_key

log = logging.getLogger(__name__)


def _check_count(value: Any, field: str) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise SandboxUsageError(f"RayFleet.{field}: expected an int >= 1 or None, got {value!r}")


class RayFleet(FleetCore):
    """Sandboxes on every node of a Ray cluster, with a warm pool's interface (see the module docstring).

    Args:
      backend: ``"bwrap"`` or ``"docker"``: what each node's agent runs sandboxes with (a Docker node
        uses its own default daemon, which must hold the image); or a picklable :class:`Backend`
        each agent gets a copy of (``benchmarks/fleet_sim.py`` stubs sandboxes so).
      hosts: daemon URLs each node's agent uses, as seen from that node (``unix:///var/run/docker.sock``
        is the node's own); default: ``backend`` alone. ``capacity`` and ``max_sandboxes`` are per host.
      address: the cluster: ``"auto"`` (``ray start`` / ``RAY_ADDRESS``), ``"local"`` (start one in this
        process) or ``"HOST:PORT"``; ignored if this process already called ``ray.init``.
      capacity: leases at once per host of a node (default: the node's Ray CPU count).
      max_sandboxes: sandboxes at once per host of a node (default ``2 * capacity``).
      config: each node's :class:`PoolConfig`.
      resource: only nodes advertising this custom Ray resource serve sandboxes (``ray start
        --resources='{"sandbox": 1}'``); None: every node.
      batch_calls: coalesce concurrent calls to a node into one round trip (see :mod:`sandbox.fleet.batching`).
      min_nodes: nodes that must be serving before the constructor returns (default: every live node's
        agent answered, or failed to start there — that node is logged and retried with backoff).
      start_timeout_s: how long to wait for them; then :class:`HostUnavailable`.
      poll_s: how often the cluster's node list is read (joins and losses).
      no_host_timeout_s: :meth:`acquire` raises :class:`HostUnavailable` once no node has served this long.
    """

    def __init__(
        self,
        backend: str | Backend = "bwrap",
        *,
        address: str = "auto",
        hosts: Iterable[str] = (),
        capacity: int | None = None,
        max_sandboxes: int | None = None,
        config: PoolConfig | None = None,
        resource: str | None = None,
        batch_calls: bool = True,
        min_nodes: int | None = None,
        start_timeout_s: float = 120.0,
        poll_s: float = 0.5,
        no_host_timeout_s: float = 60.0,
    ):
        if not (isinstance(backend, Backend) or backend in BACKENDS):
            raise SandboxUsageError(f"RayFleet.backend: expected one of {BACKENDS} or a Backend, got {backend!r}")
        for field, value in (("capacity", capacity), ("max_sandboxes", max_sandboxes), ("min_nodes", min_nodes)):
            _check_count(value, field)
        if capacity is not None and max_sandboxes is not None and max_sandboxes < capacity:
            raise SandboxUsageError(f"RayFleet.max_sandboxes: expected >= capacity ({capacity}), got {max_sandboxes}")
        hosts = (hosts,) if isinstance(hosts, str) else tuple(hosts)
        if not all(isinstance(h, str) and h for h in hosts):
            raise SandboxUsageError(f"RayFleet.hosts: expected daemon URLs (str), got {hosts!r}")
        if config is not None and not isinstance(config, PoolConfig):
            raise SandboxUsageError(f"RayFleet.config: expected a PoolConfig, got {type(config).__name__}")
        for field, value in (("start_timeout_s", start_timeout_s), ("poll_s", poll_s)):
            if not isinstance(value, (int, float)) or not value > 0:
                raise SandboxUsageError(f"RayFleet.{field}: expected seconds > 0, got {value!r}")
        super().__init__(
            backend, address, hosts, resource, capacity=capacity, max_sandboxes=max_sandboxes, config=config,
            batch_calls=batch_calls, poll_s=poll_s, no_host_timeout_s=no_host_timeout_s,
        )  # fmt: skip
        try:
            self._await_nodes(min_nodes, start_timeout_s)
        except BaseException:
            self.close()
            raise
        self._watcher.start()
        self._hints.start()
        cleanup.register(self)

    # -- leasing --------------------------------------------------------------------------
    def acquire(
        self, spec: SandboxSpec | None = None, *, timeout: float | None = None, avoid: Iterable[str] = ()
    ) -> RemoteSandbox:
        """A clean sandbox of ``spec`` on the best node (blocks while every node is full).

        Raises what :meth:`WarmPool.acquire` raises, and :class:`SandboxInfraError` with cause
        ``node_lost`` if the node chosen died before the lease was made. ``avoid``: node names to use
        only if no other fits (where the job's previous attempt failed).
        """
        spec = SandboxSpec() if spec is None else spec
        if not isinstance(spec, SandboxSpec):
            raise SandboxUsageError(f"acquire(spec=): expected a SandboxSpec, got {type(spec).__name__}")
        key, start, avoid = spec_key(spec), time.monotonic(), tuple(avoid)
        no_node_since: float | None = None
        with self._cond:
            while True:
                if self._closed:
                    raise SandboxClosed("[ray] the fleet is closed")
                now = time.monotonic()
                node = place(self.nodes.values(), spec.image, key, avoid, now)
                if node is not None:
                    node.leased += 1  # reserved while the agent makes the lease
                    break
                healthy = [n for n in self.nodes.values() if n.healthy]
                if healthy and not any(n.can_run(spec.image, now) for n in healthy):
                    raise ImageMissing(f"no node of the fleet has {spec.image}", backend="ray")
                no_node_since = None if healthy else (no_node_since or now)
                if no_node_since is not None and now - no_node_since >= self.no_host_timeout_s:
                    raise HostUnavailable(
                        f"no Ray node has served sandboxes for {now - no_node_since:.0f}s", backend="ray"
                    )
                if timeout is not None and now - start >= timeout:
                    raise PoolTimeout(f"no sandbox free within {timeout}s (fleet saturated)", backend="ray")
                self._cond.wait(0.25 if timeout is None else max(0.0, min(0.25, start + timeout - now)))
        left = None if timeout is None else max(0.0, start + timeout - time.monotonic())
        try:
            ref = node.actor.acquire.remote(spec, left)
            limit = (left if left is not None else BOOT_TIMEOUT_S) + TRANSPORT_GRACE_S
            made, value = self._ray.get(ref, timeout=limit)
        except self.ray_failures as exc:
            self._unreserve(node)
            if isinstance(exc, TimeoutError):  # the agent may still make it: give it back when it does
                ref.future().add_done_callback(lambda done: self._release_orphan(node, done))
            raise self._node_failed(node, exc) from exc
        if not made:
            self._unreserve(node)
            if isinstance(value, ImageMissing):
                with self._cond:
                    node.missing_images[spec.image] = time.monotonic() + self.config.image_recheck_s
            raise value
        sandbox_id, info, idle = value
        sandbox = RemoteSandbox(self, node, sandbox_id, spec, info)
        with self._cond:
            node.idle = idle
            node.counters["leases"] += 1
            self.counters.add("leases")
            self._leases[sandbox_id] = sandbox
            lost = not node.healthy
            if lost:
                sandbox.lost = SandboxInfraError(f"{node.name}: {node.down_reason}", backend="ray", cause="node_lost")
        self.meter.change(busy=1)
        self.acquire_wait.add(time.monotonic() - start)
        return sandbox

    def release(self, sandbox: Any, reusable: bool = True, *, error: BaseException | None = None) -> None:
        """Hands a lease back: reset for reuse on its node if ``reusable`` and healthy, else destroyed.

        ``error``: the infrastructure error the lease ended with, if any (only for the pool's interface:
        a node's loss is already known from the call that raised it).
        """
        with self._cond:
            leased = self._leases.pop(getattr(sandbox, "id", ""), None)
            if leased is None:
                if self._closed or isinstance(sandbox, RemoteSandbox):
                    return  # released twice, or after close()
                raise SandboxUsageError(f"release(sandbox=): {sandbox!r} is not leased from this fleet")
            keep = reusable and leased.healthy
            leased.end_lease()
            node = leased.node
            node.leased -= 1
            gone = leased.lost is not None or not node.healthy
            self._cond.notify_all()
        self.meter.change(busy=-1)
        if gone:
            return  # its node (and the sandbox with it) is gone: nothing to give back
        try:
            ref = node.actor.release.remote([(leased.id, keep)])
        except Exception as exc:  # noqa: BLE001 - a dead handle: the node's loss is noticed elsewhere
            log.info("release of %s on %s failed: %s", leased.id, node.name, exc)
            return
        ref.future().add_done_callback(lambda f: self._note_idle(node, f))

    def open(self, spec: SandboxSpec | None = None, *, timeout: float | None = None) -> PooledSandbox:
        """A leased sandbox whose ``close()`` returns it to the fleet (like :meth:`WarmPool.open`)."""
        return PooledSandbox(self, self.acquire(spec, timeout=timeout))

    @contextmanager
    def lease(self, spec: SandboxSpec | None = None, *, timeout: float | None = None) -> Iterator[PooledSandbox]:
        with self.open(spec, timeout=timeout) as sb:
            yield sb

    def abort(self, sandbox: Any) -> None:
        """Kills a leased sandbox from any thread; its holder still releases it."""
        sandbox.abort()

    def prewarm(self, spec: SandboxSpec | None = None, n: int = 1) -> int:
        """Makes idle sandboxes of ``spec`` on every node until each has ``n``; returns how many it made."""
        spec = SandboxSpec() if spec is None else spec
        with self._cond:
            nodes = [node for node in self.nodes.values() if node.healthy]
        return sum(self._ray.get([node.actor.prewarm.remote(spec, n) for node in nodes]))

    def want(self, spec: SandboxSpec, n: int) -> None:
        """Demand hint (the scheduler's queue depth for ``spec``); sent to the nodes by share of capacity."""
        with self.lock:
            self._demand[spec_key(spec)] = (spec, max(0, n))

    # -- health ---------------------------------------------------------------------------
    def attribute(self, sandbox: RemoteSandbox, exc: BaseException) -> SandboxInfraError:
        """The infrastructure error for a call of ``sandbox`` that Ray did not complete."""
        return self._node_failed(sandbox.node, exc)

    def host_of(self, sandbox: Any) -> FleetNode | None:
        with self.lock:
            leased = self._leases.get(getattr(sandbox, "id", ""))
            return leased.node if leased is not None else None

    def capacity(self) -> int:
        """Leases that may run at once on the nodes now in rotation."""
        with self.lock:
            return sum(n.capacity for n in self.nodes.values() if n.healthy)

    # -- metrics --------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Fleet gauges and counters, and per node ``sandbox/node/<name>/{leases,lost,calls,...}``."""
        with self.lock:
            nodes = [*self.departed, *self.nodes.values()]
            out = {f"sandbox/fleet_{k}": float(v) for k, v in self.counters.snapshot().items()}
            healthy = [n for n in nodes if n.healthy]
            out.update(
                {
                    "sandbox/hosts": float(len(self.nodes)),
                    "sandbox/hosts_healthy": float(len(healthy)),
                    "sandbox/capacity": float(sum(n.capacity for n in healthy)),
                    "sandbox/pool_idle": float(sum(sum(n.idle.values()) for n in healthy)),
                    "sandbox/pool_leased": float(len(self._leases)),
                }
            )
            out.update(node_metrics(nodes))
        util = self.meter.snapshot()
        out.update(percentile_keys("sandbox/pool_acquire", self.acquire_wait))
        out.update({"sandbox/utilisation": util["utilisation"], "sandbox/held_s": util["held_s"]})
        out["sandbox/busy_s"] = util["busy_s"]
        return out

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def shutdown(self, reason: str = "shutdown") -> None:
        """What the cleanup hooks call (signals, interpreter exit)."""
        if not self._closed:
            log.info("closing the Ray fleet (%s)", reason)
        self.close()

    def close(self) -> dict[str, dict[str, int]]:
        """Destroys every sandbox on every node and stops the agents; returns each agent's last word
        (``{"leased": killed under a holder, "live": sandboxes left}``) by node name."""
        with self._cond:
            if self._closed:
                return {}
            self._closed = True
            nodes = [n for n in self.nodes.values() if n.healthy]
            closing = SandboxInfraError("the fleet is closed", backend="ray", cause="shutdown")
            for sandbox in self._leases.values():
                sandbox.lost = closing  # an infrastructure failure to its holder: no sample, never a score
            self._cond.notify_all()
        self._watcher.stop()
        if self._hints.is_alive():
            self._hints.join(timeout=5)
        report: dict[str, dict[str, int]] = {}
        if self._ray.is_initialized():  # not at interpreter exit after Ray's own hook: agents died with us
            refs = {node.name: node.actor.close.remote() for node in nodes}
            for name, ref in refs.items():
                try:
                    report[name] = self._ray.get(ref, timeout=60)
                except Exception as exc:  # noqa: BLE001 - a node lost while closing took its sandboxes along
                    log.info("close: agent on %s did not answer: %s", name, exc)
            for node in nodes:
                self._ray.kill(node.actor)
        self._drainers.shutdown(wait=False, cancel_futures=True)
        cleanup.unregister(self)
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()
        return report

    def __enter__(self) -> RayFleet:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __deepcopy__(self, memo: dict) -> RayFleet:
        return self  # shared, never copied (gymnasium deep-copies the kwargs of gym.make, factories included)

    def __repr__(self) -> str:
        return f"RayFleet({self.backend}, nodes={[n.name for n in self.nodes.values()]}, closed={self._closed})"
