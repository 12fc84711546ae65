"""Asynchronous RL: a thread samples the next RL steps while the learner updates on this one.

Step ``u`` trains on episodes sampled by the policy of step ``version(u) = max(u - 1 - s, S)``
(``s = loop.max_staleness``, ``S`` the last SFT step: RL's first policy). The learner *publishes*
each step's parameters once that step is checkpointed; the producer starts step ``u`` as soon as
``version(u)`` is published, and the learner *takes* step ``u``'s episodes when it gets there. So:

- ``s = 0`` is the synchronous loop: step ``u`` is sampled only after update ``u - 1``, by the
  live model, while the learner waits — the same computations in the same order.
- ``s = 1`` samples step ``u + 1`` while the learner updates on step ``u``. With the decode
  engine, step ``u + 1`` starts the moment ``u - 1`` is published, even while step ``u``'s
  stragglers still wait on their tools: both steps' episodes decode side by side, each with its
  own policy version (:meth:`rl.generation.engine.DecodeEngine.load_weights`), so the slots that
  ``u``'s finished episodes free are filled at once. Tokens and log-probs stay a function of the
  seed and the version (the engine is row-independent), so a run is bit-reproducible for a given
  ``s``, whatever the tool latencies.
- Tasks: step ``u``'s are drawn when it starts; a task re-queued by step ``u`` (its environment
  failed) is eligible from step ``u + 1 + s`` on, the first step that cannot start before ``u``
  has finished, so what a step draws never depends on timing.
- Exact resume: a checkpoint at step ``t`` is written *before* ``t`` is published, so the producer
  has drawn at most step ``t + s``. The checkpoint keeps steps ``t + 1 .. t + s`` (sampled by
  versions older than ``t``, which no checkpoint holds) with the task stream's state after them;
  a resumed run trains on those, and samples ``t + s + 1`` on from the restored parameters.

Evaluation and the producer share one rollout (one engine): :attr:`lock` serialises the threads
that drive it. An evaluation run while steps are in flight drives them too (their episodes keep
moving; their numbers do not depend on it).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from envs import Task
from rl.rollout.episode_driver import RolloutHandle, RolloutResult, RolloutRunner
from rl.rollout.trajectory import EpisodeRecord

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Produced:
    """One RL step's tasks and episodes, sampled ahead of its update (kept in checkpoints while pending)."""

    step: int
    tasks: list[Task]
    result: RolloutResult

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "tasks": [t.to_dict() for t in self.tasks],
            "episodes": [dataclasses.asdict(e) for e in self.result.episodes],
            "requeue": [t.to_dict() for t in self.result.requeue],
            "timing": self.result.timing,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Produced:
        episodes = [EpisodeRecord(**e) for e in data["episodes"]]
        requeue = [Task.from_dict(t) for t in data["requeue"]]
        result = RolloutResult(episodes, requeue, dict(data["timing"]))
        return cls(
            data["step"], [Task.from_dict(t) for t in data["tasks"]], result
        )  # older files' stream_state: unused


class RolloutProducer:
    """Samples RL steps ``first .. last`` ahead of the learner (see the module docstring).

    Args:
      rollout: starts and advances rollouts (:meth:`~rl.rollout.episode_driver.RolloutRunner.start`); an
        :class:`~rl.rollout.engine_rollout.EngineRollout` keeps several steps in flight at once.
      draw: ``draw(step) -> tasks``: the step's tasks (called on the producer's thread, under
        :attr:`lock`, in step order).
      finish: ``finish(step, tasks, result) -> Produced`` (same thread, under :attr:`lock`, in step
        order).
      model: the learner's model; its parameters are copied at each publish when ``staleness > 0``.
      snapshot: ``snapshot()`` gives the parameters to sample with at each publish instead (on the
        publishing thread): a multi-process job's copy on this process's devices
        (:meth:`rl.run.experiment.Experiment.rollout_weights`).
      staleness: ``loop.max_staleness``.
      rl_start: the last SFT step (the version of RL's first policy).
      first, last: the first step to sample and the run's last step.
      restored: steps sampled before a restart (from the checkpoint), consumed first.
    """

    def __init__(
        self,
        rollout: RolloutRunner,
        draw: Callable[[int], list[Task]],
        finish: Callable[[int, list[Task], RolloutResult], Produced],
        model: nnx.Module,
        *,
        staleness: int,
        rl_start: int,
        first: int,
        last: int,
        restored: list[Produced] = (),
        snapshot: Callable[[], Any] | None = None,
    ):
        self._rollout, self._draw, self._finish, self._model = rollout, draw, finish, model
        self._snapshot = snapshot
        self.staleness, self.rl_start, self.last = staleness, rl_start, last
        self.lock = threading.RLock()  # held while driving the rollout: evaluation takes it too
        self._cond = threading.Condition()
        self._ready: dict[int, Produced] = {p.step: p for p in restored}
        self._next = max([first - 1, *self._ready]) + 1
        self._weights: dict[int, Any] = {}
        self._published = -1
        self._error: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="agentrl-producer", daemon=True)

    def version(self, step: int) -> int:
        """The learner step whose parameters sample ``step``."""
        return max(step - 1 - self.staleness, self.rl_start)

    def start(self) -> None:
        self._thread.start()

    def publish(self, step: int) -> None:
        """The parameters after ``step`` (checkpointed) may sample the steps that need them."""
        weights = None
        if self._snapshot is not None:
            weights = self._snapshot()
        elif self.staleness:  # the learner moves on while these sample: a copy
            weights = jax.tree.map(jnp.copy, nnx.state(self._model))
        with self._cond:
            self._weights[step] = weights
            self._published = step
            for old in [v for v in self._weights if v < self.version(self._next)]:
                del self._weights[old]  # rollouts in flight keep their own reference
            self._cond.notify_all()

    def take(self, step: int) -> Produced:
        """Step ``step``'s episodes, waiting for them if need be."""
        with self._cond:
            while step not in self._ready and self._error is None:
                self._cond.wait(0.5)
            if step not in self._ready:
                raise self._error
            return self._ready.pop(step)

    def pending(self, after: int) -> list[Produced]:
        """Steps after ``after`` sampled by versions older than ``after`` (what a checkpoint at
        ``after`` must keep), waiting until they are all sampled. No later step is drawn before
        ``after`` is published, so the data stream is then exactly past these."""
        needed = [u for u in range(after + 1, min(after + self.staleness, self.last) + 1) if self.version(u) < after]
        with self._cond:
            while any(u not in self._ready for u in needed) and self._error is None:
                self._cond.wait(0.5)
            if self._error is not None:
                raise self._error
            return [self._ready[u] for u in needed]

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=10)  # mid-rollout it is a daemon: closing the scheduler ends its jobs

    def _admissible(self) -> list[tuple[int, int, Any]]:
        """Steps whose policy is published and not started yet, in order (``_cond`` held)."""
        out = []
        while self._next <= self.last and self._published >= self.version(self._next):
            version = self.version(self._next)
            out.append((self._next, version, self._weights.get(version)))
            self._next += 1
        return out

    def _loop(self) -> None:
        flying: dict[int, tuple[list[Task], RolloutHandle]] = {}
        try:
            while True:
                with self._cond:
                    admit = self._admissible()
                    while not self._stop and not admit and not flying:
                        if self._next > self.last:
                            return
                        self._cond.wait(0.5)
                        admit = self._admissible()
                    if self._stop:
                        return
                with self.lock:
                    for step, version, weights in admit:
                        tasks = self._draw(step)
                        flying[step] = (tasks, self._rollout.start(tasks, step=step, weights=weights,
                                                                   policy_version=version))  # fmt: skip
                    if any(not handle.done for _, handle in flying.values()):
                        self._rollout.advance(timeout=0.05)  # short: a newly published step starts soon
                    # Finished in step order (an older step's stragglers hold the younger ones back).
                    while flying and flying[min(flying)][1].done:
                        step = min(flying)
                        tasks, handle = flying.pop(step)
                        produced = self._finish(step, tasks, handle.get())
                        with self._cond:
                            self._ready[step] = produced
                            self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - raised again on the learner's thread by take()
            log.debug("producer failed", exc_info=True)
            with self._cond:
                self._error = exc
                self._cond.notify_all()
