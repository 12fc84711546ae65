"""Measurements of the scheduler and the warm pool: latency percentiles, utilisation, throughput.

Everything here is cheap enough to update on every job (a lock, an append, an
addition) and is read as a flat snapshot dict with namespaced keys
(``sandbox/queue_wait_p50_s``) so the RL loop's metrics writer can log it as is.
Empty distributions report 0.0 next to a ``*_count`` of 0 rather than NaN:
the loop's writer fails fast on NaN, and "no samples yet" is not an error.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterable


class Reservoir:
    """The most recent ``size`` samples of a quantity; percentiles over them.

    A sliding window rather than all history: a run's p99 should describe the
    last few thousand jobs, not be pinned by a slow start an hour ago.
    """

    def __init__(self, size: int = 8192):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"Reservoir(size=): expected an int >= 1, got {size!r}")
        self._values: collections.deque[float] = collections.deque(maxlen=size)
        self._lock = threading.Lock()
        self.total = 0  # samples ever added, not only those still in the window

    def add(self, value: float) -> None:
        with self._lock:
            self._values.append(float(value))
            self.total += 1

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self.total = 0

    def percentiles(self, qs: Iterable[float]) -> list[float]:
        """Nearest-rank percentiles (``q`` in [0, 1]); 0.0 for each when there are no samples."""
        with self._lock:
            values = sorted(self._values)
        if not values:
            return [0.0 for _ in qs]
        last = len(values) - 1
        return [values[min(last, max(0, round(q * last)))] for q in qs]


class UtilisationMeter:
    """Integrates how many sandboxes are held and how many are busy over time.

    ``held`` counts sandboxes that exist (idle, leased, or being reset); ``busy``
    counts those leased to a job. Utilisation is busy-seconds over held-seconds
    since the window started: the fraction of paid-for sandbox time that ran
    jobs. Integrating at each change is exact, unlike sampling, and costs O(1).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._held = 0
        self._busy = 0
        self._last = time.monotonic()
        self._held_s = 0.0
        self._busy_s = 0.0

    def _advance(self, now: float) -> None:
        dt = now - self._last
        self._held_s += self._held * dt
        self._busy_s += self._busy * dt
        self._last = now

    def change(self, *, held: int = 0, busy: int = 0) -> None:
        with self._lock:
            self._advance(time.monotonic())
            self._held += held
            self._busy += busy

    def reset_window(self) -> None:
        """Starts a new measurement window (e.g. at the start of a batch whose utilisation matters)."""
        with self._lock:
            now = time.monotonic()
            self._advance(now)
            self._held_s = self._busy_s = 0.0

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            self._advance(time.monotonic())
            held_s, busy_s, held, busy = self._held_s, self._busy_s, self._held, self._busy
        return {
            "held": float(held),
            "busy": float(busy),
            "held_s": held_s,
            "busy_s": busy_s,
            "utilisation": busy_s / held_s if held_s > 0 else 0.0,
        }


class Counters:
    """Named monotonically increasing counts, thread-safe."""

    def __init__(self, names: Iterable[str] = ()):
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(names, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def clear(self) -> None:
        with self._lock:
            for name in self._counts:
                self._counts[name] = 0


def percentile_keys(prefix: str, reservoir: Reservoir) -> dict[str, float]:
    """``{prefix_p50_s, prefix_p99_s, prefix_count}`` of a reservoir of seconds."""
    p50, p99 = reservoir.percentiles((0.5, 0.99))
    return {f"{prefix}_p50_s": p50, f"{prefix}_p99_s": p99, f"{prefix}_count": float(reservoir.total)}


def format_line(m: dict[str, float], prefix: str = "sandbox") -> str:
    """One human-readable progress line from a scheduler snapshot (see :meth:`Scheduler.metrics`)."""

    def g(key: str) -> float:
        return m.get(f"{prefix}/{key}", 0.0)

    pending = g("queued") + g("running")
    rate = g("jobs_per_s")
    eta = f"{pending / rate:.0f}s" if rate > 0 and pending else "-"
    return (
        f"{prefix}: done {g('done'):.0f} (ok {g('ok'):.0f}, error {g('errors'):.0f}, timeout {g('timeouts'):.0f}, "
        f"anomaly {g('anomalies'):.0f}, cancelled {g('cancelled'):.0f}) | queued {g('queued'):.0f} "
        f"running {g('running'):.0f} retried {g('retried'):.0f} | wait p50/p99 {g('queue_wait_p50_s'):.3f}/"
        f"{g('queue_wait_p99_s'):.3f}s run p50/p99 {g('run_p50_s'):.3f}/{g('run_p99_s'):.3f}s | "
        f"util {100 * g('utilisation'):.0f}% | {rate:.1f} jobs/s | ETA {eta}"
    )
