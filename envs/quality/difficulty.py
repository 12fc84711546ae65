"""Per-task pass rates and a sampler that favours tasks the policy sometimes solves.

A group-relative RL update learns nothing from a task whose k samples all pass
or all fail (every advantage is zero). :class:`PassRateTracker` keeps a running
pass rate per task from verified episodes; :class:`DifficultySampler` draws
tasks with weight ``max(floor, 4 p (1 - p)) ** sharpness``, which is 1 at
p = 0.5 and ``floor`` for tasks that are always or never solved (kept above 0
so they are re-measured as the policy changes). Unseen tasks count as p = 0.5.

Anomalous verifications must not be fed to :meth:`PassRateTracker.update`
(the harness failed; the task's difficulty is unknown): :meth:`observe` skips them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from envs.tasks import Task


@dataclasses.dataclass
class TaskStats:
    attempts: int = 0
    passes: float = 0.0
    ema: float | None = None


class PassRateTracker:
    """Running pass rate per task id: an exponential moving average of recent results.

    Args:
      decay: weight of the old average in each update (0.8 = roughly the last 5 results matter).
      prior: rate reported for tasks never attempted.
    """

    def __init__(self, *, decay: float = 0.8, prior: float = 0.5):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"PassRateTracker(decay=): expected a float in [0, 1), got {decay!r}")
        if not 0.0 <= prior <= 1.0:
            raise ValueError(f"PassRateTracker(prior=): expected a float in [0, 1], got {prior!r}")
        self.decay, self.prior = decay, prior
        self._stats: dict[str, TaskStats] = {}

    def update(self, task_id: str, passed: bool | float) -> None:
        """Records one result (a bool, or a score in [0, 1] for partial credit)."""
        value = float(passed)
        if not 0.0 <= value <= 1.0 or math.isnan(value):
            raise ValueError(f"PassRateTracker.update(passed=): expected a bool or a score in [0, 1], got {passed!r}")
        stats = self._stats.setdefault(task_id, TaskStats())
        stats.attempts += 1
        stats.passes += value
        stats.ema = value if stats.ema is None else self.decay * stats.ema + (1.0 - self.decay) * value

    def observe(self, task_id: str, verification: Mapping[str, Any]) -> bool:
        """Updates from a ``Verification.to_dict()``; returns False (and records nothing) for anomalies."""
        if verification.get("anomaly"):
            return False
        self.update(task_id, bool(verification["passed"]))
        return True

    def rate(self, task_id: str) -> float:
        stats = self._stats.get(task_id)
        return self.prior if stats is None or stats.ema is None else stats.ema

    def attempts(self, task_id: str) -> int:
        stats = self._stats.get(task_id)
        return 0 if stats is None else stats.attempts

    def summary(self, *, low: float = 0.05, high: float = 0.95) -> dict[str, int]:
        """How many tracked tasks are never solved, always solved, or in between."""
        rates = [self.rate(t) for t in self._stats]
        return {
            "tracked": len(rates),
            "never": sum(r <= low for r in rates),
            "always": sum(r >= high for r in rates),
            "informative": sum(low < r < high for r in rates),
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state, to checkpoint with the model."""
        return {
            "decay": self.decay,
            "prior": self.prior,
            "tasks": {k: dataclasses.asdict(v) for k, v in sorted(self._stats.items())},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`state_dict` in place (objects sharing this tracker see the restored rates)."""
        self.decay, self.prior = float(state["decay"]), float(state["prior"])
        self._stats = {k: TaskStats(**v) for k, v in state["tasks"].items()}


class DifficultySampler:
    """Samples tasks with probability proportional to how informative they currently are.

    Args:
      tasks: the pool (a ``TaskSource`` or a list of tasks).
      tracker: the pass rates to weight by (shared with whoever records results).
      floor: minimum weight, so saturated tasks are still revisited.
      sharpness: > 1 concentrates on p near 0.5, < 1 flattens toward uniform.
      seed: seeds the sampler's own generator.
    """

    def __init__(
        self,
        tasks: Sequence[Task],
        tracker: PassRateTracker,
        *,
        floor: float = 0.05,
        sharpness: float = 1.0,
        seed: int = 0,
    ):
        if len(tasks) == 0:
            raise ValueError("DifficultySampler(tasks=): the pool is empty")
        if not 0.0 < floor <= 1.0:
            raise ValueError(f"DifficultySampler(floor=): expected a float in (0, 1], got {floor!r}")
        if not sharpness > 0:
            raise ValueError(f"DifficultySampler(sharpness=): expected > 0, got {sharpness!r}")
        self.tasks = list(tasks)
        self.tracker = tracker
        self.floor, self.sharpness = floor, sharpness
        self.rng = np.random.default_rng(seed)

    def weights(self) -> np.ndarray:
        """Normalised sampling probabilities, aligned with ``self.tasks``."""
        rates = np.array([self.tracker.rate(t.id) for t in self.tasks], dtype=np.float64)
        raw = np.maximum(self.floor, 4.0 * rates * (1.0 - rates)) ** self.sharpness
        return raw / raw.sum()

    def sample(self, n: int) -> list[Task]:
        """``n`` tasks drawn with replacement under the current weights."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"DifficultySampler.sample(n=): expected an int >= 1, got {n!r}")
        indices = self.rng.choice(len(self.tasks), size=n, replace=True, p=self.weights())
        return [self.tasks[i] for i in indices]

    def __iter__(self) -> Iterator[Task]:
        while True:
            yield self.sample(1)[0]

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "tracker": self.tracker.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.tracker.load_state_dict(state["tracker"])
