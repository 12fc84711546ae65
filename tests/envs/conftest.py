"""Fixtures for the envs tests: real sandboxes on both backends, reused across tests.

Backends come from ``tests.sandbox.conftest.backend_or_skip``: skipped locally
when unavailable, a failure in CI (``REQUIRE_DOCKER=1``). One
:class:`envs.WarmPool` per backend lives while the envs tests run, so hundreds
of episodes get a sandbox reset to how it was created instead of starting one.
It is closed when the package's last test ends: later packages (the sandbox
tests check that *nothing* of this process is left on a daemon) must not see it.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import envs  # noqa: F401 - registers the environments
from envs.sandboxes import Host, PoolConfig, WarmPool
from tests.sandbox.conftest import backend_or_skip
from tests.sandbox.conftest import kill_underneath as _kill_underneath

# A test may hold several leases at once (an episode's sandbox, a judge's, its own) and an acquire
# beyond capacity waits: room for far more than any test holds. Idle ones go after a minute.
CAPACITY = 16
CONFIG = PoolConfig(idle_ttl_s=60.0)

_pools: dict[str, WarmPool] = {}


def pool_for(name: str) -> WarmPool:
    if name not in _pools:
        _pools[name] = WarmPool(Host(backend_or_skip(name), capacity=CAPACITY), config=CONFIG)
    return _pools[name]


@pytest.fixture(scope="package", autouse=True)
def _close_pools():
    yield
    while _pools:
        _pools.popitem()[1].close()


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def backend_name(request) -> str:
    backend_or_skip(request.param)
    return request.param


@pytest.fixture
def pool(backend_name) -> WarmPool:
    return pool_for(backend_name)


@pytest.fixture
def bwrap_pool() -> WarmPool:
    return pool_for("bwrap")


def make_env(env_id: str, pool: WarmPool, **kwargs):
    """An environment drawing its sandboxes from ``pool`` (unwrapped: tests call domain hooks)."""
    return gym.make(env_id, sandbox_factory=pool.acquire, sandbox_release=pool.release, **kwargs).unwrapped


def kill_underneath(sandbox) -> None:
    """Destroys a sandbox behind the API's back, as a crashed host or daemon would; returns once it is dead."""
    _kill_underneath(sandbox, wait=True)
