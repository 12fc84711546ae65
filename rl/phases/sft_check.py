"""Ending the SFT warm start when the skill has arrived, not after a fixed number of steps.

A warm start's job is to make RL's reward reachable: some sampled episodes must pass, or every
GRPO group scores 0 and there is nothing to learn from. When that happens is a lottery over
seeds: on the quickstart the demonstrations' copy skill (expression into the tool call, printed
result into the answer) arrives after a loss plateau lasting ~150 steps on one seed and 400+ on
another. A fixed ``sft.steps`` is either too short for the slow seeds (no reward: the run learns
nothing) or wasted time on the fast ones. So, with ``sft.check_every > 0``, the learning rate
holds its peak (a plateau needs it to be escaped) and every that many SFT steps the policy samples
one episode of each of ``sft.check_tasks`` *training* tasks (real sandboxes, real verifiers,
temperature 1). At the first check whose pass rate reaches ``sft.until_pass_rate`` the rate decays
over ``sft.anneal_steps`` steps and SFT ends: warmup-stable-decay with the decay started by the
check. The decay matters: at the peak rate the skill is there but noisy (on the quickstart ~5% of
sampled episodes pass at the peak against ~45% after the decay). ``sft.steps`` is the cap: with
no passing check the decay starts ``anneal_steps`` before it.

The check tasks come from the training pools, never the eval pools: deciding when to stop on the
held-out tasks would tune the run on its own test set. They are a fixed-seed choice (the same on
every check and every resume), and each check's episodes are seeded by its step, so a resumed
run ends SFT at the same step as one that never stopped.
"""

from __future__ import annotations

import dataclasses
import logging

from envs import Task
from rl.config.sections import Settings
from rl.learning.learner_config import LearnerConfig
from rl.phases.evaluation import fixed_choice
from rl.rollout.episode_driver import RolloutRunner
from rl.rollout.episodes import rollout_metrics
from rl.rollout.task_stream import TaskCatalog

log = logging.getLogger(__name__)


def check_tasks(settings: Settings, catalog: TaskCatalog) -> list[Task]:
    """``sft.check_tasks`` tasks over the training pools by weight, the same on every call."""
    return fixed_choice(settings.tasks, settings.sft.check_tasks, catalog)


class SFTCheck:
    """Decides, every ``sft.check_every`` SFT steps, whether the warm start has done its job.

    Args:
      rollout: samples the check's episodes with the live (SFT) policy.
      settings: the run's settings (``sft.check_every``, ``sft.until_pass_rate``, ``sft.steps``).
      tasks: the check's tasks (:func:`check_tasks`).
    """

    def __init__(self, rollout: RolloutRunner, settings: Settings, tasks: list[Task]):
        if not tasks or settings.sft.check_every < 1:
            raise ValueError("SFTCheck: expected sft.check_every >= 1 and training tasks to check with (config.tasks)")
        self.rollout, self.tasks = rollout, tasks
        sft = settings.sft
        self.every, self.anneal = sft.check_every, sft.anneal_steps
        self.cap, self.threshold = sft.steps, sft.until_pass_rate

    def due(self, step: int) -> bool:
        """Checks fall every ``check_every`` steps, while the decay has not started by the schedule."""
        return step % self.every == 0 and step < self.cap - self.anneal

    def end(self, decay_from: int | None) -> int:
        """The last SFT step that trains: ``anneal_steps`` after the passing check, or the cap."""
        return self.cap if decay_from is None else min(decay_from + self.anneal, self.cap)

    def run(self, step: int) -> tuple[bool, dict[str, float]]:
        """``(done, metrics)``: one sampled episode per task; done when the pass rate reaches the bar."""
        result = self.rollout.run(self.tasks, step=step, group_size=1, temperature=1.0)
        m = rollout_metrics(result.episodes, "check")
        rate = m.get("check/pass_rate", 0.0)
        metrics = {"sft/check_pass_rate": rate, "sft/check_anomaly_rate": m["check/anomaly_rate"]}
        done = rate >= self.threshold
        if done:
            log.info(
                "step %d: %.3f of %d sampled training episodes pass (sft.until_pass_rate %.3f): the learning "
                "rate decays over %d steps and SFT ends at step %d (of at most %d)",
                step, rate, len(self.tasks), self.threshold, self.anneal, self.end(step), self.cap,
            )  # fmt: skip
        return done, metrics


def annealing(config: LearnerConfig, decay_from: int, anneal_steps: int) -> LearnerConfig:
    """The SFT learner's config once a check passed at ``decay_from``: the decay starts there."""
    return dataclasses.replace(config, decay_start=decay_from, total_steps=decay_from + anneal_steps)
