"""Episodes that move independently: a decode engine for the turns, the sandbox scheduler for the tools.

:class:`~rl.run.rollout.Rollout` advances every episode in lock step: each turn re-prefills every
context and waits for the slowest decode and the slowest tool call. :class:`EngineRollout` runs the
same episodes (same records, same seeds, same environment contract) as independent state
machines::

    reset job ──> engine.add(prompt) ──> turn done ──> step job ──> engine.add(observation) ──> ...
                                                            └──> episode over: engine.release

- Turns decode in a :class:`~rl.generation.engine.DecodeEngine`: an episode keeps its KV cache
  while its tool runs, so the next turn prefills only the observation; other episodes keep
  decoding meanwhile.
- Every ``env.reset`` and ``env.step`` is a job of the run's :class:`sandbox.Scheduler` (through
  ``envs.sandboxes``): priority (later turns first, so started episodes finish and free their
  slots), a deadline, per-domain caps and metrics. A step that runs tools in a pooled sandbox
  (``env.step_sandbox``) has the scheduler lease it, so a sandbox that fails to start is retried
  elsewhere (infrastructure only); one that fails mid-step ends the episode as an anomaly, as
  environment steps are not idempotent. A job that ends without a result (deadline, timeout)
  makes the episode an anomaly and its environment is never reused.
- Reproducible whatever the tool latencies: a turn's tokens depend only on its seed and its
  context. The engine guarantees it (one attention window, row-independent programs), and the
  records are assembled per episode, not in arrival order.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import time
from collections.abc import Sequence
from typing import Any

from envs import AgentEnv, Task
from envs.sandboxes import Job, JobResult, LentSandboxes, Scheduler
from rl.generation.engine import DecodeEngine
from rl.generation.sampler import Completion
from rl.generation.tokenizer import Tokenizer
from rl.run.rollout import (
    ContextMeter,
    EnvCache,
    Rollout,
    RolloutConfig,
    RolloutResult,
    _anomalous,
)
from rl.run.trajectory import DECODINGS, EpisodeRecord

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Live:
    """One episode in flight."""

    record: EpisodeRecord
    task: Task
    env: AgentEnv
    meter: ContextMeter
    known: int = 0  # tokens of the record the engine already has (prompt, turns, observations)
    done: bool = False
    tainted: bool = False  # its env may still be running in an abandoned job: never reuse it


class EngineRollout(Rollout):
    """Runs groups of episodes on a :class:`DecodeEngine` and a :class:`Scheduler` (module docstring).

    Args:
      engine: decodes the turns (on the policy's mesh).
      tokenizer: as :class:`Rollout`.
      config: as :class:`Rollout`; ``step_deadline_s`` bounds one reset or step job.
      envs: environments, whose ``sandbox_factory`` is ``lender.acquire``.
      scheduler: runs every reset and step.
      lender: lends a step's leased sandbox to its environment.
    """

    def __init__(
        self,
        engine: DecodeEngine,
        tokenizer: Tokenizer,
        config: RolloutConfig,
        envs: EnvCache,
        scheduler: Scheduler,
        lender: LentSandboxes,
        *,
        seed: int = 0,
    ):
        self.engine, self.scheduler, self.lender = engine, scheduler, lender
        self.tokenizer, self.config, self.envs, self.seed = tokenizer, config, envs, seed
        self.model = engine.model

    def close(self) -> None:
        self.envs.close()

    def _use_weights(self, weights: Any) -> None:
        self.engine.update_weights(weights if weights is not None else self.model)

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
    ) -> RolloutResult:
        """As :meth:`Rollout.run`; the timing adds ``prefill_tokens`` and ``prefill_tokens_reused``."""
        if decoding not in DECODINGS:
            raise ValueError(f"EngineRollout.run(decoding=): expected one of {DECODINGS}, got {decoding!r}")
        self._use_weights(weights)
        temperature = 0.0 if decoding == "greedy" else self.config.temperature if temperature is None else temperature
        k = group_size or self.config.group_size
        t0 = time.perf_counter()
        before = self.engine.stats()
        live = [
            _Live(e, tasks[e.group], self.envs.get(e.domain), ContextMeter(self.tokenizer, e))
            for e in self._new_episodes(tasks, step, k, decoding, policy_version)
        ]
        arrived: queue.SimpleQueue[tuple[int, str, JobResult]] = queue.SimpleQueue()
        for n, ep in enumerate(live):
            self._submit(arrived, n, "reset", ep, lambda _sb, ep=ep: self._reset(ep.env, ep.record, ep.task, ep.meter))
        timing = {"generate_s": 0.0, "env_s": 0.0, "reset_s": 0.0}
        remaining = len(live)
        jobs: list[JobResult] = []
        try:
            while remaining:
                # Block for a tool only when there is nothing to decode.
                items = [arrived.get()] if self.engine.idle else []
                while not arrived.empty():
                    items.append(arrived.get())
                for n, kind, result in items:
                    jobs.append(result)
                    timing["reset_s" if kind == "reset" else "env_s"] += result.run_s
                    remaining -= self._arrive(live[n], n, kind, result, temperature)
                if not self.engine.idle:
                    t = time.perf_counter()
                    finished = self.engine.step()
                    timing["generate_s"] += time.perf_counter() - t
                    for n, completion in finished:
                        self._turn_done(arrived, n, live[n], completion)
        finally:
            for n, ep in enumerate(live):
                if not ep.done:  # interrupted: its sequence is dropped; its env may be mid-step
                    self._end(n, ep)
                    ep.tainted = True
        for ep in live:
            if ep.tainted:
                log.warning("not reusing the environment of %s: its job ended without a result", ep.task.id)
            else:
                self.envs.put(ep.env)
        after = self.engine.stats()
        for key in ("prefill_tokens", "prefill_tokens_reused"):
            timing[key] = after[key] - before[key]
        # This rollout's jobs (the scheduler's own metrics window spans whatever ran meanwhile).
        waits = sorted(r.queue_wait_s for r in jobs)
        timing["jobs"] = float(len(jobs))
        timing["job_retries"] = float(sum(max(0, r.attempts - 1) for r in jobs))
        timing["job_queue_wait_p50_s"] = waits[len(waits) // 2] if waits else 0.0
        timing["job_queue_wait_max_s"] = waits[-1] if waits else 0.0
        return self._finish([ep.record for ep in live], tasks, timing, t0)

    # -- jobs ------------------------------------------------------------------------------
    def _submit(self, arrived: queue.SimpleQueue, n: int, kind: str, ep: _Live, fn: Any, spec: Any = None) -> None:
        turn = len(ep.record.turns)
        job = Job(
            fn,
            spec=spec,
            priority=turn,  # later turns first: started episodes finish and free their slots
            deadline_s=self.config.step_deadline_s,
            domain=ep.task.domain,
            metadata={"task_id": ep.task.id, "episode": n, "kind": kind, "turn": turn},
        )
        handle = self.scheduler.submit(job)
        handle.future.add_done_callback(lambda f: arrived.put((n, kind, f.result())))

    def _turn_done(self, arrived: queue.SimpleQueue, n: int, ep: _Live, completion: Completion) -> None:
        """A turn finished decoding: its environment step goes to the scheduler."""
        ep.known = len(ep.record.token_ids) + len(completion.token_ids)
        text = self.tokenizer.decode(completion.token_ids)
        spec = ep.env.step_sandbox(text)

        def step(sandbox: Any) -> bool:
            with self.lender.lend(sandbox):
                return self._step(ep.env, ep.record, ep.meter, completion)

        self._submit(arrived, n, "step", ep, step, spec)

    def _arrive(self, ep: _Live, n: int, kind: str, result: JobResult, temperature: float) -> int:
        """A reset or step job ended: the episode's next turn goes to the engine, or it ends (returns 1)."""
        if result.status != "ok":  # no result: the deadline passed, or the job itself failed
            ep.tainted = True
            cause = result.cause or result.status
            ep.record.verification = _anomalous(f"{kind}_{result.status}:{cause}")
            ep.record.end_reason = f"{kind}_{result.status}"
            if result.error:
                log.warning("%s of %s ended %s: %s", kind, ep.task.id, result.status, result.error.splitlines()[-1])
            return self._end(n, ep)
        if not result.value:  # reset failed, or the episode is over (verified, or an anomaly recorded)
            return self._end(n, ep)
        params, seed = self._turn_request(ep.record, temperature)
        new = ep.record.token_ids[ep.known :]
        ep.known = len(ep.record.token_ids)
        self.engine.add(n, new, params, seed)
        return 0

    def _end(self, n: int, ep: _Live) -> int:
        ep.done = True
        if ep.known:  # the engine holds its sequence
            self.engine.release(n)
        return 1
