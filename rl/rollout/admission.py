"""Episodes that hold a sandbox start only while the pool has one for them; the rest wait their turn.

A domain with ``hold_sandbox = True`` takes a sandbox at ``reset`` and keeps it until the episode
ends. If a rollout submits every reset at once and ``tasks_per_step x group_size`` exceeds the
pool's capacity, the surplus resets block inside the scheduler's workers waiting for a sandbox,
while the episodes that got one need those same workers for their steps: nothing moves until each
job's deadline makes every episode an anomaly (a silent deadlock that looked like a slow run).

:class:`Admission` counts the holding episodes in flight against ``pool.capacity()`` (read each
time: hosts leave and rejoin) and releases the next waiting episode when one ends. Stateless
domains (``hold_sandbox = False``) lease a sandbox per step through the scheduler and pass freely.
:func:`progress_error` names, before anything starts, the one configuration admission cannot
rescue: a lock-step rollout, which resets every episode before any of them takes a step.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from typing import Any

CAPACITY_FIELD = "config.sandbox.capacity"


class Admission:
    """A gate on episodes that hold a sandbox for their whole life (module docstring).

    ``capacity``: how many sandboxes may be leased at once now (the pool's ``capacity``).
    Single-threaded by design: the rollout's driver admits and ends episodes on one thread.
    """

    def __init__(self, capacity: Callable[[], int]):
        self._capacity = capacity
        self._waiting: collections.deque[tuple[Any, Callable[[], None]]] = collections.deque()
        self.holding = 0

    def offer(self, key: Any, holds: bool, start: Callable[[], None]) -> None:
        """Starts ``start`` now if it holds no sandbox or one is free; else queues it (first come, first served)."""
        if not holds:
            start()
            return
        self._waiting.append((key, start))
        self._admit()

    def ended(self, holds: bool) -> None:
        """An admitted episode ended (its sandbox is back in the pool): the next one in line may start."""
        if holds:
            self.holding = max(0, self.holding - 1)
            self._admit()

    def drop(self, keep: Callable[[Any], bool]) -> None:
        """Forgets the waiting episodes whose key ``keep`` rejects (their rollout failed)."""
        self._waiting = collections.deque(item for item in self._waiting if keep(item[0]))

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _admit(self) -> None:
        # At least one: with no healthy host the episode starts and fails as an infrastructure anomaly
        # (host_unavailable) instead of waiting forever.
        while self._waiting and self.holding < max(1, self._capacity()):
            _, start = self._waiting.popleft()
            self.holding += 1
            start()


def progress_error(*, lock_step: bool, holding_domains: Iterable[str], episodes: int, capacity: int) -> str | None:
    """Why a run cannot make progress (one line, naming ``config.sandbox.capacity``), or None."""
    holding = sorted(holding_domains)
    if lock_step and holding and episodes > capacity:
        return (
            f"{CAPACITY_FIELD}={capacity} is below the {episodes} episodes a step starts at once "
            f"(loop.tasks_per_step x rollout.group_size), and domain(s) {', '.join(holding)} hold a sandbox "
            f"per episode: the lock-step rollout (rollout.engine=False) would wait forever; raise "
            f"{CAPACITY_FIELD} to >= {episodes}, lower the episodes, or set rollout.engine=True (which queues them)"
        )
    return None
