"""What every rollout does with an episode, whatever moves it: the shared half of lock-step and engine rollouts.

A rollout runner (:class:`RolloutRunner`) decides *when* episodes move: all together, turn by
turn (:class:`rl.rollout.lockstep.Rollout`), or each on its own as its decode and tool calls
finish (:class:`rl.rollout.engine_rollout.EngineRollout`). What happens to one episode is the
same in both and lives here, in :class:`EpisodeDriver`: fresh records seeded by what they
sample, the reset that renders the prompt, each turn's sampling settings and seed, the step
that appends a completion and its observation, and how a batch of episodes ends (timing, the
re-queue of anomalous tasks). A runner holds a driver; nothing is inherited.

The episode contract with the environment: it renders the observation (the rollout only wraps
it in the chat template's turn markers), it owns the token budget (the rollout tells it the
exact context length an observation would make, through ``reset(options={"context_length":
...})``, and the environment ends and verifies the episode at ``max_context``), and its
``Verification`` is the only form a result takes. Environment steps are stateful and not
idempotent, so they are never retried: a failure ends the episode as an *anomaly*
(``verification.anomaly`` set), which the caller drops from its group and re-queues.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

from envs import MIN_TURNS, AgentEnv, Task, Verification, env_for_domain
from rl.config.schema import need_field, setting, validate
from rl.generation.sampler import Completion, SamplingParams
from rl.generation.tokenizer import Tokenizer
from rl.rollout.trajectory import DECODINGS, EpisodeRecord

log = logging.getLogger(__name__)
# The fewest turns an environment accepts (``AgentEnv(max_turns=)``: a tool call, then its answer).
ENV_MIN_TURNS = MIN_TURNS  # what an environment accepts: checked with the rest of the settings


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How episodes are sampled. Validated on construction (errors name the field).

    Attributes:
      group_size: episodes per task (GRPO's group); >= 2 for training.
      max_turns: assistant turns per episode before it is truncated (>= :data:`ENV_MIN_TURNS`).
      max_new_tokens: per assistant turn.
      max_context: prompt + every turn + every observation, in tokens.
      temperature / top_p / top_k: sampling; training uses temperature 1 so the
        sampler's raw log-probs are the behaviour policy's.
      render_tools: list the tools' JSON schemas in the system prompt (tiny models
        trained from scratch do without).
      env_workers: environments stepped at once.
      tool_timeout_s: per tool call.
      env_kwargs: per-domain constructor arguments for the environments
        (e.g. ``{"repair": {"verifier": {"outcome": 1.0, "efficiency": 0.1}}}``).
      engine: episodes move independently on the decode engine, tools through the sandbox
        scheduler (:mod:`rl.rollout.engine_rollout`); False: the lock-step rollout here.
      reproducible: every turn's numbers bit-identical whatever decodes beside it (the engine's
        shapes fixed: ``rl.generation.engine_config.EngineConfig.exact``), so that a resumed run
        repeats the uninterrupted one bit for bit; slower (``docs/benchmarks.md``). Off, a turn's
        log-probs may differ in the last float bits with what shares its engine call.
      step_deadline_s: the most one environment reset or step may take, queueing included, before
        the episode is dropped as an anomaly (engine rollouts).
    """

    group_size: int = setting(8, low=1)
    max_turns: int = setting(4, low=ENV_MIN_TURNS, expected=f"an int >= {ENV_MIN_TURNS} (the environments' minimum)")
    max_new_tokens: int = setting(256, low=1)
    max_context: int = 2048
    temperature: float = setting(1.0, low=0)
    top_p: float = setting(1.0, check=lambda v: 0 < v <= 1, expected="a number in (0, 1]")
    top_k: int = setting(0, low=0)
    render_tools: bool = True
    env_workers: int = setting(8, low=1)
    tool_timeout_s: float = setting(30.0, check=lambda v: v > 0, expected="seconds > 0")
    env_kwargs: Mapping[str, Mapping[str, Any]] = setting(factory=dict)
    engine: bool = True
    reproducible: bool = False
    step_deadline_s: float = 600.0

    def __post_init__(self):
        validate(self)
        need_field(self.max_context > self.max_new_tokens, self, "max_context", "an int > max_new_tokens")
        need_field(self.step_deadline_s > self.tool_timeout_s, self, "step_deadline_s", "seconds > tool_timeout_s")


@dataclasses.dataclass
class RolloutResult:
    episodes: list[EpisodeRecord]
    requeue: list[Task]
    timing: dict[str, float]


def episode_seed(run_seed: int, step: int, task_id: str, group: int, index: int, turn: int = 0) -> int:
    """A per-request seed that depends only on *what* is sampled, never on batch order."""
    return zlib.crc32(f"{run_seed}/{step}/{task_id}/{group}/{index}/{turn}".encode()) & 0x7FFFFFFF


class EnvCache:
    """Reusable environment instances per domain (constructing one per episode is wasteful)."""

    def __init__(self, factory: Callable[[str], AgentEnv]):
        self._factory = factory
        self._idle: dict[str, list[AgentEnv]] = {}

    def get(self, domain: str) -> AgentEnv:
        idle = self._idle.get(domain)
        return idle.pop() if idle else self._factory(domain)

    def put(self, env: AgentEnv) -> None:
        self._idle.setdefault(env.domain, []).append(env)

    def close(self) -> None:
        for envs in self._idle.values():
            for env in envs:
                env.close()
        self._idle.clear()


def make_env_factory(
    config: RolloutConfig,
    *,
    sandbox_factory: Callable | None = None,
    sandbox_release: Callable | None = None,
    backend: str = "bwrap",
    example_tasks: Mapping[str, Task],
) -> Callable[[str], AgentEnv]:
    """Builds environments for a domain, wired to the shared sandbox factory."""

    def factory(domain: str) -> AgentEnv:
        cls = env_for_domain(domain)
        kwargs: dict[str, Any] = {
            "tasks": [example_tasks[domain]],  # the real task comes with reset(options=)
            "max_turns": config.max_turns,
            "max_episode_tokens": config.max_context,
            "tool_timeout_s": config.tool_timeout_s,
        }
        if sandbox_factory is not None:
            kwargs.update(sandbox_factory=sandbox_factory, sandbox_release=sandbox_release)
        else:
            kwargs["backend"] = backend
        kwargs.update(config.env_kwargs.get(domain, {}))
        return cls(**kwargs)

    return factory


@dataclasses.dataclass
class RolloutHandle:
    """A rollout started by :meth:`RolloutRunner.start`: done once it has a result or an error."""

    result: RolloutResult | None = None
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def get(self) -> RolloutResult:
        """The result; raises the rollout's error if it failed."""
        if self.error is not None:
            raise self.error
        if self.result is None:
            raise RuntimeError("RolloutHandle.get(): the rollout is still in flight; advance() it first")
        return self.result


class RolloutRunner(Protocol):
    """What the trainer, the phases and the multi-process split need of a rollout."""

    config: RolloutConfig

    def run(self, tasks: Sequence[Task], *, step: int, **kwargs: Any) -> RolloutResult:
        """``group_size`` episodes per task, to the end (arguments: :meth:`EpisodeDriver.new_episodes`'s and
        ``decoding``, ``temperature``, ``weights``)."""
        ...

    def start(self, tasks: Sequence[Task], *, step: int, **kwargs: Any) -> RolloutHandle:
        """Begins a rollout (arguments as :meth:`run`); :meth:`advance` moves it to its end."""
        ...

    def advance(self, timeout: float | None = None) -> None:
        """Moves the rollouts in flight forward (nothing to do where :meth:`start` runs them whole)."""
        ...

    def close(self) -> None: ...


def check_decoding(decoding: str, where: str) -> None:
    if decoding not in DECODINGS:
        raise ValueError(f"{where}(decoding=): expected one of {DECODINGS}, got {decoding!r}")


class EpisodeDriver:
    """One episode's life, shared by every runner: its record, reset, turn settings, steps and end."""

    def __init__(self, tokenizer: Tokenizer, config: RolloutConfig, *, seed: int = 0):
        self.tokenizer, self.config, self.seed = tokenizer, config, seed

    def new_episodes(
        self,
        tasks: Sequence[Task],
        step: int,
        k: int,
        decoding: str,
        policy_version: int | None,
        groups: Collection[int] | None = None,
    ) -> list[EpisodeRecord]:
        """``k`` fresh records per task (of ``groups``, by default all), each seeded by what it
        samples, never by batch order or by which process samples it."""
        version = step - 1 if policy_version is None else policy_version
        chosen = range(len(tasks)) if groups is None else set(groups)
        return [
            EpisodeRecord(
                step,
                task.id,
                task.domain,
                g,
                i,
                episode_seed(self.seed, step, task.id, g, i),
                split=task.split,
                decoding=decoding,
                policy_version=version,
            )
            for g, task in enumerate(tasks)
            if g in chosen
            for i in range(k)
        ]

    @staticmethod
    def finish(
        episodes: list[EpisodeRecord], tasks: Sequence[Task], timing: dict[str, float], t0: float
    ) -> RolloutResult:
        """Per-episode timing, the re-queue, the total: how every rollout ends."""
        for e in episodes:
            e.timing = {"env_s": sum(t.get("env_s", 0.0) for t in e.turns), "turns": float(len(e.turns))}
        timing["total_s"] = time.perf_counter() - t0
        return RolloutResult(episodes, requeue_of(episodes, tasks), timing)

    def reset(self, env: AgentEnv, episode: EpisodeRecord, task: Task, meter: ContextMeter) -> bool:
        try:
            _, info = env.reset(seed=episode.seed, options={"task": task, "context_length": meter})
        except Exception as exc:  # noqa: BLE001 - any reset failure is the environment's, not the policy's
            log.warning("reset of %s failed: %s", task.id, exc)
            episode.verification = anomalous(f"reset_failed:{getattr(exc, 'cause', type(exc).__name__)}")
            episode.end_reason = "reset_failed"
            return False
        tools = info["tools"] if self.config.render_tools else None
        ids = self.tokenizer.encode_messages(info["messages"], tools=tools, add_generation_prompt=True)
        episode.messages = list(info["messages"])
        episode.append(ids, sampled=False)
        episode.prompt_len = len(ids)
        return True

    def turn_request(self, e: EpisodeRecord, temperature: float) -> tuple[SamplingParams, int]:
        """The sampling settings and seed of episode ``e``'s next turn (the seed names the turn, never the batch)."""
        cfg = self.config
        room = cfg.max_context - len(e.token_ids)
        params = SamplingParams(
            temperature=temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            max_new_tokens=max(1, min(cfg.max_new_tokens, room)),
        )
        return params, episode_seed(self.seed, e.step, e.task_id, e.group, e.index, len(e.turns))

    def step(self, env: AgentEnv, episode: EpisodeRecord, meter: ContextMeter, completion: Completion) -> bool:
        """Appends the completion, steps the env, appends its observation; True while the episode goes on."""
        ids = list(completion.token_ids)
        episode.append(ids, sampled=True, logprobs=list(completion.raw_logprobs))
        body = ids[:-1] if ids and completion.finish_reason == "stop" and isinstance(completion.stop, int) else ids
        text = self.tokenizer.decode(body)
        turn: dict[str, Any] = {"completion": text, "finish_reason": completion.finish_reason, "tokens": len(ids)}
        episode.turns.append(turn)
        meter.completion_ids = ids
        t = time.perf_counter()
        try:
            observation, _, terminated, truncated, info = env.step(text)
        except Exception as exc:  # noqa: BLE001 - a crashing environment is an anomaly, not a model failure
            log.exception("env.step failed for %s", episode.task_id)
            episode.verification = anomalous(f"env_error:{type(exc).__name__}")
            episode.end_reason = "env_error"
            return False
        turn["env_s"] = time.perf_counter() - t
        if not info.get("tool_calls"):  # e.g. the corrective message for a reply without a tool call
            turn["observation"] = observation
        if terminated or truncated:
            episode.verification = info.get("verification") or anomalous("no_verification")
            record = info.get("episode", {})
            episode.tool_calls = record.get("tool_calls", [])
            episode.end_reason = record.get("end_reason", "terminated" if terminated else "truncated")
            episode.sandbox = record.get("sandbox", {})
            return False
        episode.append(meter.ids(observation), sampled=False)
        return True


class ContextMeter:
    """The exact length of one episode's context once an observation is appended (the env's budget meter).

    Passed to ``env.reset(options={"context_length": meter})``; the tokens it computes for an
    observation are the ones the rollout then appends, so they are encoded once.
    """

    def __init__(self, tokenizer: Tokenizer, episode: EpisodeRecord):
        self.tokenizer = tokenizer
        self.episode = episode
        self.completion_ids: list[int] = []
        self._cached: tuple[str, list[int]] | None = None

    def ids(self, observation: str) -> list[int]:
        if self._cached is None or self._cached[0] != observation:
            self._cached = (observation, self.tokenizer.encode_observation(self.completion_ids, observation))
        return self._cached[1]

    def __call__(self, observation: str) -> int:
        return len(self.episode.token_ids) + len(self.ids(observation))


def requeue_of(episodes: Sequence[EpisodeRecord], tasks: Sequence[Task]) -> list[Task]:
    """Each task with an anomalous episode, once per group: its environment failed, not the policy."""
    requeue, seen = [], set()
    for e in episodes:
        task = tasks[e.group]
        if e.anomaly and (task.id, e.group) not in seen:
            seen.add((task.id, e.group))
            requeue.append(task)
    return requeue


def anomalous(cause: str) -> dict[str, Any]:
    return Verification.anomalous(cause, verifier="rollout").to_dict()
