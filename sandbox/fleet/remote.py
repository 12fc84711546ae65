"""The sandbox a Ray fleet lends: :class:`RemoteSandbox`, a handle to one sandbox on one node.

It has the :class:`~sandbox.backends.base.Sandbox` API that environments and jobs use (``exec``,
``write_files``, ``read_file``, ``snapshot``/``restore``, ``ping``, ``probe``, ``abort``, ``id``,
``spec``, ``healthy``) and sends every call to the agent of the node the sandbox lives on: an
episode that holds it keeps talking to that one node. What the sandbox raises comes back as
itself; a call Ray could not complete — the node died, the agent died, no answer in time —
raises :class:`~sandbox.errors.SandboxInfraError` with cause ``node_lost`` / ``actor_lost`` /
``node_unresponsive``, which the scheduler retries elsewhere or reports as an anomaly, never as
a model failure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox.backends.base import BOOT_TIMEOUT_S, HOST_GRACE_S
from sandbox.errors import SandboxClosed, SandboxInfraError
from sandbox.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.fleet.nodes import FleetNode

# Beyond the sandbox's own deadline, how long Ray may take to bring a reply back.
TRANSPORT_GRACE_S = 30.0


class RemoteSandbox:
    """A sandbox leased from a :class:`~sandbox.fleet.ray_fleet.RayFleet`, living on ``node``.

    Give it back with the fleet's ``release`` (or ``close()``, which destroys it).
    """

    def __init__(self, fleet: Any, node: FleetNode, sandbox_id: str, spec: SandboxSpec, info: dict[str, Any]):
        self._fleet, self.node, self.id, self.spec = fleet, node, sandbox_id, spec
        self.backend: str = info.get("backend", "ray")
        self.confinement: dict[str, Any] = dict(info.get("confinement") or {})
        self._healthy = True
        self._closed = False
        self.lost: SandboxInfraError | None = None  # set when its node left the fleet

    # -- the Sandbox API ----------------------------------------------------------------
    def exec(self, cmd: Any, *, timeout: float | None = None, **kwargs: Any) -> Any:
        """Runs ``cmd`` in the sandbox (see :meth:`Sandbox.exec`); returns its ExecResult."""
        limit = (self.spec.timeout_s if timeout is None else timeout) + HOST_GRACE_S + TRANSPORT_GRACE_S
        return self._call("exec", (cmd,), {"timeout": timeout, **kwargs}, limit)

    def write_files(self, files: Any, **kwargs: Any) -> None:
        """Writes files in the sandbox (see :meth:`Sandbox.write_files`)."""
        return self._call("write_files", (files,), kwargs)

    def read_file(self, path: str, **kwargs: Any) -> bytes:
        """Reads a file from the sandbox (see :meth:`Sandbox.read_file`)."""
        return self._call("read_file", (path,), kwargs)

    def snapshot(self, **kwargs: Any) -> Any:
        """The sandbox's snapshot, capped on its node (see :meth:`Sandbox.snapshot`)."""
        return self._call("snapshot", (), kwargs)

    def restore(self, snapshot: Any) -> None:
        return self._call("restore", (snapshot,), {})

    def kill_all(self) -> None:
        return self._call("kill_all", (), {})

    def ping(self) -> dict[str, Any]:
        return self._call("ping", (), {})

    def probe(self) -> dict[str, Any]:
        return self._call("probe", (), {})

    def resources(self) -> dict[str, Any]:
        return self._call("resources", (), {})

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "id": self.id, "image": self.spec.image, "node": self.node.name}

    @property
    def healthy(self) -> bool:
        return self._healthy and not self._closed and self.lost is None

    @property
    def closed(self) -> bool:
        return self._closed

    def abort(self) -> None:
        """Kills the sandbox under its holder, from any thread (a timeout, a cancel). Never raises."""
        if self.lost is None and not self._closed:
            try:
                self.node.actor.abort.remote(self.id)
            except Exception:  # noqa: BLE001 - a node on its way out: nothing left to kill
                pass

    def end_lease(self) -> None:
        """The fleet took the sandbox back: from now on every call refuses (a stale handle never
        reaches a sandbox leased to another episode)."""
        self._closed = True

    def close(self) -> None:
        """Gives the sandbox back to be destroyed, not reused (the fleet's ``release`` reuses it)."""
        self._fleet.release(self, reusable=False)

    def __enter__(self) -> RemoteSandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteSandbox({self.id} on {self.node.name})"

    # -- transport ----------------------------------------------------------------------
    def _call(self, method: str, args: tuple, kwargs: dict[str, Any], limit: float | None = None) -> Any:
        if self._closed:
            raise SandboxClosed(f"[ray] sandbox {self.id} was released; {method!r} needs a new lease")
        if self.lost is not None:
            raise self.lost
        future = self.node.calls.submit((self.id, method, args, kwargs))
        try:
            returned, value, healthy = future.result(BOOT_TIMEOUT_S + TRANSPORT_GRACE_S if limit is None else limit)
        except self._fleet.ray_failures as exc:  # Ray could not complete the call (or not in time)
            self._healthy = False
            raise self._fleet.attribute(self, exc) from exc
        self._healthy = healthy
        if not returned:
            raise value
        return value
