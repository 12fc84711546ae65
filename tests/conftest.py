"""Test-wide setup, before JAX is imported: 8 fake CPU devices for sharding tests, one persistent
compilation cache for the whole suite, and CI's flag.

The suite trains dozens of tiny runs, each a fresh process compiling the same programs: on 2 cores
compiling is most of a short run's CPU time, so every process (subprocesses inherit the environment)
shares one on-disk XLA cache. A cached executable is the program a fresh compile would give, so
exactness tests compare the same code; eviction is on because its file lock is what makes concurrent
reads and writes of one entry safe.

``REQUIRE_DOCKER=1`` (CI, via ``.ci/run``) means everything ``make test`` installs is there: a backend or
a package that is missing is then a broken install, so the tests that need it fail instead of skipping.
"""

import importlib
import os
import tempfile
from types import ModuleType

import pytest

REQUIRED = os.environ.get("REQUIRE_DOCKER") == "1"

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "agentrl-tests-jax-cache"))
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()


def import_or_skip(module: str) -> ModuleType:
    """``pytest.importorskip`` for packages ``make test`` installs: under CI's flag their absence fails."""
    if REQUIRED:
        return importlib.import_module(module)
    return pytest.importorskip(module)
