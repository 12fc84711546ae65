"""Where an environment's sandboxes come from: an injectable factory and release callable.

An environment never calls a backend directly: it asks ``factory(spec)`` for a
sandbox at ``reset`` and hands it back with ``release(sandbox)`` when the
episode ends. The default, :class:`FreshSandboxes`, creates one per episode and
closes it afterwards: nothing is shared and no thread runs, which is all a
single env needs. Whatever runs many episodes (training, validation, the test
suite) passes a :class:`WarmPool`'s ``acquire`` / ``release`` instead: the
pool restores each sandbox to how it was created (every process killed,
workspace and /tmp put back, a hygiene probe) and reuses it rather than
starting hundreds. There is one warm pool, :class:`sandbox.WarmPool`::

    with WarmPool("bwrap") as pool:
        env = gym.make("agentrl/ShellOps-v0", sandbox_factory=pool.acquire, sandbox_release=pool.release)

This module is also the one door from ``rl`` to sandboxes: a run builds its
pool from the names re-exported here (:class:`WarmPool`, :class:`Host`,
:class:`PoolConfig`), so ``rl`` depends on ``envs`` alone.
"""

from __future__ import annotations

from collections.abc import Callable

from sandbox import Backend, Host, PoolConfig, Sandbox, SandboxInfraError, SandboxSpec, WarmPool, get_backend

SandboxFactory = Callable[[SandboxSpec], Sandbox]
SandboxRelease = Callable[[Sandbox], None]


def resolve_backend(backend: str | Backend) -> Backend:
    """A backend object from a name (``"bwrap"``, ``"docker"``) or the object itself."""
    if isinstance(backend, str):
        return get_backend(backend)
    if isinstance(backend, Backend):
        return backend
    raise TypeError(f"backend: expected a backend name or a sandbox.Backend, got {type(backend).__name__}")


class FreshSandboxes:
    """One new sandbox per episode, closed at release. Simple and fully isolated; the envs' default."""

    def __init__(self, backend: str | Backend = "bwrap"):
        self.backend = resolve_backend(backend)

    def acquire(self, spec: SandboxSpec) -> Sandbox:
        return self.backend.create(spec)

    def __deepcopy__(self, memo: dict) -> FreshSandboxes:
        return self  # a provider is shared, never copied (gymnasium deep-copies make() kwargs)

    def release(self, sandbox: Sandbox) -> None:
        sandbox.close()

    def close(self) -> None:
        """Nothing is held between episodes."""


__all__ = [
    "FreshSandboxes",
    "Host",
    "PoolConfig",
    "SandboxFactory",
    "SandboxInfraError",
    "SandboxRelease",
    "WarmPool",
    "resolve_backend",
]
