"""The training loop: optional SFT warm start, optional preference phase, then RL, with evaluation,
metrics and checkpoints.

Steps are numbered globally: ``1..S`` are SFT steps, ``S+1..S+P`` preference (DPO/SimPO) steps,
then the RL steps, so a checkpoint at any step says exactly where a resumed run picks up (an SFT
phase that a check ends early skips its remaining steps but keeps their numbers: see
:mod:`rl.phases.sft_check`). A step's
metrics line and trajectories are written *before* its checkpoint; on resume,
anything written after the restored step is dropped and redone, so a run killed
with SIGKILL at any point and started again ends with the same parameters and
metrics as one that never stopped.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from envs import Task
from rl.learning.batch import pack
from rl.learning.learner import Learner
from rl.learning.sft import SFTData
from rl.phases.evaluation import Evaluator, held_out_tasks
from rl.phases.learned_reward import judge_metrics
from rl.phases.preference import PreferencePhase
from rl.phases.reward_model import RewardModelPhase
from rl.phases.sft_check import SFTCheck, annealing, check_tasks
from rl.phases.sft_data import load_sft_data
from rl.rollout import trajectory
from rl.rollout.episode_driver import RolloutResult
from rl.rollout.episodes import assign_advantages, rollout_metrics, train_batch
from rl.rollout.producer import Produced, RolloutProducer
from rl.rollout.task_stream import task_stream
from rl.run.console import logs_above_bar
from rl.run.experiment import Experiment
from rl.run.preflight import CircuitBreaker, preflight
from rl.run.time_split import rollout_split, wait_s

log = logging.getLogger(__name__)
MAX_REQUEUES = 2  # a task whose environment keeps failing is dropped after this many retries


class Trainer:
    """Runs one experiment to its last step (see the module docstring)."""

    def __init__(self, exp: Experiment, *, synchronous: bool | None = None):
        """``synchronous``: sample each RL step inline, on this thread, without the producer thread.
        By default, exactly when ``loop.max_staleness=0``: an on-policy run has nothing to overlap, so
        whoever steps through it with a debugger stays on the main thread. (``False`` forces the
        producer: at ``max_staleness=0`` it must equal the inline loop bit for bit, and a test checks it.)"""
        self.exp = exp
        self.synchronous = exp.settings.loop.max_staleness == 0 if synchronous is None else synchronous
        self.producer: RolloutProducer | None = None
        self.restored_pending: list[Produced] = []
        s = exp.settings
        self.sft_steps = s.sft.steps
        self.rl_start = s.rl_start  # the last step before RL
        self.preference = PreferencePhase(exp, s.preference, self.sft_steps + 1) if s.preference.steps else None
        self.reward_model = RewardModelPhase(exp, s.reward_model) if s.reward_model.steps else None
        self.total = s.total_steps
        self.tasks = iter(task_stream(s.tasks, exp.catalog, seed=s.seed)) if s.tasks else None
        self.evaluator = Evaluator(exp.rollout, s.eval, held_out_tasks(s.eval, exp.catalog), write=exp.is_main)
        self.sft_data = None
        if self.sft_steps:
            convs = load_sft_data(s.sft.data, dict(s.sft.options))
            self.sft_data = SFTData(exp.tokenizer, convs, max_len=s.loop.max_len, seed=s.seed)
        self.sft_check = SFTCheck(exp.rollout, s, check_tasks(s, exp.catalog)) if s.sft.check_every else None
        self.sft_decay_from: int | None = None  # the SFT step whose check passed: the decay starts there
        self.learner: Learner | None = None
        self.phase = ""
        # Tasks whose environment failed: (task, times re-queued, first step that may draw it).
        self.requeue: list[tuple[Task, int, int]] = []
        self._retries: dict[int, dict[str, int]] = {}  # per step in flight: its re-queued tasks' counts
        self.evals: dict[str, dict[str, float]] = {}
        self.breaker = CircuitBreaker(s.loop.max_anomaly_rate, s.loop.anomaly_patience)
        self.elapsed_before = 0.0  # run time spent by earlier processes of this run (restored)

    # -- the run -------------------------------------------------------------------
    def run(self) -> dict[str, dict[str, float]]:
        """Runs to the last step; log lines go above the progress bar, never through it."""
        bar = tqdm(total=self.total, desc="agentrl", unit="step", dynamic_ncols=True)
        try:
            with logs_above_bar():
                return self._run(bar)
        finally:
            if self.producer is not None:
                self.producer.stop()
            bar.close()  # before any error is printed: the error gets a line of its own

    def _run(self, bar: tqdm) -> dict[str, dict[str, float]]:
        exp = self.exp
        started = time.perf_counter()
        bar.set_postfix_str("pre-flight: a sandbox and a gold episode per domain", refresh=True)
        checks = preflight(exp)
        start = self.restore()
        bar.update(start)
        if start == 0 and self.evaluator.tasks:
            bar.set_postfix_str(f"evaluating {len(self.evaluator.tasks)} held-out tasks before step 1", refresh=True)
            self.evals["init"] = self._evaluate(0)
            init = {"phase": "init", **self.evals["init"], **{f"time/preflight/{d}": s for d, s in checks.items()}}
            exp.metrics.write(0, init)
        for step in range(start + 1, self.total + 1):
            if self._sft_end() < step < self.sft_steps:
                bar.update(1)  # SFT ended early: nothing to do until its last step evaluates and saves
                continue
            t0 = time.perf_counter()
            metrics: dict[str, Any] = {"phase": self._enter_phase(step)}
            if metrics["phase"] == "rl" and self.producer is None and not self.synchronous:
                self._start_producer(step)
            metrics.update(self._phase_step(metrics["phase"], step))
            if self._eval_due(step) and self.evaluator.tasks:
                bar.set_postfix_str(f"step {step}: evaluating {len(self.evaluator.tasks)} held-out tasks", refresh=True)
                t = time.perf_counter()
                result = self._evaluate(step)
                metrics.update(result, **{"time/eval_s": time.perf_counter() - t})
                if step == self.sft_steps:
                    self.evals["after_sft"] = result
                    _warn_if_nothing_to_learn(result, step, self.total > step)
                if self.preference is not None and step == self.rl_start:
                    self.evals["after_preference"] = result
                self.evals["last"] = result
            metrics["time/step_s"] = time.perf_counter() - t0
            # The run's time, across every process that ran it (a resumed run continues the clock).
            metrics["time/elapsed_s"] = self.elapsed_before + time.perf_counter() - started
            exp.metrics.write(step, metrics)
            if exp.checkpointer.should_save(step, final=step in (self.total, self.sft_steps, self.rl_start)):
                self.save(step, metrics["time/elapsed_s"])
            if self.producer is not None:  # after the checkpoint: see rl.rollout.producer
                self.producer.publish(step)
            bar.set_postfix(_postfix(metrics), refresh=False)  # shown by the update below: this step's status
            bar.update(1)
            if metrics["phase"] == "rl":
                self.breaker.observe(step, metrics, exp.settings.sandbox.backend)
        self.elapsed = self.elapsed_before + time.perf_counter() - started
        return self.evals

    def _evaluate(self, step: int) -> dict[str, float]:
        """Held-out evaluation with the live model; the producer's sampling waits meanwhile (one engine)."""
        lock = self.producer.lock if self.producer is not None else contextlib.nullcontext()
        with lock:
            return self.evaluator.evaluate(step, self.exp.workdir)

    def _start_producer(self, first: int) -> None:
        self.producer = RolloutProducer(
            self.exp.rollout,
            self._draw,
            self._finish_step,
            self.exp.model,
            staleness=self.exp.settings.loop.max_staleness,
            rl_start=self.rl_start,
            first=first,
            last=self.total,
            restored=self.restored_pending,
            snapshot=self.exp.rollout_weights if self.exp.group.count > 1 else None,
        )
        self.restored_pending = []
        self.producer.start()
        self.producer.publish(first - 1)  # the parameters restored or left by SFT

    def _eval_due(self, step: int) -> bool:
        every = self.exp.settings.eval.every
        if step == self.total or (self.sft_steps and step == self.sft_steps):
            return True
        if self.preference is not None and step == self.rl_start:
            return True
        rl_step = step - self.rl_start
        return every > 0 and rl_step > 0 and rl_step % every == 0

    def _sft_end(self) -> int:
        """The last SFT step that trains (``sft.steps`` unless a check started the decay early)."""
        return self.sft_check.end(self.sft_decay_from) if self.sft_check is not None else self.sft_steps

    def _start_decay(self, step: int) -> None:
        """A check passed at ``step``: the same weights and optimizer state go on under a schedule
        whose decay starts here (a learner with that schedule; the state carries over exactly)."""
        self.sft_decay_from = step
        old = self.learner
        config = annealing(self.exp.settings.learners["sft"], step, self.exp.settings.sft.anneal_steps)
        self.learner = self.exp.learner("sft", config=config)
        self.learner.load_state(old.state())

    def _enter_phase(self, step: int) -> str:
        """The phase of ``step``; a new phase gets its own learner (see ``Experiment.learner``)."""
        phase = self.exp.settings.phase_at(step)
        if phase != self.phase:
            self.learner = self.exp.learner(phase)
            self.phase = phase
        return phase

    # -- steps ---------------------------------------------------------------------
    def _phase_step(self, phase: str, step: int) -> dict[str, Any]:
        if phase == "sft":
            if step > self._sft_end():  # the last SFT step of a warm start that ended early
                return {"sft/ended_at": float(self._sft_end())}
            metrics = self.sft_step()
            if self.sft_check is not None and self.sft_decay_from is None and self.sft_check.due(step):
                t = time.perf_counter()
                done, checked = self.sft_check.run(step)
                metrics.update(checked, **{"time/check_s": time.perf_counter() - t})
                if done:
                    self._start_decay(step)
            return metrics
        if phase == "preference":
            return self.preference_step()
        if self.reward_model is not None:  # a reward-model run: Bradley-Terry steps only
            return self.reward_model.step(self.learner, step)
        return self.rl_step(step)

    def preference_step(self) -> dict[str, Any]:
        """One DPO/SimPO step; the phase's first step loads (or mines) its pairs."""
        metrics: dict[str, Any] = {}
        if self.preference.data is None:
            t = time.perf_counter()
            metrics.update(self.preference.prepare())
            metrics["time/mine_s"] = time.perf_counter() - t
        t = time.perf_counter()
        metrics.update(self.preference.step(self.learner))
        metrics["time/learn_s"] = time.perf_counter() - t
        return metrics

    def sft_step(self) -> dict[str, Any]:
        s = self.exp.settings
        seqs, masks = self.sft_data.batch(s.sft.batch_size)
        batch = pack(
            seqs,
            masks,
            [[0.0] * len(seq) for seq in seqs],
            [0.0] * len(seqs),
            pad_id=self.exp.tokenizer.pad_id,
            batch_multiple=self.learner.batch_multiple,
            max_len=s.loop.max_len,
            pack_sequences=s.loop.pack_sequences,
        )
        t = time.perf_counter()
        metrics = {k.replace("train/", "sft/"): v for k, v in self.learner.train_step(batch).items()}
        metrics["time/learn_s"] = time.perf_counter() - t
        return metrics

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

    def _produce(self, step: int) -> Produced:
        """Draws and samples step ``step`` inline with the live model (the synchronous loop)."""
        tasks = self._draw(step)
        return self._finish_step(step, tasks, self.exp.rollout.run(tasks, step=step, policy_version=step - 1))

    def _stream_state(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks.get_state() if self.tasks is not None else None,
            "requeue": [[t.to_dict(), r, e] for t, r, e in self.requeue],
        }

    def rl_step(self, step: int) -> dict[str, Any]:
        started = time.perf_counter()
        exp, s = self.exp, self.exp.settings
        if self.producer is not None:
            produced = self.producer.take(step)
        else:
            produced = self._produce(step)
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
        gen, env = result.timing["generate_s"], result.timing["env_s"] + result.timing["reset_s"]
        metrics.update(
            {
                "time/generate_s": gen,
                "time/env_s": env,
                "time/learn_s": learn_s,
                "perf/sampled_tokens_per_s": metrics["rollout/sampled_tokens"] / max(gen, 1e-9),
                **rollout_split(result.timing, result.episodes),
            }
        )
        timing = result.timing
        if "prefill_tokens" in timing:  # the engine rollout: KV reuse, and its own scheduler jobs
            metrics["rollout/prefill_tokens"] = timing["prefill_tokens"]
            metrics["rollout/prefill_tokens_reused"] = timing["prefill_tokens_reused"]
            metrics["sandbox/rollout_jobs"] = timing["jobs"]
            metrics["sandbox/rollout_job_retries"] = timing["job_retries"]
            metrics["sandbox/rollout_queue_wait_p50_s"] = timing["job_queue_wait_p50_s"]
            metrics["sandbox/rollout_queue_wait_max_s"] = timing["job_queue_wait_max_s"]
        # The scheduler's window (queue waits, run times, retries, anomalies by cause) and the pool's.
        metrics.update(
            {k if k.startswith("sandbox/") else f"sandbox/{k}": v for k, v in exp.scheduler.metrics().items()}
        )
        exp.scheduler.reset_metrics()
        metrics["time/wait_s"] = wait_s(metrics, time.perf_counter() - started)
        return metrics

    # -- checkpoints -----------------------------------------------------------------
    def save(self, step: int, elapsed_s: float) -> None:
        # Steps sampled ahead by policies older than this checkpoint's are kept with it, and the
        # data stream's state is the one after them: no later step is drawn before this one is
        # published (see rl.rollout.producer).
        pending = self.producer.pending(step) if self.producer is not None else []
        with self.producer.lock if self.producer is not None else contextlib.nullcontext():
            stream = self._stream_state()
        extra = {
            "step": step,
            "elapsed_s": elapsed_s,
            "phase": self.phase,
            **stream,
            "pending": [p.to_dict() for p in pending],
            "sft_data": self.sft_data.state() if self.sft_data is not None else None,
            "sft_decay_from": self.sft_decay_from,
            "preference_data": self.preference.state() if self.preference is not None else None,
            "reward_model_data": self.reward_model.state() if self.reward_model is not None else None,
            "evals": self.evals,
        }
        self.exp.checkpointer.save(step, self.learner.state(), _jsonable(extra))

    def restore(self) -> int:
        """Loads the newest complete checkpoint (if any); returns its step (0 for a fresh run)."""
        exp = self.exp
        step = exp.checkpointer.latest_step()
        if step is None:
            exp.metrics.truncate_after(-1)
            if exp.is_main:
                trajectory.truncate_after(exp.workdir, -1)
            return 0
        self._enter_phase(step)
        state, extra = exp.checkpointer.restore(step, self.learner.abstract_state())
        self.learner.load_state(state)
        if self.tasks is not None and extra.get("tasks") is not None:
            self.tasks.set_state(extra["tasks"])
        self.requeue = [(Task.from_dict(t), r, *(e or [0])) for t, r, *e in extra.get("requeue", [])]
        self.restored_pending = [Produced.from_dict(p) for p in extra.get("pending", [])]
        if self.sft_data is not None and extra.get("sft_data"):
            self.sft_data.load_state(extra["sft_data"])
        if self.preference is not None and step < self.rl_start and extra.get("preference_data"):
            self.preference.load_state(extra["preference_data"])
        if self.reward_model is not None and extra.get("reward_model_data"):
            self.reward_model.load_state(extra["reward_model_data"])
        self.evals = extra.get("evals", {})
        if extra.get("sft_decay_from") is not None and self.phase == "sft":
            self._start_decay(int(extra["sft_decay_from"]))  # the learner with the decay that had started
        self.elapsed_before = float(extra.get("elapsed_s", 0.0))
        exp.metrics.truncate_after(step)
        if exp.is_main:
            trajectory.truncate_after(exp.workdir, step)
        log.info("resumed from checkpoint %d (%s phase)", step, self.phase)
        return step


def _warn_if_nothing_to_learn(result: dict[str, float], step: int, more: bool) -> None:
    """A warm start after which no held-out episode passes, greedy or sampled, leaves RL no reward to
    learn from (every group scores 0): say so at once instead of letting the run finish at 0.000."""
    passing = [v for k, v in result.items() if k == "eval/greedy_pass_rate" or k.startswith("eval/pass@")]
    if more and passing and max(passing) == 0.0:
        log.warning(
            "after SFT (step %d) no held-out episode passed, greedy or sampled: RL gets no reward to learn "
            "from. Check sft/loss (did the demonstrations' skill arrive?); more SFT steps or another seed "
            "may be needed.",
            step,
        )


def _postfix(metrics: dict[str, Any]) -> dict[str, str]:
    out = {"phase": metrics.get("phase", "")}
    for key, label in (
        ("rollout/reward_mean", "reward"),
        ("rollout/pass_rate", "pass"),
        ("sft/loss", "sft_loss"),
        ("sft/check_pass_rate", "sft_check"),
        ("dpo/loss", "dpo_loss"),
        ("rm/loss", "rm_loss"),
        ("rm/heldout_accuracy", "rm_heldout_acc"),
        ("eval/greedy_pass_rate", "eval"),
        ("rollout/anomaly_rate", "anomalies"),
        ("time/step_s", "s/step"),
    ):
        if key in metrics:
            out[label] = f"{metrics[key]:.3f}"
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return value
