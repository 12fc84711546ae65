"""Fail fast, loudly: before step 1 every domain of the run gets a sandbox and passes one gold episode.

A run whose sandboxes cannot start trains anyway today's way: every tool call is an
anomaly, the episodes that never call a tool carry the run, and it ends "finished" at
0.000 → 0.000. The pre-flight check makes that impossible. For each domain of the
training and evaluation pools, in well under a minute, it

1. leases a sandbox of the domain's spec from the run's warm pool and runs one command;
2. replays one task's gold solution through the domain's real environment and requires
   a verification that passes with no anomaly (the verifier works end to end).

A failure raises :class:`PreflightError` naming the domain, the cause and the fix.
:class:`CircuitBreaker` does the same during the run when anomalies dominate.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Mapping
from typing import Any

from envs import env_for_domain
from envs.quality.validate import play
from envs.sandboxes import SandboxInfraError
from rl.rollout.admission import progress_error
from rl.run.experiment import Experiment, example_tasks

log = logging.getLogger(__name__)
ACQUIRE_TIMEOUT_S = 45.0


class PreflightError(RuntimeError):
    """The run cannot work as configured; the message names the domain, the cause and the fix."""


class RunAborted(RuntimeError):
    """The circuit breaker stopped the run: the environment, not the model, failed too often."""


def setup_fix(backend: str) -> str:
    return "bash scripts/system_setup.sh" + (" --no-docker" if backend == "bwrap" else "")


def explain(exc: BaseException, backend: str) -> str:
    """What an infrastructure error means for a run, and the command that fixes it."""
    text = str(exc)
    if "bubblewrap is not installed" in text:
        return f"bwrap not installed: run `{setup_fix('bwrap')}`"
    if "no Docker daemon answers" in text or "DaemonUnreachable" in type(exc).__name__:
        # The daemon's URL and its error come first: a wrong --docker-url is fixed differently than a stopped dockerd.
        return f"{text}; run `{setup_fix('docker')}` (starts dockerd), or --config.sandbox.backend=bwrap"
    if ("not found" in text and "image" in text) or type(exc).__name__ == "ImageMissing":
        return f"sandbox image missing: run `{setup_fix(backend)}` ({text})"
    return f"{text} (see the README's Troubleshooting; `{setup_fix(backend)}` installs and starts what sandboxes need)"


def preflight(exp: Experiment) -> dict[str, float]:
    """Runs the checks of the module docstring for every domain; returns seconds per domain."""
    settings = exp.settings
    backend = settings.sandbox.backend
    seconds: dict[str, float] = {}
    domains = example_tasks(settings, exp.catalog)
    error = progress_error(
        lock_step=not settings.rollout.engine,
        holding_domains=[d for d in domains if env_for_domain(d).hold_sandbox],
        episodes=settings.loop.tasks_per_step * settings.rollout.group_size,
        capacity=exp.pool.capacity(),
    )
    if error:
        raise PreflightError(error)
    for domain, task in sorted(domains.items()):
        start = time.monotonic()
        env = exp.rollout.envs.get(domain)
        try:
            try:
                sandbox = exp.pool.acquire(env.spec_for_sandbox, timeout=ACQUIRE_TIMEOUT_S)
            except SandboxInfraError as exc:
                raise PreflightError(f"domain {domain!r}: no sandbox could start: {explain(exc, backend)}") from exc
            try:
                result = sandbox.exec("true", timeout=30)
            except SandboxInfraError as exc:
                raise PreflightError(
                    f"domain {domain!r}: a sandbox started but failed: {explain(exc, backend)}"
                ) from exc
            finally:
                exp.pool.release(sandbox)
            if not result.ok:
                raise PreflightError(f"domain {domain!r}: `true` failed in a fresh sandbox: {result.to_dict()}")
            verification = play(env, task, env.gold_actions(task))
        finally:
            exp.rollout.envs.put(env)
        if verification.get("anomaly"):
            raise PreflightError(
                f"domain {domain!r}: the gold solution of {task.id} ended in an anomaly (the environment failed, "
                f"not the model): {verification['anomaly']}. Fix: {explain(Exception(verification['anomaly']), backend)}"
            )
        if not verification.get("passed"):
            raise PreflightError(
                f"domain {domain!r}: the gold solution of {task.id} does not pass its verifier "
                f"(reward {verification.get('reward')}): check the task set with `python -m envs.quality.validate`"
            )
        seconds[domain] = time.monotonic() - start
        log.info("pre-flight: %s ok in %.1fs (%s)", domain, seconds[domain], task.id)
    return seconds


class CircuitBreaker:
    """Stops a run whose steps are mostly anomalies for ``patience`` RL steps in a row."""

    def __init__(self, max_rate: float, patience: int):
        self.max_rate, self.patience = max_rate, patience
        self.streak = 0
        self.causes: collections.Counter[str] = collections.Counter()

    def observe(self, step: int, metrics: Mapping[str, Any], backend: str) -> None:
        """Called with a step's rollout metrics; raises :class:`RunAborted` when the streak reaches ``patience``."""
        rate = float(metrics.get("rollout/anomaly_rate", 0.0))
        if self.max_rate >= 1 or rate <= self.max_rate:
            self.streak, self.causes = 0, collections.Counter()
            return
        self.streak += 1
        prefix = "rollout/anomalies/"
        self.causes.update({k[len(prefix) :]: int(v) for k, v in metrics.items() if k.startswith(prefix) and v})
        if self.streak >= self.patience:
            causes = ", ".join(f"{cause} x{n}" for cause, n in self.causes.most_common(3)) or "unknown"
            raise RunAborted(
                f"step {step}: {rate:.0%} of the episodes were anomalies (the environment failed, not the model) "
                f"for {self.streak} steps in a row, above loop.max_anomaly_rate={self.max_rate:g}; causes: {causes}. "
                f"Fix the environment (the README's Troubleshooting; `{setup_fix(backend)}` installs and starts "
                "what sandboxes need), then start the same command again: it resumes from the last checkpoint."
            )
