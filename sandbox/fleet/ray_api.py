"""The fleet's only door to Ray: a lazy import, connecting, and naming what a Ray failure means.

Ray is an optional extra (``pip install 'agentrl[ray]'``): nothing under :mod:`sandbox` imports it
until a :class:`~sandbox.fleet.ray_fleet.RayFleet` is made, and a missing install says how to fix it.
Ray detects a lost node or actor; :func:`attribute` turns that into the fleet's own
:class:`~sandbox.errors.SandboxInfraError` with a cause the scheduler retries and meters
(``node_lost``, ``actor_lost``, ``node_unresponsive``).
"""

from __future__ import annotations

import logging
import socket
from types import ModuleType
from typing import Any

from sandbox.errors import BackendUnavailable, SandboxInfraError, SandboxUsageError

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'agentrl[ray]'"
# What connect() starts when it has to start a cluster itself: small, no dashboard.
LOCAL_INIT = {"include_dashboard": False, "object_store_memory": 80 << 20}


def import_ray() -> ModuleType:
    """The ``ray`` module, or :class:`BackendUnavailable` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise BackendUnavailable(
            f"fleet='ray' needs the Ray package, which is not installed ({exc}); install it with: {INSTALL_HINT}",
            backend="ray",
        ) from exc
    return ray


def connect(address: str) -> bool:
    """Joins the Ray cluster at ``address`` unless this process already has; True if it joined here.

    ``address``: ``"auto"`` (the cluster ``ray start`` made on this machine, or ``RAY_ADDRESS``),
    ``"local"`` (start a one-node cluster inside this process: a laptop), or ``"HOST:PORT"`` /
    ``"ray://HOST:PORT"``. A process that already called ``ray.init`` keeps its connection, and the
    fleet then leaves it open at close.
    """
    if not isinstance(address, str) or not address:
        raise SandboxUsageError(f"address: expected 'auto', 'local' or a Ray address HOST:PORT, got {address!r}")
    ray = import_ray()
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
    if address == "local":
        ray.init(**LOCAL_INIT, **kwargs)
        return True
    try:
        _knock(address)  # Ray itself waits minutes on an address where nothing listens
        ray.init(address=address, **kwargs)
    except (ConnectionError, OSError) as exc:
        raise BackendUnavailable(
            f"address={address!r}: no Ray cluster answers there ({exc}); start one with `ray start --head` "
            "(and `ray start --address=HEAD:6379` on each sandbox node), or use address='local'",
            backend="ray",
        ) from exc
    return True


def _knock(address: str, timeout: float = 5.0) -> None:
    """Raises OSError unless something listens at a ``HOST:PORT`` address (others are left to Ray)."""
    host, _, port = address.rpartition(":")
    if host and port.isdigit() and "://" not in address:
        socket.create_connection((host, int(port)), timeout=timeout).close()


def attribute(exc: BaseException, node: str, node_alive: bool | None) -> SandboxInfraError:
    """The infrastructure error a Ray failure of a call to ``node``'s actor stands for.

    ``node_alive``: what the cluster says of the node now (None: unknown). A dead node, or Ray's
    own word that the node died, is ``node_lost``; an actor gone on a live node is ``actor_lost``;
    a call that got no answer in time is ``node_unresponsive``.
    """
    ray = import_ray()
    text = " ".join(str(exc).split())[:300]
    if node_alive is False or "node has died" in text or isinstance(exc, ray.exceptions.NodeDiedError):
        cause = "node_lost"
    elif isinstance(exc, (TimeoutError, ray.exceptions.ActorUnavailableError)):
        cause = "node_unresponsive"  # maybe a network blip: the node stays, the call is retried elsewhere
    else:
        cause = "actor_lost"
    return SandboxInfraError(f"{node}: {type(exc).__name__}: {text}", backend="ray", cause=cause)


def ray_failure_types() -> tuple[type[BaseException], ...]:
    """The exceptions by which Ray says a call did not complete (as opposed to what the call raised);
    a timeout of the caller's wait is one too."""
    ex = import_ray().exceptions
    return (ex.RayActorError, ex.NodeDiedError, ex.ObjectLostError, ex.RaySystemError, TimeoutError)
