"""RL as a phase: draw tasks, sample their episodes, score them, update the policy.

Each step draws ``loop.tasks_per_step`` tasks (re-queued ones first: their environment failed,
not the policy), samples ``rollout.group_size`` episodes of each, turns rewards into advantages
and trains on them, and writes the step's trajectories. At ``loop.max_staleness=0`` the episodes
are sampled inline, on the trainer's thread, with the live policy; above it a producer thread
(:mod:`rl.rollout.producer`) samples the next steps with older policies while this one trains.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

from envs import Task
from rl.phases.learned_reward import judge_metrics
from rl.phases.phase import Phase
from rl.phases.time_split import rollout_split, wait_s
from rl.rollout import trajectory
from rl.rollout.episode_driver import RolloutResult
from rl.rollout.episodes import assign_advantages, rollout_metrics, train_batch
from rl.rollout.producer import Produced, RolloutProducer
from rl.rollout.task_stream import task_stream

MAX_REQUEUES = 2  # a task whose environment keeps failing is dropped after this many retries


class RLPhase(Phase):
    """``loop.steps`` policy updates on sampled episodes (see the module docstring).

    ``synchronous``: sample each step inline, on this thread, without the producer thread. By
    default, exactly when ``loop.max_staleness=0``: an on-policy run has nothing to overlap, so
    whoever steps through it with a debugger stays on the main thread. (``False`` forces the
    producer: at ``max_staleness=0`` it must equal the inline loop bit for bit, and a test checks it.)
    """

    name = "rl"
    watch_anomalies = True
    periodic_eval = True

    def __init__(self, exp: Any, first: int, last: int, *, synchronous: bool | None = None):
        super().__init__(exp, first, last)
        s = exp.settings
        self.synchronous = s.loop.max_staleness == 0 if synchronous is None else synchronous
        self.tasks = iter(task_stream(s.tasks, exp.catalog, seed=s.seed))
        self.producer: RolloutProducer | None = None
        self.restored_pending: list[Produced] = []
        # Tasks whose environment failed: (task, times re-queued, first step that may draw it).
        self.requeue: list[tuple[Task, int, int]] = []
        self._retries: dict[int, dict[str, int]] = {}  # per step in flight: its re-queued tasks' counts

    def step(self, step: int) -> dict[str, Any]:
        started = time.perf_counter()
        exp, s = self.exp, self.exp.settings
        if self.producer is None and not self.synchronous:
            self._start_producer(step)
        if self.producer is not None:
            produced = self.producer.take(step)
        else:
            tasks = self._draw(step)
            produced = self._finish_step(step, tasks, exp.rollout.run(tasks, step=step, policy_version=step - 1))
        tasks, result = produced.tasks, produced.result
        metrics = rollout_metrics(result.episodes)
        metrics.update(judge_metrics(s, result.episodes))  # a learned reward's mean, and the learned-only flag
        versions = [e.policy_version for e in result.episodes]
        metrics["rollout/staleness"] = float(step - 1 - min(versions)) if versions else 0.0
        metrics.update(
            assign_advantages(
                result.episodes, estimator=s.algorithm.advantage, dynamic_sampling=s.algorithm.dynamic_sampling
            )
        )
        metrics["rollout/requeued"] = float(len(result.requeue))
        batch = train_batch(
            result.episodes,
            pad_id=exp.tokenizer.pad_id,
            batch_multiple=self.learner.batch_multiple,
            max_len=s.loop.max_len,
            pack_sequences=s.loop.pack_sequences,
        )
        t = time.perf_counter()
        if batch is None:
            metrics["train/skipped"] = 1.0
        else:
            for _ in range(s.algorithm.epochs):
                metrics.update(self.learner.train_step(batch))
        learn_s = time.perf_counter() - t
        if exp.is_main:
            trajectory.write_step(exp.workdir, step, result.episodes, tasks=tasks)
        metrics.update(_timing(metrics, result, learn_s))
        # The scheduler's window (queue waits, run times, retries, anomalies by cause) and the pool's.
        metrics.update(
            {k if k.startswith("sandbox/") else f"sandbox/{k}": v for k, v in exp.scheduler.metrics().items()}
        )
        exp.scheduler.reset_metrics()
        metrics["time/wait_s"] = wait_s(metrics, time.perf_counter() - started)
        return metrics

    def _start_producer(self, first: int) -> None:
        self.producer = RolloutProducer(
            self.exp.rollout,
            self._draw,
            self._finish_step,
            self.exp.model,
            staleness=self.exp.settings.loop.max_staleness,
            rl_start=self.first - 1,
            first=first,
            last=self.last,
            restored=self.restored_pending,
            snapshot=self.exp.rollout_weights if self.exp.group.count > 1 else None,
        )
        self.restored_pending = []
        self.producer.start()
        self.producer.publish(first - 1)  # the parameters restored or left by the phases before

    # -- tasks -----------------------------------------------------------------------
    def _draw(self, step: int) -> list[Task]:
        """Step ``step``'s tasks: re-queued ones it may take first (their environment failed), then the stream."""
        n = self.exp.settings.loop.tasks_per_step
        taken = [i for i, entry in enumerate(self.requeue) if entry[2] <= step][:n]
        chosen = [self.requeue[i] for i in taken]
        self.requeue = [entry for i, entry in enumerate(self.requeue) if i not in set(taken)]
        tasks = [t for t, _, _ in chosen]
        self._retries[step] = {t.id: r for t, r, _ in chosen}
        while len(tasks) < n:
            tasks.append(next(self.tasks))
        return tasks

    def _finish_step(self, step: int, tasks: list[Task], result: RolloutResult) -> Produced:
        """Re-queues the tasks whose environment failed (see rl.rollout.producer for when they come back)."""
        retries = self._retries.pop(step, {})
        eligible = step + 1 + self.exp.settings.loop.max_staleness
        for task in result.requeue:
            if retries.get(task.id, 0) < MAX_REQUEUES:
                self.requeue.append((task, retries.get(task.id, 0) + 1, eligible))
        return Produced(step, tasks, result)

    # -- the trainer's hooks -----------------------------------------------------------
    def busy(self) -> contextlib.AbstractContextManager:
        return self.producer.lock if self.producer is not None else contextlib.nullcontext()

    def saved(self, step: int) -> None:
        if self.producer is not None:  # after the checkpoint: see rl.rollout.producer
            self.producer.publish(step)

    def close(self) -> None:
        if self.producer is not None:
            self.producer.stop()

    def state(self, step: int) -> dict[str, Any]:
        # Steps sampled ahead by policies older than this checkpoint's are kept with it, and the
        # data stream's state is the one after them: no later step is drawn before this one is
        # published (see rl.rollout.producer).
        pending = self.producer.pending(step) if self.producer is not None else []
        with self.busy():
            stream = {"tasks": self.tasks.get_state(), "requeue": [[t.to_dict(), r, e] for t, r, e in self.requeue]}
        return {**stream, "pending": [p.to_dict() for p in pending]}

    def load_state(self, extra: Mapping[str, Any], step: int) -> None:
        del step
        if extra.get("tasks") is not None:
            self.tasks.set_state(extra["tasks"])
        self.requeue = [(Task.from_dict(t), r, *(e or [0])) for t, r, *e in extra.get("requeue", [])]
        self.restored_pending = [Produced.from_dict(p) for p in extra.get("pending", [])]


def engine_metrics(timing: Mapping[str, float]) -> dict[str, float]:
    """The engine's share of a rollout: ``time/generate_s`` as prefill and decode (decode takes the
    engine's bookkeeping too, so the two add up to it), prefill tokens computed, reused from the
    episode's cache and padded, decode tokens sampled and padded, and how many slots a decode step
    ran on average."""
    prefill = min(timing.get("prefill_s", 0.0), timing["generate_s"])
    steps = timing.get("decode_steps", 0.0)
    return {
        "time/prefill_s": prefill,
        "time/decode_s": timing["generate_s"] - prefill,
        "rollout/prefill_tokens": timing["prefill_tokens"],
        "rollout/prefill_tokens_reused": timing["prefill_tokens_reused"],
        "rollout/prefill_tokens_padded": timing.get("prefill_tokens_padded", 0.0),
        "rollout/decode_tokens": timing.get("decode_tokens", 0.0),
        "rollout/decode_tokens_padded": timing.get("decode_tokens_padded", 0.0),
        "rollout/active_slots_mean": timing.get("decode_tokens", 0.0) / steps if steps else 0.0,
    }


def _timing(metrics: Mapping[str, Any], result: RolloutResult, learn_s: float) -> dict[str, float]:
    """The step's ``time/*``, throughput, and the engine's KV reuse and scheduler jobs."""
    timing = result.timing
    gen, env = timing["generate_s"], timing["env_s"] + timing["reset_s"]
    out = {
        "time/generate_s": gen,
        "time/env_s": env,
        "time/learn_s": learn_s,
        "perf/sampled_tokens_per_s": metrics["rollout/sampled_tokens"] / max(gen, 1e-9),
        **rollout_split(timing, result.episodes),
    }
    if "prefill_tokens" in timing:  # the engine rollout: KV reuse, what it computed, its scheduler jobs
        out.update(engine_metrics(timing))
        out["sandbox/rollout_jobs"] = timing["jobs"]
        out["sandbox/rollout_job_retries"] = timing["job_retries"]
        out["sandbox/rollout_queue_wait_p50_s"] = timing["job_queue_wait_p50_s"]
        out["sandbox/rollout_queue_wait_max_s"] = timing["job_queue_wait_max_s"]
    return out
