"""What the warm pool holds: every sandbox it owns, which are leased and which idle, under one lock.

The pool (:mod:`sandbox.pool.warm_pool`) and its upkeep (:mod:`sandbox.pool.upkeep`)
change this bookkeeping from many threads — leases, releases, the maintenance
pass, sandboxes made in the background. Both do it only through
:class:`PoolState`'s methods, so neither needs the other's internals, and the
rules of the bookkeeping (an idle sandbox sits on one host's idle list; a
leased one is counted on its host) live in one place.

Every method expects the caller to hold :attr:`PoolState.lock`: a lease is
several of these steps that must happen together (a placement decision, an
idle list, a host's counters). None of them talks to a daemon; making,
resetting and destroying sandboxes (:mod:`sandbox.pool.lifecycle`) happen
outside the lock, so a slow daemon never stalls a lease on a healthy host. The
hosts' mutable counters (``leased``, ``resetting``, ``warming``, ``idle``) are
guarded by the same lock.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from sandbox.backends.base import Sandbox, Snapshot
from sandbox.pool.hosts import Host
from sandbox.spec import SandboxSpec


@dataclasses.dataclass(eq=False)
class Entry:
    """One sandbox of the pool, where it runs, and what resetting it needs."""

    sandbox: Sandbox
    host: Host
    key: tuple  # spec_key(spec)
    spec: SandboxSpec
    clean: Snapshot  # the writable directories at creation: what a reset restores
    fingerprint: str  # the hygiene listing at creation: what the probe after a reset compares with
    last_used: float
    uses: int = 0


class PoolState:
    """The pool's sandboxes by state (leased, idle per host and spec) and whether the pool is closed.

    Args:
      hosts: the pool's hosts; their idle lists and counters are part of this state.
    """

    def __init__(self, hosts: list[Host]):
        self.hosts = hosts
        self.lock = threading.Lock()
        # Notified whenever a lease may have become possible (a release, a sandbox made, a host back).
        self.cond = threading.Condition(self.lock)
        self.closed = False
        self._entries: dict[str, Entry] = {}  # every sandbox the pool owns, by sandbox id
        self._leased: dict[str, Entry] = {}

    # -- ownership --------------------------------------------------------------
    def add(self, entry: Entry) -> None:
        """The pool owns ``entry`` from now on (it was just made)."""
        self._entries[entry.sandbox.id] = entry

    def forget(self, entry: Entry) -> None:
        """The pool no longer owns ``entry`` (it is being destroyed)."""
        self._entries.pop(entry.sandbox.id, None)

    def entry(self, sandbox_id: str) -> Entry | None:
        return self._entries.get(sandbox_id)

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def count_by_key(self) -> dict[tuple, int]:
        """Sandboxes that exist (leased, idle or resetting), per spec key."""
        counts: dict[tuple, int] = {}
        for entry in self._entries.values():
            counts[entry.key] = counts.get(entry.key, 0) + 1
        return counts

    # -- leases -----------------------------------------------------------------
    def lease(self, entry: Entry) -> None:
        entry.host.leased += 1
        entry.uses += 1
        self._leased[entry.sandbox.id] = entry

    def unlease(self, sandbox_id: str) -> Entry | None:
        """Ends the lease of ``sandbox_id``; None if it is not leased from this pool."""
        entry = self._leased.pop(sandbox_id, None)
        if entry is not None:
            entry.host.leased -= 1
        return entry

    def leased(self) -> list[Entry]:
        return list(self._leased.values())

    def abandoned(self) -> list[Sandbox]:
        """Leased sandboxes their holder closed instead of releasing (their slots are still taken)."""
        return [e.sandbox for e in self._leased.values() if e.sandbox.closed]

    def clear(self) -> list[Entry]:
        """Forgets everything (the pool is closed); returns the entries still leased."""
        stuck = list(self._leased.values())
        self._leased.clear()
        self._entries.clear()
        return stuck

    # -- idle sandboxes -----------------------------------------------------------
    def park(self, entry: Entry, *, fresh: bool = False) -> None:
        """Puts an owned sandbox on its host's idle list.

        One back from a lease goes to the most recently used end (handed out first); a ``fresh``
        one, made ahead of demand, to the least recently used end (shrunk first if never needed).
        """
        idle = entry.host.idle.setdefault(entry.key, [])
        if fresh:
            idle.insert(0, entry)
        else:
            entry.last_used = time.monotonic()
            idle.append(entry)

    def take_idle(self, host: Host, key: tuple) -> Entry | None:
        """The most recently used idle sandbox of ``key`` on ``host`` (so the spare ones age out)."""
        idle = host.idle.get(key)
        return idle.pop() if idle else None

    def evict_lru(self, host: Host, key: tuple) -> Entry | None:
        """Removes and returns the least recently used idle sandbox of another spec on ``host``."""
        others = [(entries[0].last_used, k) for k, entries in host.idle.items() if k != key and entries]
        if not others:
            return None
        victim = host.idle[min(others)[1]].pop(0)
        self.forget(victim)
        return victim

    def drop_idle(self, host: Host) -> list[Entry]:
        """Removes and returns every idle sandbox of ``host`` (it went down, or the pool closes)."""
        dropped = [e for entries in host.idle.values() for e in entries]
        host.idle.clear()
        for entry in dropped:
            self.forget(entry)
        return dropped

    def expire_idle(self, cutoff: float, keep: int, wanted: dict[tuple, int] | None = None) -> list[Entry]:
        """Removes and returns idle sandboxes unused since ``cutoff``, beyond the ``keep`` newest per spec.

        ``wanted``: queued demand per spec key; that many idle sandboxes of a key are kept too,
        or a slow host would destroy a sandbox it is about to be asked for and make it again.
        """
        wanted = wanted or {}
        by_key: dict[tuple, list[Entry]] = {}
        for host in self.hosts:
            for key, entries in host.idle.items():
                by_key.setdefault(key, []).extend(entries)
        victims: list[Entry] = []
        for key, entries in by_key.items():
            entries.sort(key=lambda e: e.last_used, reverse=True)
            victims += [e for e in entries[max(keep, wanted.get(key, 0)) :] if e.last_used < cutoff]
        for entry in victims:
            entry.host.idle[entry.key].remove(entry)
            self.forget(entry)
        return victims

    def idle_by_key(self) -> dict[tuple, int]:
        """Idle sandboxes over all hosts, per spec key."""
        counts: dict[tuple, int] = {}
        for host in self.hosts:
            for key, entries in host.idle.items():
                counts[key] = counts.get(key, 0) + len(entries)
        return counts
