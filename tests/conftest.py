"""Test-wide setup: 8 fake CPU devices for sharding tests, set before JAX is imported; and CI's flag.

``REQUIRE_DOCKER=1`` (CI, via ``.ci/run``) means everything ``make test`` installs is there: a backend or
a package that is missing is then a broken install, so the tests that need it fail instead of skipping.
"""

import importlib
import os
from types import ModuleType

import pytest

REQUIRED = os.environ.get("REQUIRE_DOCKER") == "1"

os.environ.setdefault("JAX_PLATFORMS", "cpu")
flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()


def import_or_skip(module: str) -> ModuleType:
    """``pytest.importorskip`` for packages ``make test`` installs: under CI's flag their absence fails."""
    if REQUIRED:
        return importlib.import_module(module)
    return pytest.importorskip(module)
