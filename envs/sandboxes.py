"""Where an environment's sandboxes come from: an injectable factory and release callable.

An environment never calls a backend directly: it asks ``factory(spec)`` for a
sandbox at ``reset`` and hands it back with ``release(sandbox)`` when the
episode ends. The default, :class:`FreshSandboxes`, creates one per episode and
closes it afterwards. :class:`ReusedSandboxes` keeps one idle sandbox per spec
and rewinds it to a pristine snapshot on every acquire (``restore`` kills every
process and resets the workspace and /tmp), which is what validation and the
test suite use instead of starting hundreds of sandboxes. A scheduler's warm
pool plugs in the same way: pass its acquire/release callables to the env.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from typing import Any

from sandbox import Backend, Sandbox, SandboxInfraError, SandboxSpec, Snapshot, get_backend

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
    """One new sandbox per episode, closed at release. Simple and fully isolated."""

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


def spec_key(spec: SandboxSpec) -> str:
    """A hashable identity for a spec (its ``env`` mapping makes the dataclass itself unhashable)."""
    return json.dumps(dataclasses.asdict(spec), sort_keys=True)


class ReusedSandboxes:
    """Keeps idle sandboxes per spec and restores a pristine snapshot on every acquire.

    A sandbox that is unhealthy (its channel broke, an infra error happened) is
    closed at release instead of being kept. Thread-safe.
    """

    def __init__(self, backend: str | Backend = "bwrap", *, max_idle_per_spec: int = 4):
        self.backend = resolve_backend(backend)
        self.max_idle_per_spec = max_idle_per_spec
        self._idle: dict[str, list[tuple[Sandbox, Snapshot]]] = {}
        self._pristine: dict[str, tuple[str, Snapshot]] = {}
        self._lock = threading.Lock()
        self.created = 0

    def acquire(self, spec: SandboxSpec) -> Sandbox:
        key = spec_key(spec)
        while True:
            with self._lock:
                idle = self._idle.get(key, [])
                entry = idle.pop() if idle else None
            if entry is None:
                break
            sandbox, pristine = entry
            try:
                sandbox.restore(pristine)
            except SandboxInfraError:
                sandbox.close()
                continue
            self._pristine[sandbox.id] = (key, pristine)
            return sandbox
        sandbox = self.backend.create(spec)
        self.created += 1
        try:
            self._pristine[sandbox.id] = (key, sandbox.snapshot())
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    def __deepcopy__(self, memo: dict) -> ReusedSandboxes:
        return self  # a pool is shared, never copied (gymnasium deep-copies make() kwargs)

    def release(self, sandbox: Sandbox) -> None:
        key, pristine = self._pristine.pop(sandbox.id, (None, None))
        if key is None or not sandbox.healthy:
            sandbox.close()
            return
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.max_idle_per_spec:
                idle.append((sandbox, pristine))
                return
        sandbox.close()

    def close(self) -> None:
        with self._lock:
            entries = [e for idle in self._idle.values() for e in idle]
            self._idle.clear()
        for sandbox, _ in entries:
            sandbox.close()

    def __enter__(self) -> ReusedSandboxes:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
