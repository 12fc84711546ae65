"""The sandbox handle the warm pool lends out: :class:`PooledSandbox`.

``PooledSandbox`` is what envs receive from the pool's factory (``pool.open``):
it behaves like a :class:`~sandbox.backends.base.Sandbox` — same methods, same
results — but ``close()`` hands the sandbox back to the pool to be reset and
reused instead of destroying it, and once closed the handle refuses every call.
That last part matters: a stale reference kept by an env must never reach a
sandbox that has since been leased to another episode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from sandbox.errors import SandboxClosed, SandboxInfraError

if TYPE_CHECKING:
    from sandbox.backends.base import Sandbox


class Lender(Protocol):
    """What a handle needs of the pool that lent it: a way to give the sandbox back."""

    def release(self, sandbox: Sandbox, reusable: bool = True) -> None: ...


class PooledSandbox:
    """A sandbox leased from a :class:`~sandbox.pool.warm_pool.WarmPool`; ``close()`` returns it there.

    Every :class:`~sandbox.backends.base.Sandbox` method and attribute (``exec``,
    ``write_files``, ``read_file``, ``snapshot``, ``restore``, ``ping``, ``id``,
    ``spec``, ...) is forwarded. ``close()`` releases it for reuse if it is still
    healthy; ``discard()`` releases it to be destroyed (use it when the episode
    left the sandbox in a state nobody should inherit, e.g. after a timeout).
    Used as a context manager, an infrastructure error escaping the block discards it.
    """

    def __init__(self, pool: Lender, sandbox: Sandbox):
        self._pool = pool
        self._sandbox = sandbox
        self._released = False

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not defined on this class: the Sandbox API. After release only
        # the sandbox's identity stays readable (for logs); everything that acts on it refuses.
        if self.__dict__.get("_released", True) and name not in ("id", "spec", "backend"):
            raise SandboxClosed(f"[pool] sandbox was returned to the pool; {name!r} needs a new lease")
        return getattr(self._sandbox, name)

    @property
    def sandbox(self) -> Sandbox:
        """The underlying sandbox (valid only while this lease is open)."""
        if self._released:
            raise SandboxClosed("[pool] sandbox was returned to the pool")
        return self._sandbox

    @property
    def closed(self) -> bool:
        return self._released

    @property
    def healthy(self) -> bool:
        return not self._released and self._sandbox.healthy

    def close(self, reusable: bool | None = None) -> None:
        """Returns the sandbox to the pool (reset and reused if healthy). Idempotent."""
        if self._released:
            return
        self._released = True
        self._pool.release(self._sandbox, self._sandbox.healthy if reusable is None else reusable)

    def discard(self) -> None:
        """Returns the sandbox to the pool to be destroyed, not reused."""
        self.close(reusable=False)

    def __enter__(self) -> PooledSandbox:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(reusable=None if not isinstance(exc, SandboxInfraError) else False)

    def __repr__(self) -> str:
        state = "released" if self._released else self._sandbox.id
        return f"PooledSandbox({state})"
