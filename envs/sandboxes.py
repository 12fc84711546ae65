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
:class:`PoolConfig`, or :class:`RayFleet` over a cluster), so ``rl`` depends on ``envs`` alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sandbox import (  # BACKENDS: re-exported for rl.config (rl never imports sandbox)
    BACKENDS,
    Backend,
    Host,
    Job,
    JobResult,
    PoolConfig,
    RayFleet,
    RetryPolicy,
    Sandbox,
    SandboxInfraError,
    SandboxSpec,
    Scheduler,
    WarmPool,
    get_backend,
)

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


class LentSandboxes:
    """Sandboxes lent to an environment for one step by whoever runs the step (a scheduler job).

    A :class:`Scheduler` job leases a pooled sandbox and runs ``env.step`` inside :meth:`lend`;
    the environment's ``sandbox_factory`` (:meth:`acquire`) then returns that sandbox, and its
    ``sandbox_release`` leaves it to the scheduler, which resets and reuses it. Outside a lend
    (``reset`` of a domain that holds its sandbox for the whole episode) both fall through to
    ``acquire`` / ``release`` given here (the warm pool's). Thread-local: each job's thread lends
    its own sandbox.
    """

    def __init__(self, acquire: SandboxFactory, release: SandboxRelease):
        self._acquire, self._release = acquire, release
        self._local = threading.local()

    @contextmanager
    def lend(self, sandbox: Sandbox | None) -> Iterator[None]:
        previous = getattr(self._local, "sandbox", None)
        self._local.sandbox = sandbox
        try:
            yield
        finally:
            self._local.sandbox = previous

    def acquire(self, spec: SandboxSpec) -> Sandbox:
        lent = getattr(self._local, "sandbox", None)
        return lent if lent is not None else self._acquire(spec)

    def release(self, sandbox: Sandbox) -> None:
        if sandbox is not getattr(self._local, "sandbox", None):
            self._release(sandbox)

    def __deepcopy__(self, memo: dict) -> LentSandboxes:
        return self


__all__ = [
    "BACKENDS",
    "FreshSandboxes",
    "Host",
    "Job",
    "JobResult",
    "LentSandboxes",
    "PoolConfig",
    "RayFleet",
    "RetryPolicy",
    "SandboxFactory",
    "SandboxInfraError",
    "SandboxRelease",
    "Scheduler",
    "WarmPool",
    "resolve_backend",
]
