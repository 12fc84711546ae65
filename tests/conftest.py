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
import json
import os
import signal
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


# -- the developer's loop ------------------------------------------------------------------------
# `slow` marks the tests over ~20 s by hand. The fast loop (`make test-fast`, `pytest --fast`) also
# leaves out every test whose last recorded time (tests/durations.json, summed over setup, call and
# teardown) is over FAST_LIMIT_S: the many tests between that and 20 s are most of the suite's time.
# `make test-durations` records the times afresh from a whole run.
DURATIONS = os.path.join(os.path.dirname(__file__), "durations.json")
FAST_LIMIT_S = 0.5


def pytest_configure(config: pytest.Config) -> None:
    """A suite started in the background by a shell without job control (``pytest ... &`` in a script)
    inherits SIGINT ignored, and so would every process it starts: the tests of what SIGINT does
    would then fail for a reason that is not the code's. Python's own handler puts it back (a
    handler, unlike "ignored", is not inherited across exec: children start with the default)."""
    del config
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true", help="leave out slow tests and those recorded over FAST_LIMIT_S")
    parser.addoption("--record-durations", metavar="FILE", help="write each test's time (setup+call+teardown) here")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--fast"):
        return
    with open(DURATIONS) as f:
        recorded = json.load(f)
    keep, drop = [], []
    for item in items:
        long = item.get_closest_marker("slow") or recorded.get(item.nodeid, 0.0) > FAST_LIMIT_S
        (drop if long else keep).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


_times: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _times[report.nodeid] = _times.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--record-durations")
    if path and _times:
        with open(path, "w") as f:
            json.dump({k: round(v, 2) for k, v in sorted(_times.items())}, f, indent=0, sort_keys=True)
            f.write("\n")
