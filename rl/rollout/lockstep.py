"""Multi-turn group rollouts in lock step: k episodes per task, sampled together, stepped concurrently.

For a batch of tasks, every episode of every group advances in lock step: all active
episodes' contexts go to the sampler as one batch, then every environment is stepped
concurrently (a thread pool; each env takes its sandbox from the injected factory: in a run,
the warm pool :mod:`rl.run.experiment` builds), and the observation each environment rendered
is appended as tokens. What happens to each episode is :class:`rl.rollout.episode_driver.EpisodeDriver`'s,
the same as on the engine path (:mod:`rl.rollout.engine_rollout`); this runner only decides
when episodes move. It is ``rollout.engine=False``: a bucketed sampler that re-prefills every
context each turn, simpler to step through, and the reference the engine path is measured
against (``benchmarks/rollout_bench.py``).

Trajectories are token-exact (see :mod:`rl.rollout.trajectory`).
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Collection, Sequence
from typing import Any

from envs import Task
from rl.generation.sampler import Completion, Sampler
from rl.generation.tokenizer import Tokenizer
from rl.rollout import episode_driver as ed
from rl.rollout.trajectory import EpisodeRecord


class Rollout:
    """Runs groups of episodes with one sampler and a cache of environments."""

    def __init__(
        self, sampler: Sampler, tokenizer: Tokenizer, config: ed.RolloutConfig, envs: ed.EnvCache, *, seed: int = 0
    ):
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.config = config
        self.envs = envs
        self.seed = seed
        self.driver = ed.EpisodeDriver(tokenizer, config, seed=seed)
        self._pool = cf.ThreadPoolExecutor(config.env_workers, thread_name_prefix="agentrl-env")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.envs.close()

    def _use_weights(self, weights: Any) -> None:
        self.sampler.update_weights(weights if weights is not None else self.sampler.model)

    def run(
        self,
        tasks: Sequence[Task],
        *,
        step: int,
        group_size: int | None = None,
        decoding: str = "sampled",
        temperature: float | None = None,
        weights: Any = None,
        policy_version: int | None = None,
        groups: Collection[int] | None = None,
    ) -> ed.RolloutResult:
        """``group_size`` episodes for each task; greedy decoding (or another temperature) for evaluation.

        ``decoding`` is ``"sampled"`` (at ``temperature``, by default the config's) or ``"greedy"``.
        ``weights``: a parameter state to sample with (an asynchronous run's snapshot of an older
        policy), else the live model. ``policy_version``: recorded in every episode (the learner
        step whose parameters sampled it; by default ``step - 1``, on-policy). ``groups``: run only
        these tasks (indices into ``tasks``), the others' episodes being another process's
        (:mod:`rl.rollout.split`); an episode's group is always its task's index in ``tasks``.
        """
        ed.check_decoding(decoding, "Rollout.run")
        self._use_weights(weights)
        greedy = decoding == "greedy"
        k = group_size or self.config.group_size
        temperature = self.config.temperature if temperature is None else temperature
        t0 = time.perf_counter()
        episodes = self.driver.new_episodes(tasks, step, k, decoding, policy_version, groups)
        envs = [self.envs.get(e.domain) for e in episodes]
        tasks_of = [tasks[e.group] for e in episodes]
        meters = [ed.ContextMeter(self.tokenizer, e) for e in episodes]
        resets = list(self._pool.map(self.driver.reset, envs, episodes, tasks_of, meters))
        timing = {"reset_s": time.perf_counter() - t0, "generate_s": 0.0, "env_s": 0.0}
        active = [i for i, ok in enumerate(resets) if ok]
        turn = 0
        while active:
            t = time.perf_counter()
            completions = self._sample(episodes, active, turn, 0.0 if greedy else temperature)
            timing["generate_s"] += time.perf_counter() - t
            t = time.perf_counter()
            outcomes = list(
                self._pool.map(lambda i, c: self.driver.step(envs[i], episodes[i], meters[i], c), active, completions)
            )
            timing["env_s"] += time.perf_counter() - t
            active = [i for i, still in zip(active, outcomes, strict=True) if still]
            turn += 1
        for env in envs:
            self.envs.put(env)
        return self.driver.finish(episodes, tasks, timing, t0)

    def start(self, tasks: Sequence[Task], **kwargs: Any) -> ed.RolloutHandle:
        """Begins a rollout (arguments as :meth:`run`). Lock-step runs it to the end right here;
        :class:`~rl.rollout.engine_rollout.EngineRollout` returns at once and runs it in :meth:`advance`."""
        return ed.RolloutHandle(result=self.run(tasks, **kwargs))

    def advance(self, timeout: float | None = None) -> None:
        """Moves started rollouts forward; lock-step's are finished by :meth:`start`, so there is nothing to do."""
        del timeout

    def _sample(
        self, episodes: list[EpisodeRecord], active: list[int], turn: int, temperature: float
    ) -> list[Completion]:
        requests = [self.driver.turn_request(episodes[i], temperature) for i in active]
        prompts = [episodes[i].token_ids for i in active]
        return self.sampler.generate(prompts, [p for p, _ in requests], [s for _, s in requests])
