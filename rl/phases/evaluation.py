"""Held-out evaluation: greedy pass rate, and pass@1 / pass@k from ``k`` samples per task.

Greedy episodes also report their tool use (:func:`tool_use_metrics`): calls per episode by tool
name, and, with ``eval.check_tool`` and ``eval.edit_tools``, the workflow an agentic task rewards:
the share of passing episodes that checked their work again after editing.

One :class:`Evaluator` serves both the training loop (before training, at the
end of SFT, every ``eval.every`` RL steps, at the end) and ``python -m
rl.evaluate`` on a saved checkpoint, which may ask for more tasks or another
``k`` than the run used. It needs only a rollout and the evaluation settings,
never the trainer. The held-out tasks are the same on every call: a fixed-seed
choice from each pool, in proportion to the pools' weights.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping, Sequence

import numpy as np

from envs import Task
from rl.config.sections import EvalSettings, PoolSettings
from rl.rollout import trajectory
from rl.rollout.episode_driver import RolloutRunner
from rl.rollout.episodes import pass_at_k, rollout_metrics
from rl.rollout.task_stream import TaskCatalog
from rl.rollout.trajectory import EpisodeRecord

_TASK_CHOICE_SEED = 7  # the held-out tasks of a run never depend on its seed


def held_out_tasks(settings: EvalSettings, catalog: TaskCatalog) -> list[Task]:
    """About ``eval.num_tasks`` tasks over the eval pools by weight (at least one per pool), in pool order."""
    return fixed_choice(settings.pools, int(settings.num_tasks), catalog)


def fixed_choice(pools: Mapping[str, PoolSettings], num_tasks: int, catalog: TaskCatalog) -> list[Task]:
    """About ``num_tasks`` tasks over ``pools`` by weight (at least one per pool), in pool order; the
    same on every call, whatever the run's seed."""
    if not pools:
        return []
    total_weight = sum(float(p.weight) for p in pools.values())
    out: list[Task] = []
    for _, pool in sorted(pools.items()):
        tasks = list(catalog.pool(pool))
        n = max(1, round(num_tasks * float(pool.weight) / total_weight))
        order = np.random.default_rng(_TASK_CHOICE_SEED).permutation(len(tasks))[:n]
        out += [tasks[i] for i in sorted(order)]
    return out


def tool_use_metrics(
    episodes: Sequence[EpisodeRecord], prefix: str, *, check_tool: str = "", edit_tools: Sequence[str] = ()
) -> dict[str, float]:
    """Tool calls per episode by name (``<prefix>/tool_calls/<name>_mean``), the passing episodes' mean
    (``<prefix>/passing_tool_calls_mean``) and, with a ``check_tool``, the share of passing episodes that
    called it after one of ``edit_tools`` (``<prefix>/passing_rechecked``): an episode that submits its
    first edit unchecked passes only by luck, one that re-runs the check can see its edit fail and retry.
    Counted from the episodes' recorded tool calls, so it holds for any domain's tools."""
    valid = [e for e in episodes if e.anomaly is None]
    if not valid:
        return {}
    # A call with no tool name (malformed) counts as "invalid", as the episode's messages name it.
    names = [[str(c.get("name") or "invalid") for c in e.tool_calls] for e in valid]
    counts = collections.Counter(name for calls in names for name in calls)
    out = {f"{prefix}/tool_calls/{name}_mean": n / len(valid) for name, n in sorted(counts.items())}
    passing = [calls for e, calls in zip(valid, names, strict=True) if e.passed]
    if passing:
        out[f"{prefix}/passing_tool_calls_mean"] = float(np.mean([len(calls) for calls in passing]))
        if check_tool:
            out[f"{prefix}/passing_rechecked"] = float(
                np.mean([_rechecked(calls, check_tool, edit_tools) for calls in passing])
            )
    return out


def _rechecked(calls: Sequence[str], check_tool: str, edit_tools: Sequence[str]) -> bool:
    edits = [i for i, name in enumerate(calls) if name in edit_tools]
    return bool(edits) and check_tool in calls[edits[0] + 1 :]


class Evaluator:
    """Evaluates the rollout's current policy on fixed held-out tasks.

    Args:
      rollout: runs the episodes (its sampler holds the policy being evaluated).
      settings: ``k`` and the sampling temperature for pass@k.
      tasks: the held-out tasks (:func:`held_out_tasks`).
      write: write the episodes (False on every process of a job but the main one).
    """

    def __init__(self, rollout: RolloutRunner, settings: EvalSettings, tasks: Sequence[Task], *, write: bool = True):
        self.rollout, self.settings, self.tasks, self.write = rollout, settings, list(tasks), write

    def evaluate(self, step: int, workdir: str | os.PathLike) -> dict[str, float]:
        """Greedy and (with ``k > 0``) sampled episodes of every task; ``eval/...`` metrics.

        The evaluated episodes go to ``<workdir>/trajectories/eval/`` (``write``), greedy ones first.
        """
        greedy = self.rollout.run(self.tasks, step=step, group_size=1, decoding="greedy")
        out = {
            k.replace("eval_greedy/pass_rate", "eval/greedy_pass_rate"): v
            for k, v in rollout_metrics(greedy.episodes, "eval_greedy").items()
        }
        s = self.settings
        out.update(tool_use_metrics(greedy.episodes, "eval_greedy", check_tool=s.check_tool, edit_tools=s.edit_tools))
        episodes = greedy.episodes
        k = int(self.settings.k)
        if k > 0:
            temperature = float(self.settings.temperature)
            sampled = self.rollout.run(self.tasks, step=step, group_size=k, temperature=temperature)
            out.update({f"eval/{name}": v for name, v in pass_at_k(sampled.episodes).items()})
            out["eval/sampled_anomaly_rate"] = rollout_metrics(sampled.episodes)["rollout/anomaly_rate"]
            episodes = episodes + sampled.episodes
        if self.write:
            trajectory.write_step(workdir, step, episodes, kind="eval", tasks=self.tasks)
        return out
