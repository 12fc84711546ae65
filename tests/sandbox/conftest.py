"""Backend fixtures: every sandbox test runs on bwrap and on Docker.

With ``REQUIRE_DOCKER=1`` (CI, via ``make test``) a backend that cannot run is
a test *failure*, never a skip.
"""

from __future__ import annotations

import os

import pytest

from sandbox import SandboxInfraError, SandboxSpec, get_backend

REQUIRED = os.environ.get("REQUIRE_DOCKER") == "1"
_backends: dict[str, object] = {}


def backend_or_skip(name: str):
    if name not in _backends:
        try:
            backend = get_backend(name)
            backend.check(SandboxSpec())
            _backends[name] = backend
        except SandboxInfraError as exc:
            _backends[name] = exc
    backend = _backends[name]
    if isinstance(backend, Exception):
        if REQUIRED:
            pytest.fail(f"{name} backend required (REQUIRE_DOCKER=1) but unavailable: {backend}")
        pytest.skip(f"{name} backend unavailable: {backend}")
    return backend


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request):
    return backend_or_skip(request.param)


@pytest.fixture
def sandbox(backend):
    with backend.create(SandboxSpec(timeout_s=30)) as sb:
        yield sb
