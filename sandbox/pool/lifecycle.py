"""The life of one pooled sandbox: made with a snapshot and a fingerprint, reset and probed, destroyed.

Creating a sandbox costs ~45 ms (bwrap) to ~250 ms (Docker); restoring one to
the state it was created in costs ~2 ms. So the pool snapshots each sandbox's
writable directories at creation and, between leases, restores that snapshot
(every process killed, workspace, /tmp and /dev/shm put back) and runs a
hygiene probe: the writable places must list exactly as they did at creation
and no process may be left. A sandbox that fails either is destroyed.

These calls talk to the sandbox's daemon or agent, so the pool makes them
without holding its lock (see :mod:`sandbox.pool.state`).
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

from sandbox.backends.base import Sandbox
from sandbox.errors import SandboxError
from sandbox.pool.hosts import Host
from sandbox.pool.metrics import Counters, UtilisationMeter
from sandbox.pool.state import Entry
from sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)


class Lifecycle:
    """Makes, resets and destroys the pool's sandboxes, and counts each in the pool's metrics.

    Args:
      probe: run the hygiene probe after every reset (``PoolConfig.probe``).
      meter: the pool's utilisation meter (``held`` changes here; ``busy`` with leases).
      counters: the pool's counters (``created``, ``destroyed``, ``resets``, ...).
    """

    def __init__(self, *, probe: bool, meter: UtilisationMeter, counters: Counters):
        self._probe = probe
        self._meter = meter
        self._counters = counters
        self._made: weakref.WeakSet[Sandbox] = weakref.WeakSet()  # every sandbox it ever created

    def create(self, host: Host, spec: SandboxSpec, key: tuple) -> Entry:
        """A new sandbox of ``spec`` on ``host``, with its snapshot and fingerprint taken."""
        sandbox = host.backend.create(spec)
        try:
            clean = sandbox.snapshot()
            fingerprint = hygiene_fingerprint(sandbox) if self._probe else ""
        except BaseException:
            sandbox.close()
            raise
        self._made.add(sandbox)
        self._meter.change(held=1)
        self._counters.add("created")
        return Entry(sandbox, host, key, spec, clean, fingerprint, last_used=time.monotonic())

    def reset(self, entry: Entry) -> bool:
        """Restores the sandbox as it was created; False (destroy it) if that failed or it is not clean."""
        try:
            entry.sandbox.restore(entry.clean)
            self._counters.add("resets")
            problem = check_clean(entry.sandbox, entry.fingerprint) if self._probe else None
        except SandboxError as exc:
            self._counters.add("reset_failures")
            log.info("reset of %s failed (%s); destroying it", entry.sandbox.id, exc)
            return False
        if problem:
            self._counters.add("probe_failures")
            log.warning("sandbox %s not clean after reset (%s); destroying it", entry.sandbox.id, problem)
        return problem is None

    def destroy(self, entry: Entry) -> None:
        entry.sandbox.close()
        self._meter.change(held=-1)
        self._counters.add("destroyed")

    def made(self, sandbox: Sandbox) -> bool:
        """Whether this pool created ``sandbox`` (a second release of it is then not a caller bug)."""
        return sandbox in self._made


def hygiene_fingerprint(sandbox: Sandbox) -> str:
    """What the writable places hold: one line per entry (path, kind, size, mode, owner) and per IPC object.

    Taken when a sandbox is created and compared after every reset. The agent
    lists every directory a command can write (workspace, /tmp, /dev/shm,
    /dev/mqueue) and the System V IPC namespace itself (:meth:`Sandbox.probe`):
    one round trip, no process spawned. The environment needs no check: each
    exec starts from the agent's pristine copy, so nothing a job exported can persist.
    """
    return _listing(sandbox.probe())


def check_clean(sandbox: Sandbox, expected: str) -> str | None:
    """None if the sandbox looks as it did when created, else what is wrong (after a reset)."""
    seen = sandbox.probe()
    if seen["processes"]:
        return f"{seen['processes']} processes survived the reset"
    listing = _listing(seen)
    if listing != expected:
        extra = sorted(set(listing.splitlines()) ^ set(expected.splitlines()))[:5]
        return f"writable places differ from a fresh sandbox: {extra}"
    return None


def _listing(seen: dict[str, Any]) -> str:
    lines = [" ".join(str(x) for x in entry) for entry in seen["entries"]]
    lines += ["ipc " + " ".join(str(x) for x in obj) for obj in seen.get("ipc", ())]
    lines += [" ".join(str(x) for x in root) for root in seen.get("roots", ())]
    return "\n".join(lines) + ("\n(truncated)" if seen["truncated"] else "")
