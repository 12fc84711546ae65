"""The training loop over a run's phases (optional SFT warm start, optional preference phase, then
RL; or one reward-model phase), with evaluation, metrics and checkpoints.

Steps are numbered globally: ``1..S`` are SFT steps, ``S+1..S+P`` preference (DPO/SimPO) steps,
then the RL steps, so a checkpoint at any step says exactly where a resumed run picks up (an SFT
phase that a check ends early skips its remaining steps but keeps their numbers: see
:mod:`rl.phases.sft_check`). Each phase is a :class:`rl.phases.phase.Phase` (its learner, its
step, its checkpoint keys); the loop here treats them all alike. A step's metrics line and
trajectories are written *before* its checkpoint; on resume, anything written after the
restored step is dropped and redone, so a run killed with SIGKILL at any point and started
again ends with the same parameters and metrics as one that never stopped.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from rl.phases.evaluation import Evaluator, held_out_tasks
from rl.phases.phase import Phase
from rl.phases.preference import PreferencePhase
from rl.phases.reward_model import RewardModelPhase
from rl.phases.rl_phase import RLPhase
from rl.phases.sft import SFTPhase
from rl.rollout import trajectory
from rl.run.console import logs_above_bar
from rl.run.experiment import Experiment
from rl.run.preflight import CircuitBreaker, preflight

log = logging.getLogger(__name__)


def phases_of(exp: Experiment, *, synchronous: bool | None = None) -> list[Phase]:
    """The run's phases in order, each over its steps (``synchronous``: see :class:`RLPhase`)."""
    s = exp.settings
    if s.reward_model.steps:
        return [RewardModelPhase(exp, 1, s.total_steps)]
    phases: list[Phase] = []
    if s.sft.steps:
        phases.append(SFTPhase(exp, 1, s.sft.steps))
    if s.preference.steps:
        phases.append(PreferencePhase(exp, s.sft.steps + 1, s.rl_start))
    if s.loop.steps:
        phases.append(RLPhase(exp, s.rl_start + 1, s.total_steps, synchronous=synchronous))
    return phases


class Trainer:
    """Runs one experiment to its last step (see the module docstring).

    ``synchronous``: sample RL steps inline (default: exactly when ``loop.max_staleness=0``; see :class:`RLPhase`).
    """

    def __init__(self, exp: Experiment, *, synchronous: bool | None = None):
        self.exp = exp
        s = exp.settings
        self.phases = phases_of(exp, synchronous=synchronous)
        self.total = s.total_steps
        self.evaluator = Evaluator(exp.rollout, s.eval, held_out_tasks(s.eval, exp.catalog), write=exp.is_main)
        self.current: Phase | None = None
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
            for phase in self.phases:
                phase.close()
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
            phase = self._enter(step)
            if phase.idle(step):
                bar.update(1)  # e.g. SFT ended early: nothing to do until its last step evaluates and saves
                continue
            t0 = time.perf_counter()
            metrics: dict[str, Any] = {"phase": phase.name, **phase.step(step)}
            if self._eval_due(step, phase) and self.evaluator.tasks:
                bar.set_postfix_str(f"step {step}: evaluating {len(self.evaluator.tasks)} held-out tasks", refresh=True)
                t = time.perf_counter()
                result = self._evaluate(step)
                metrics.update(result, **{"time/eval_s": time.perf_counter() - t})
                if step == phase.last and phase.eval_label:
                    self.evals[phase.eval_label] = result
                    phase.evaluated(step, result, more=self.total > step)
                self.evals["last"] = result
            metrics["time/step_s"] = time.perf_counter() - t0
            # The run's time, across every process that ran it (a resumed run continues the clock).
            metrics["time/elapsed_s"] = self.elapsed_before + time.perf_counter() - started
            exp.metrics.write(step, metrics)
            if exp.checkpointer.should_save(step, final=step == phase.last):
                self.save(step, metrics["time/elapsed_s"])
            phase.saved(step)
            bar.set_postfix(_postfix(metrics), refresh=False)  # shown by the update below: this step's status
            bar.update(1)
            if phase.watch_anomalies:
                self.breaker.observe(step, metrics, exp.settings.sandbox.backend)
        self.elapsed = self.elapsed_before + time.perf_counter() - started
        return self.evals

    def _enter(self, step: int) -> Phase:
        """The phase of ``step``; entering a new one gives it its own learner."""
        phase = next(p for p in self.phases if p.first <= step <= p.last)
        if phase is not self.current:
            phase.enter(step)
            self.current = phase
        return phase

    def _evaluate(self, step: int) -> dict[str, float]:
        """Held-out evaluation with the live model; a phase sampling in the background waits meanwhile."""
        with self.current.busy() if self.current is not None else contextlib.nullcontext():
            return self.evaluator.evaluate(step, self.exp.workdir)

    def _eval_due(self, step: int, phase: Phase) -> bool:
        """At the end of every phase, and every ``eval.every`` steps of a phase that asks for it."""
        every, nth = self.exp.settings.eval.every, step - phase.first + 1
        return step == phase.last or (phase.periodic_eval and every > 0 and nth % every == 0)

    # -- checkpoints -----------------------------------------------------------------
    def save(self, step: int, elapsed_s: float) -> None:
        extra: dict[str, Any] = {"step": step, "elapsed_s": elapsed_s, "phase": self.current.name}
        for phase in self.phases:
            extra.update(phase.state(step))
        extra["evals"] = self.evals
        self.exp.checkpointer.save(step, self.current.learner.state(), _jsonable(extra))

    def restore(self) -> int:
        """Loads the newest complete checkpoint (if any); returns its step (0 for a fresh run)."""
        exp = self.exp
        step = exp.checkpointer.latest_step()
        if step is None:
            exp.metrics.truncate_after(-1)
            if exp.is_main:
                trajectory.truncate_after(exp.workdir, -1)
            return 0
        phase = self._enter(step)
        state, extra = exp.checkpointer.restore(step, phase.learner.abstract_state())
        phase.learner.load_state(state)
        for p in self.phases:
            p.load_state(extra, step)
        self.evals = extra.get("evals", {})
        self.elapsed_before = float(extra.get("elapsed_s", 0.0))
        exp.metrics.truncate_after(step)
        if exp.is_main:
            trajectory.truncate_after(exp.workdir, step)
        log.info("resumed from checkpoint %d (%s phase)", step, self.current.name)
        return step


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
