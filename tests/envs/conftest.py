"""Fixtures for the envs tests: real sandboxes on both backends, reused across tests.

Backends come from ``tests.sandbox.conftest.backend_or_skip``: skipped locally
when unavailable, a failure in CI (``REQUIRE_DOCKER=1``). One
:class:`envs.ReusedSandboxes` pool per backend lives while the envs tests run, so
hundreds of episodes restore a snapshot instead of starting sandboxes. It is
closed when the package's last test ends: later packages (the sandbox tests
check that *nothing* of this process is left on a daemon) must not see it.
"""

from __future__ import annotations

import subprocess

import gymnasium as gym
import pytest

import envs  # noqa: F401 - registers the environments
from envs import ReusedSandboxes
from tests.sandbox.conftest import backend_or_skip

_pools: dict[str, ReusedSandboxes] = {}


def pool_for(name: str) -> ReusedSandboxes:
    if name not in _pools:
        _pools[name] = ReusedSandboxes(backend_or_skip(name), max_idle_per_spec=2)
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
def pool(backend_name) -> ReusedSandboxes:
    return pool_for(backend_name)


@pytest.fixture
def bwrap_pool() -> ReusedSandboxes:
    return pool_for("bwrap")


def make_env(env_id: str, pool: ReusedSandboxes, **kwargs):
    """An environment drawing its sandboxes from ``pool`` (unwrapped: tests call domain hooks)."""
    return gym.make(env_id, sandbox_factory=pool.acquire, sandbox_release=pool.release, **kwargs).unwrapped


def kill_underneath(sandbox) -> None:
    """Destroys a sandbox behind the API's back, as a crashed host or daemon would."""
    if sandbox.backend == "docker":
        subprocess.run(["docker", "kill", sandbox.id], check=True, capture_output=True)
    else:
        sandbox._proc.kill()
        sandbox._proc.wait()
