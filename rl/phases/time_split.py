"""Where an RL step's wall time goes: decode, tools, verification, learner update and waiting.

A rollout's own timings are not wall time: tool and verification jobs run in parallel with each
other and with decoding, so their summed run time can exceed the step's. What costs the step is
the rollout's wall time that was *not* decoding (the driver waited on the environment: a sandbox
to free up, a tool to return, a judge to decide). That share is split between tools and
verification in proportion to the work each did (with the jobs' scheduler queue time as a third,
waiting, share), so the parts add up to the step:

    time/generate_s + time/tools_s + time/verify_s + time/learn_s + time/wait_s  ~=  the RL step

``time/generate_s`` is the decode (the engine's steps, including prefill). ``time/wait_s`` is the
rest: the scheduler's queue, waiting on the asynchronous producer, packing the batch and writing
trajectories. In an asynchronous run the rollout overlaps the previous update, so the rollout
parts may add up to more than the step and ``time/wait_s`` is then what the step still lost.
A held-out evaluation in the same step is ``time/eval_s``, outside the split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The parts, in the order a reader wants them; they add up to the RL step (see the module docstring).
SPLIT = ("time/generate_s", "time/tools_s", "time/verify_s", "time/learn_s", "time/wait_s")


def rollout_split(timing: Mapping[str, float], episodes: Sequence[Any]) -> dict[str, float]:
    """The rollout's non-decode wall time as ``time/tools_s`` and ``time/verify_s``.

    Args:
      timing: a ``RolloutResult.timing`` (``total_s``, ``generate_s``, ``env_s``, ``reset_s``, and
        the engine rollout's ``job_queue_wait_s`` when there is one).
      episodes: the rollout's episodes; each verification's ``duration_s`` is the judge's time, which
        ran inside the episode's last environment step.
    """
    verify = sum(float((e.verification or {}).get("duration_s", 0.0)) for e in episodes)
    tools = max(0.0, timing["env_s"] + timing["reset_s"] - verify)  # resets (sandbox setup) count as tools
    queued = timing.get("job_queue_wait_s", 0.0)
    waited = max(0.0, timing["total_s"] - timing["generate_s"])
    work = tools + verify + queued
    share = waited / work if work > 0 else 0.0
    return {"time/tools_s": tools * share, "time/verify_s": verify * share}


def wait_s(metrics: Mapping[str, float], step_s: float) -> float:
    """What ``step_s`` spent outside the other parts of :data:`SPLIT` (never negative)."""
    return max(0.0, step_s - sum(metrics.get(k, 0.0) for k in SPLIT if k != "time/wait_s"))
