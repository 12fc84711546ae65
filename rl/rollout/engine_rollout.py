"""Episodes that move independently: a decode engine for the turns, the sandbox scheduler for the tools.

:class:`~rl.rollout.lockstep.Rollout` advances every episode in lock step: each turn re-prefills every
context and waits for the slowest decode and the slowest tool call. :class:`EngineRollout` runs the
same episodes (one :class:`~rl.rollout.episode_driver.EpisodeDriver`: same records, same seeds, same
environment contract) as independent state machines::

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
  context (the engine's programs are row-independent), and the records are assembled per episode,
  not in arrival order. Its log-probs too, bit for bit, with ``rollout.reproducible`` (every engine
  shape fixed: :meth:`~rl.generation.engine_config.EngineConfig.exact`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import time
from collections.abc import Collection, Hashable, Sequence
from typing import Any

from envs import AgentEnv, Task
from envs.sandboxes import Job, JobResult, LentSandboxes, Scheduler
from rl.generation.engine import DecodeEngine
from rl.generation.sampler import Completion
from rl.generation.tokenizer import Tokenizer
from rl.rollout.admission import Admission
from rl.rollout.episode_driver import (
    ContextMeter,
    EnvCache,
    EpisodeDriver,
    RolloutConfig,
    RolloutHandle,
    RolloutResult,
    anomalous,
    check_decoding,
)
from rl.rollout.trajectory import EpisodeRecord

log = logging.getLogger(__name__)
#: The engine's counters a rollout reports (``DecodeEngine.stats``): what the engine did while the
#: rollout ran (engine-wide: rollouts that overlap, as asynchronous steps do, each count it).
ENGINE_COUNTERS = (
    "prefill_s",
    "decode_s",
    "prefill_tokens_padded",
    "decode_tokens",
    "decode_tokens_padded",
    "decode_steps",
)


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
    started: bool = False  # admitted: its reset went to the scheduler (rl.rollout.admission)


@dataclasses.dataclass
class _Batch:
    """One started rollout (an RL step's episodes, or an evaluation's) and its bookkeeping."""

    id: int
    tasks: Sequence[Task]
    live: list[_Live]
    temperature: float
    weights: Hashable  # the engine's key for the parameters it decodes with
    handle: RolloutHandle
    t0: float
    remaining: int
    timing: dict[str, float]
    keep: Any = None  # its parameter state, alive while the engine decodes with it
    jobs: list[JobResult] = dataclasses.field(default_factory=list)
    prefill: dict[str, float] = dataclasses.field(
        default_factory=lambda: {"prefill_tokens": 0.0, "prefill_tokens_reused": 0.0}
    )
    engine_at_start: dict[str, float] = dataclasses.field(default_factory=dict)


class EngineRollout:
    """Runs groups of episodes on a :class:`DecodeEngine` and a :class:`Scheduler` (module docstring).

    Several rollouts can be in flight at once (:meth:`start`, :meth:`advance`): an asynchronous
    run starts step ``u + 1``'s episodes, with its own policy version, while step ``u``'s
    stragglers still wait on their tools, and an evaluation can run while both are in flight.

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
        self.driver = EpisodeDriver(tokenizer, config, seed=seed)
        self.model = engine.model
        self._batches: dict[int, _Batch] = {}
        self._ids = itertools.count()
        self._arrived: queue.SimpleQueue[tuple[int, int, str, JobResult]] = queue.SimpleQueue()
        # Episodes that hold a sandbox start only while the pool has one free (no silent deadlock).
        self.admission = Admission(scheduler.pool.capacity)

    def close(self) -> None:
        self.envs.close()

    @property
    def in_flight(self) -> int:
        """Rollouts started and not finished."""
        return len(self._batches)

    def run(self, tasks: Sequence[Task], **kwargs: Any) -> RolloutResult:
        """As :meth:`Rollout.run`; the timing adds ``prefill_tokens``, ``prefill_tokens_reused``, the engine's
        :data:`ENGINE_COUNTERS` over the rollout, and the
        scheduler's ``jobs``, ``job_retries``, ``job_queue_wait_p50_s``, ``job_queue_wait_max_s``, ``job_queue_wait_s``.
        Other rollouts in flight move forward meanwhile."""
        handle = self.start(tasks, **kwargs)
        while not handle.done:
            self.advance()
        return handle.get()

    def start(
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
    ) -> RolloutHandle:
        """Starts a rollout (arguments as :meth:`Rollout.run`) and returns at once: its resets go to
        the scheduler and :meth:`advance` runs it (and every other one in flight) to the end.

        ``weights`` None: the engine's model, read in place (the caller must not update it while
        this rollout is in flight); else a parameter state, decoded next to other rollouts'."""
        check_decoding(decoding, "EngineRollout.start")
        key = None
        if weights is None:
            self.engine.update_weights(self.model)
        else:
            key = ("weights", id(weights))
            if key not in self.engine.weights_keys:
                self.engine.load_weights(key, weights)
        temperature = 0.0 if decoding == "greedy" else self.config.temperature if temperature is None else temperature
        k = group_size or self.config.group_size
        records = self.driver.new_episodes(tasks, step, k, decoding, policy_version, groups)
        batch = _Batch(
            id=next(self._ids),
            tasks=tasks,
            live=[_Live(e, tasks[e.group], self.envs.get(e.domain), ContextMeter(self.tokenizer, e)) for e in records],
            temperature=temperature,
            weights=key,
            handle=RolloutHandle(),
            t0=time.perf_counter(),
            remaining=len(records),
            timing={"generate_s": 0.0, "env_s": 0.0, "reset_s": 0.0},
            keep=weights,
            engine_at_start=self.engine.stats(),
        )
        self._batches[batch.id] = batch
        for n, ep in enumerate(batch.live):
            self.admission.offer((batch.id, n), ep.env.hold_sandbox, lambda b=batch, n=n: self._start_episode(b, n))
        if not batch.live:
            self._complete(batch)
        return batch.handle

    def advance(self, timeout: float | None = None) -> None:
        """One iteration over every rollout in flight: take the tool results that arrived (blocking for one,
        up to ``timeout`` seconds, only when there is nothing to decode), then one engine step.

        An error here (the engine's, or a bug) fails every rollout in flight: their handles carry it.
        """
        try:
            if self.engine.idle:
                try:
                    items = [self._arrived.get(timeout=timeout)]
                except queue.Empty:
                    return
            else:
                items = []
            while not self._arrived.empty():
                items.append(self._arrived.get())
            for batch_id, n, kind, result in items:
                batch = self._batches.get(batch_id)
                if batch is None:  # a failed rollout's late job
                    continue
                batch.jobs.append(result)
                batch.timing["reset_s" if kind == "reset" else "env_s"] += result.run_s
                self._arrive(batch, n, kind, result)
            if not self.engine.idle:
                t = time.perf_counter()
                finished = self.engine.step()
                took = time.perf_counter() - t
                for batch in self._batches.values():  # overlapping rollouts each count the shared time
                    batch.timing["generate_s"] += took
                for (batch_id, n), completion in finished:
                    batch = self._batches[batch_id]
                    self._turn_done(batch, n, batch.live[n], completion)
        except BaseException as exc:
            for batch in list(self._batches.values()):
                self._fail(batch, exc)
            raise

    def _fail(self, batch: _Batch, exc: BaseException) -> None:
        """Drops a rollout whose driver failed: its sequences go, its environments are never reused."""
        self.admission.drop(lambda key: key[0] != batch.id)
        for n, ep in enumerate(batch.live):
            if not ep.done:
                ep.done = ep.tainted = True
                if ep.known:
                    self.engine.release((batch.id, n))
                if ep.started:
                    self.admission.ended(ep.env.hold_sandbox)
        self._batches.pop(batch.id, None)
        self._unload(batch)
        batch.handle.error = exc

    def _unload(self, batch: _Batch) -> None:
        if batch.weights is not None and not any(b.weights == batch.weights for b in self._batches.values()):
            self.engine.unload_weights(batch.weights)

    def _complete(self, batch: _Batch) -> None:
        """Every episode of the rollout ended: environments back, timing, the result."""
        self._batches.pop(batch.id, None)
        self._unload(batch)
        for ep in batch.live:
            if ep.tainted:
                log.warning("not reusing the environment of %s: its job ended without a result", ep.task.id)
            else:
                self.envs.put(ep.env)
        timing = {**batch.timing, **batch.prefill}
        now = self.engine.stats()
        timing.update({k: now[k] - batch.engine_at_start[k] for k in ENGINE_COUNTERS})
        waits = sorted(r.queue_wait_s for r in batch.jobs)
        timing["jobs"] = float(len(batch.jobs))
        timing["job_retries"] = float(sum(max(0, r.attempts - 1) for r in batch.jobs))
        timing["job_queue_wait_p50_s"] = waits[len(waits) // 2] if waits else 0.0
        timing["job_queue_wait_max_s"] = waits[-1] if waits else 0.0
        timing["job_queue_wait_s"] = sum(waits)  # the waiting share of the step's time split (rl.phases.time_split)
        batch.handle.result = self.driver.finish([ep.record for ep in batch.live], batch.tasks, timing, batch.t0)

    # -- jobs ------------------------------------------------------------------------------
    def _start_episode(self, batch: _Batch, n: int) -> None:
        """Admitted: the episode's reset goes to the scheduler."""
        ep = batch.live[n]
        ep.started = True
        reset = lambda _sb: self.driver.reset(ep.env, ep.record, ep.task, ep.meter)  # noqa: E731
        self._submit(batch, n, "reset", ep, reset)

    def _submit(self, batch: _Batch, n: int, kind: str, ep: _Live, fn: Any, spec: Any = None) -> None:
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
        handle.future.add_done_callback(lambda f: self._arrived.put((batch.id, n, kind, f.result())))

    def _turn_done(self, batch: _Batch, n: int, ep: _Live, completion: Completion) -> None:
        """A turn finished decoding: its environment step goes to the scheduler."""
        ep.known = len(ep.record.token_ids) + len(completion.token_ids)
        text = self.tokenizer.decode(completion.token_ids)
        spec = ep.env.step_sandbox(text)

        def step(sandbox: Any) -> bool:
            with self.lender.lend(sandbox):
                return self.driver.step(ep.env, ep.record, ep.meter, completion)

        self._submit(batch, n, "step", ep, step, spec)

    def _arrive(self, batch: _Batch, n: int, kind: str, result: JobResult) -> None:
        """A reset or step job ended: the episode's next turn goes to the engine, or it ends."""
        ep = batch.live[n]
        if result.status != "ok":  # no result: the deadline passed, or the job itself failed
            ep.tainted = True
            cause = result.cause or result.status
            ep.record.verification = anomalous(f"{kind}_{result.status}:{cause}")
            ep.record.end_reason = f"{kind}_{result.status}"
            if result.error:
                log.warning("%s of %s ended %s: %s", kind, ep.task.id, result.status, result.error.splitlines()[-1])
            self._end(batch, n, ep)
        elif not result.value:  # reset failed, or the episode is over (verified, or an anomaly recorded)
            self._end(batch, n, ep)
        else:
            params, seed = self.driver.turn_request(ep.record, batch.temperature)
            new = ep.record.token_ids[ep.known :]
            self.engine.add((batch.id, n), new, params, seed, weights=batch.weights)
            # Only once the engine holds the tokens: if add raised, a first turn's sequence is unknown to the
            # engine and _fail must not release it (a KeyError there would hide add's error, issue 25).
            ep.known = len(ep.record.token_ids)

    def _end(self, batch: _Batch, n: int, ep: _Live) -> None:
        ep.done = True
        if ep.known:  # the engine holds its sequence
            for key, value in self.engine.release((batch.id, n)).items():
                batch.prefill[key] += value
        batch.remaining -= 1
        if batch.remaining == 0:
            self._complete(batch)
        self.admission.ended(ep.env.hold_sandbox)  # after: the next episode may be another rollout's
