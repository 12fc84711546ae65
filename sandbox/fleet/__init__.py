"""Sandboxes over a cluster: a Ray-backed fleet with a warm pool's interface.

    ray_fleet.py   RayFleet: the pool's API — leases placed on nodes, metrics per node, close
    core.py        FleetCore: nodes joining and leaving, Ray failures attributed, demand hints
    membership.py  NodeWatcher: an agent started on each node that joins, a node's loss noticed
    agent.py       NodeAgent: the actor on each node, owner of that node's WarmPool
    remote.py      RemoteSandbox: the Sandbox API of a sandbox on another node
    batching.py    CallBatcher: concurrent calls to one node in one round trip
    nodes.py       FleetNode: the driver's view of a node, placed like a pool's Host
    ray_api.py     the lazy Ray import, connecting, and what a Ray failure means

Ray is optional (``pip install 'agentrl[ray]'``) and imported only when a fleet is made. The
Docker-URL fleet — a :class:`~sandbox.pool.warm_pool.WarmPool` over daemon URLs — needs no Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.fleet.ray_fleet import RayFleet  # noqa: F401
    from sandbox.fleet.remote import RemoteSandbox  # noqa: F401

_EXPORTS = {"RayFleet": "sandbox.fleet.ray_fleet", "RemoteSandbox": "sandbox.fleet.remote"}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sandbox.fleet' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)


__all__ = ["RayFleet", "RemoteSandbox"]
