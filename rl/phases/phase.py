"""The interface every phase of a run implements, so the trainer loops over phases without naming them.

A run is a sequence of phases over globally numbered steps (SFT ``1..S``, preference
``S+1..S+P``, then RL; or one reward-model phase). Each phase owns its learner, its step, and
its share of a checkpoint; :class:`rl.run.trainer.Trainer` only decides when to evaluate, save
and show progress, the same for all of them. A new phase is a subclass with a ``name`` (its
``config.learners`` entry and the ``phase`` of its metrics) and a :meth:`Phase.step`.

Checkpoints keep the keys each phase wrote before this interface existed (``sft_data``,
``sft_decay_from``, ``preference_data``, ``reward_model_data``, ``tasks``, ``requeue``,
``pending``): :meth:`Phase.state` returns them and :meth:`Phase.load_state` reads them, so a
checkpoint of an older run resumes exactly.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Mapping
from typing import Any


class Phase(abc.ABC):
    """One stage of a run: steps ``first..last``, a learner, and the state a checkpoint keeps.

    Args:
      exp: the run's :class:`rl.run.experiment.Experiment`.
      first, last: the phase's first and last global step numbers.
    """

    name: str = ""  # its learner (settings.learners) and the "phase" of its metrics lines
    eval_label: str | None = None  # the held-out evaluation after its last step is kept as evals[eval_label]
    watch_anomalies: bool = False  # its steps sample episodes: the circuit breaker watches their anomaly rate
    periodic_eval: bool = False  # held-out evaluation every eval.every of its steps (all phases: after the last)

    def __init__(self, exp: Any, first: int, last: int):
        self.exp, self.first, self.last = exp, first, last
        self.learner: Any = None

    def enter(self, step: int) -> None:
        """The phase begins, or a run resumes inside it, at ``step``: a fresh learner of its own."""
        del step
        self.learner = self.exp.learner(self.name)

    @abc.abstractmethod
    def step(self, step: int) -> dict[str, Any]:
        """Trains step ``step``; its metrics (``time/*`` included)."""

    def idle(self, step: int) -> bool:
        """Whether ``step`` has nothing to do (it keeps its number: an SFT warm start that ended early)."""
        del step
        return False

    def state(self, step: int) -> dict[str, Any]:
        """The phase's checkpoint keys (JSON data) beside its learner's state, at step ``step``."""
        del step
        return {}

    def load_state(self, extra: Mapping[str, Any], step: int) -> None:
        """Restores what :meth:`state` saved, from a checkpoint at ``step`` (of this phase or another)."""
        del extra, step

    def evaluated(self, step: int, result: Mapping[str, float], *, more: bool) -> None:
        """The held-out evaluation after the phase's last step (``more``: steps follow); e.g. to warn."""
        del step, result, more

    def busy(self) -> contextlib.AbstractContextManager:
        """Held while the trainer evaluates or saves (a phase that samples in the background pauses)."""
        return contextlib.nullcontext()

    def saved(self, step: int) -> None:
        """Step ``step``'s checkpoint is written (or it was not due): what waited on it may go on."""
        del step

    def close(self) -> None:
        """Stops what the phase runs in the background (nothing, unless it starts something)."""
        return None
