"""`AgentEnv`: the gymnasium environment every domain subclasses (multi-turn text agent, tools, verifier).

One episode::

    obs, info = env.reset(seed=0)                  # a task drawn with the seed, or options={"task": ...}
    # render info["messages"] (system + user) with info["tools"] through a chat template, sample a reply
    obs, reward, terminated, truncated, info = env.step(reply_text)
    # ... append obs (the tool results, rendered once, here) as the next user turn and sample again,
    # until terminated or truncated; info["new_messages"] has the same results as chat messages
    info["verification"]                           # the verifier's full breakdown, at the last step

The observation is the single rendering of what came back: ``<tool_response>``
blocks (:func:`envs.parsing.tool_response_block`) or the corrective message for a
reply without a tool call. The token budget is the environment's alone: by
default it is estimated from text, and a caller that holds the exact token ids
(the RL rollout) passes ``options={"context_length": fn}`` to ``reset``, where
``fn(observation)`` is the length of its context once ``observation`` is
appended; the episode ends with ``token_budget`` when that reaches
``max_episode_tokens``, and is verified like any other truncated episode.

Actions and observations are text (:class:`envs.spaces.UnicodeText`). Tool
calls are parsed from the reply (:mod:`envs.parsing`); a malformed call comes
back as an observation explaining the mistake. The episode ends with
``terminated`` on ``submit`` (or a reply without a tool call, in domains where
that reply *is* the answer) and ``truncated`` at the turn or token budget, or
when the sandbox machinery fails (then the verification is an anomaly: drop or
retry the sample, never train on it). The reward is 0 until the last step,
where it is the verifier's reward.

A domain sets class attributes (tools, verifier roles, system prompt, default
tasks) and may override the hooks :meth:`setup_sandbox`, :meth:`build_messages`,
:meth:`final_answer`, :meth:`gold_actions`, :meth:`noop_actions`,
:meth:`ungradable`; :func:`register_domain` makes it ``agentrl/<Name>-v0``.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import gymnasium as gym

from envs import anomalies
from envs.episode import Episode, TokenCounter, ToolCallRecord, approx_tokens
from envs.parsing import ParsedAction, ToolCallError, format_tool_call, observation_text, parse_tool_calls
from envs.sandboxes import FreshSandboxes, SandboxFactory, SandboxRelease
from envs.spaces import UnicodeText
from envs.tasks import Task, TaskError, TaskSource, load_tasks
from envs.tools import DEFAULT_MAX_OUTPUT_CHARS, ToolContext, get_tools, truncate_middle
from envs.verifiers import Verification, VerifyContext, build_verifier
from envs.verifiers.compose import DEFAULT_ROLES
from sandbox import Backend, Sandbox, SandboxInfraError, SandboxSpec

# An episode needs room for a tool call and the reply that follows its result.
MIN_TURNS = 2
MAX_ACTION_CHARS = 1 << 17
MAX_OBSERVATION_CHARS = 1 << 18
NO_TOOL_CALL = (
    "No tool call found in your reply. Call a tool with\n"
    '<tool_call>\n{"name": "<tool>", "arguments": {...}}\n</tool_call>\n'
    "or call `submit` when you are done. Available tools: {tools}."
)


class AgentEnv(gym.Env[str, str]):
    """Base class of the multi-turn text-agent environments. See the module docstring."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}
    # -- what a domain declares ------------------------------------------------------
    env_id: ClassVar[str] = ""
    domain: ClassVar[str] = ""
    tool_names: ClassVar[tuple[str, ...]] = ("bash", "read_file", "write_file", "submit")
    verifier_roles: ClassVar[Mapping[str, str]] = {}
    default_verifier: ClassVar[Mapping[str, Any]] = {"outcome": 1.0}
    default_tasks: ClassVar[str] = ""
    system_prompt: ClassVar[str] = "You are an agent working in a Linux sandbox. Use the tools to complete the task."
    final_answer_ends_episode: ClassVar[bool] = False
    # Authored near misses (``gold["near_misses"]``) each task must ship; ``envs.quality.validate`` enforces it.
    min_near_misses: ClassVar[int] = 0
    # False for stateless domains (a calculator-like tool, nothing to set up): a sandbox is taken
    # only for the tool calls of one step and handed back right after, so thousands of episodes in
    # flight need only as many sandboxes as tool calls run at once.
    hold_sandbox: ClassVar[bool] = True
    sandbox_spec: ClassVar[SandboxSpec] = SandboxSpec(memory_mb=1024, timeout_s=60.0)

    def __init__(
        self,
        tasks: str | Sequence[Task] | TaskSource | None = None,
        *,
        split: str | None = None,
        backend: str | Backend = "bwrap",
        sandbox_factory: SandboxFactory | None = None,
        sandbox_release: SandboxRelease | None = None,
        sandbox_spec: SandboxSpec | None = None,
        verifier: Mapping[str, Any] | None = None,
        max_turns: int = 16,
        max_episode_tokens: int = 32768,
        token_counter: TokenCounter | None = None,
        tool_timeout_s: float = 30.0,
        max_tool_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        render_mode: str | None = None,
    ):
        if not isinstance(max_turns, int) or max_turns < MIN_TURNS:
            raise ValueError(f"{type(self).__name__}(max_turns=): expected an int >= {MIN_TURNS}, got {max_turns!r}")
        if not isinstance(max_episode_tokens, int) or max_episode_tokens < 1:
            raise ValueError(
                f"{type(self).__name__}(max_episode_tokens=): expected an int >= 1, got {max_episode_tokens!r}"
            )
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"{type(self).__name__}(render_mode=): expected None or 'ansi', got {render_mode!r}")
        if sandbox_release is not None and sandbox_factory is None:
            raise ValueError(f"{type(self).__name__}(sandbox_release=): given without sandbox_factory")
        spec = tasks if tasks is not None else self.default_tasks
        if not spec:
            raise TaskError(f"{type(self).__name__}(tasks=): no tasks given and the domain has no default_tasks")
        self.tasks = load_tasks(spec, split=split)
        if len(self.tasks) == 0:
            raise TaskError(f"{type(self).__name__}(tasks=): {spec!r} (split={split!r}) holds no tasks")
        foreign = [t.id for t in self.tasks if self.domain and t.domain != self.domain]
        if foreign:
            raise TaskError(f"{type(self).__name__}(tasks=): {foreign[:3]} are not {self.domain!r} tasks")
        if sandbox_factory is None:
            self._sandboxes = FreshSandboxes(backend)
            sandbox_factory, sandbox_release = self._sandboxes.acquire, self._sandboxes.release
        self._acquire: SandboxFactory = sandbox_factory
        self._release: SandboxRelease = sandbox_release or (lambda sb: sb.close())
        self.spec_for_sandbox = sandbox_spec or self.sandbox_spec
        self.tools = get_tools(self.tool_names)
        self.verifier = build_verifier(verifier if verifier is not None else self.default_verifier, self.roles())
        self.max_turns = max_turns
        self.max_episode_tokens = max_episode_tokens
        self.count_tokens: TokenCounter = token_counter or approx_tokens
        self.tool_timeout_s = tool_timeout_s
        self.max_tool_output_chars = max_tool_output_chars
        self.render_mode = render_mode
        self.action_space = UnicodeText(MAX_ACTION_CHARS)
        self.observation_space = UnicodeText(MAX_OBSERVATION_CHARS)
        self.sandbox: Sandbox | None = None
        self.task: Task | None = None
        self.episode: Episode | None = None
        self._infra_error: SandboxInfraError | None = None
        self._context_length: Callable[[str], int] | None = None

    # -- domain hooks ---------------------------------------------------------------------
    @classmethod
    def roles(cls) -> dict[str, str]:
        """Role -> registered verifier name; domains set ``outcome``, the base adds the generic ones."""
        return {**DEFAULT_ROLES, **cls.verifier_roles}

    def setup_sandbox(self, sandbox: Sandbox, task: Task) -> None:
        """Prepares a fresh sandbox for ``task``; the default writes ``task.files`` into the workspace."""
        if task.files:
            sandbox.write_files(dict(task.files))

    def build_messages(self, task: Task) -> list[dict[str, Any]]:
        """The conversation the agent starts from (system + user)."""
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": task.prompt}]

    def final_answer(self, text: str) -> str:
        """The answer carried by a reply without tool calls (``final_answer_ends_episode`` domains)."""
        return text

    def gold_actions(self, task: Task) -> list[str]:
        """Replies that solve ``task`` from its gold solution (validation and self-checks replay them)."""
        raise NotImplementedError(f"{type(self).__name__} does not define gold_actions()")

    def solution_actions(self, task: Task, solution: Mapping[str, Any]) -> list[str]:
        """Replies that reach ``solution`` (of the gold's kind) from ``task``'s start state, then submit.

        The validator turns authored near misses into actions with it, as the gold is. The base
        knows ``files`` (path -> content, written) and ``patch`` (a unified diff, applied with
        ``apply_patch``); a domain whose solutions take another form overrides it.
        """
        if "files" in solution and "write_file" in self.tools:
            writes = [format_tool_call("write_file", {"path": p, "content": c}) for p, c in solution["files"].items()]
            return ["\n".join(writes), format_tool_call("submit")]
        if "patch" in solution and "apply_patch" in self.tools:
            return [format_tool_call("apply_patch", {"patch": solution["patch"]}), format_tool_call("submit")]
        raise ValueError(
            f"{type(self).__name__}.solution_actions({task.id}): expected a solution with 'files' or 'patch' "
            f"(for the tools {sorted(self.tools)}), got keys {sorted(solution)}"
        )

    def noop_actions(self, task: Task) -> list[str]:
        """Replies that do nothing useful; a sound task must fail them."""
        if "submit" in self.tools:
            return [format_tool_call("submit", {})]
        return ["I do not know."]

    def ungradable(self, task: Task) -> str | None:
        """Why ``task`` cannot be graded as it stands (validation reports it unplayed), or None."""
        return None

    # -- gymnasium API -----------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._release_sandbox()
        self._infra_error = None
        task = self._select_task(options or {})
        sandbox = None
        if self.hold_sandbox:
            sandbox = self._acquire(self.spec_for_sandbox)
            try:
                self.setup_sandbox(sandbox, task)
            except BaseException:
                self._release(sandbox)
                raise
        self.sandbox, self.task = sandbox, task
        self._context_length = (options or {}).get("context_length")
        if self._context_length is not None and not callable(self._context_length):
            raise TypeError("reset(options['context_length']): expected a callable (observation text -> tokens)")
        messages = self.build_messages(task)
        self.episode = Episode(
            env_id=self.env_id or type(self).__name__,
            task_id=task.id,
            domain=task.domain,
            messages=copy.deepcopy(messages),
            sandbox=sandbox.describe() if sandbox is not None else {},
        )
        self.episode.tokens = sum(self.count_tokens(m["content"]) for m in messages)
        info = {
            "task_id": task.id,
            "domain": task.domain,
            "messages": copy.deepcopy(messages),
            "tools": [tool.schema() for tool in self.tools.values()],
            "turn": 0,
            "max_turns": self.max_turns,
        }
        return task.prompt, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        episode = self.episode
        if episode is None or self.task is None:
            raise RuntimeError(f"{type(self).__name__}.step(): call reset() first")
        if episode.done:
            raise RuntimeError(f"{type(self).__name__}.step(): the episode ended ({episode.end_reason}); call reset()")
        if not isinstance(action, str):
            raise TypeError(f"{type(self).__name__}.step(action=): expected str, got {type(action).__name__}")
        episode.turns += 1
        episode.messages.append({"role": "assistant", "content": action})
        new_messages, records = self._act(action)
        episode.messages.extend(copy.deepcopy(new_messages))
        observation = truncate_middle(observation_text(new_messages), MAX_OBSERVATION_CHARS)
        if self._context_length is not None:
            episode.tokens = int(self._context_length(observation))
        else:
            episode.tokens += self.count_tokens(action) + self.count_tokens(observation)
        if not episode.done and episode.turns >= self.max_turns:
            episode.end_reason = "max_turns"
        elif not episode.done and episode.tokens >= self.max_episode_tokens:
            episode.end_reason = "token_budget"
        info: dict[str, Any] = {
            "turn": episode.turns,
            "tokens": episode.tokens,
            "messages": list(episode.messages),  # the record's messages: read them, do not change them
            "new_messages": new_messages,
            "tool_calls": [r.to_dict() for r in records],
        }
        reward = 0.0
        if episode.done:
            episode.duration_s = max(0.0, time.time() - episode.started_at)
            verification = self._verify()
            reward = verification.reward
            info["verification"] = verification.to_dict()
            info["episode"] = episode.to_dict()
            self._release_sandbox()
        terminated = episode.end_reason in ("submit", "final_answer")
        truncated = episode.done and not terminated
        return observation, reward, terminated, truncated, info

    def step_sandbox(self, action: str) -> SandboxSpec | None:
        """The sandbox ``step(action)`` will lease for its tool calls, or None (it holds one, or calls no tool).

        A scheduler that runs steps leases it for the step and lends it through the environment's
        ``sandbox_factory`` (:class:`envs.sandboxes.LentSandboxes`).
        """
        if self.hold_sandbox or self.sandbox is not None or not parse_tool_calls(action).has_tool_syntax:
            return None
        return self.spec_for_sandbox

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.episode is None:
            return None
        return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in self.episode.messages)

    def close(self) -> None:
        self._release_sandbox()
        sandboxes = getattr(self, "_sandboxes", None)
        if sandboxes is not None:
            sandboxes.close()
        super().close()

    # -- internals ---------------------------------------------------------------------
    def _select_task(self, options: Mapping[str, Any]) -> Task:
        choice = options.get("task")
        if choice is None:
            return self.tasks[int(self.np_random.integers(len(self.tasks)))]
        if isinstance(choice, Task):
            return choice
        if isinstance(choice, str):
            return self.tasks.get(choice)
        if isinstance(choice, Mapping):
            return Task.from_dict(choice)
        raise TypeError(
            f"reset(options['task']): expected a Task, a task id or a task dict, got {type(choice).__name__}"
        )

    def _act(self, action: str) -> tuple[list[dict[str, Any]], list[ToolCallRecord]]:
        episode = self.episode
        parsed = parse_tool_calls(action)
        if not parsed.has_tool_syntax:
            if self.final_answer_ends_episode:
                episode.answer = self.final_answer(action)
                episode.end_reason = "final_answer"
                return [], []
            return [{"role": "user", "content": NO_TOOL_CALL.replace("{tools}", ", ".join(self.tools))}], []
        if self.sandbox is None:  # hold_sandbox=False: a sandbox for this step's calls only
            try:
                self.sandbox = self._acquire(self.spec_for_sandbox)
            except SandboxInfraError as exc:
                episode.end_reason, self._infra_error = "sandbox_error", exc
                return [], []
            episode.sandbox = self.sandbox.describe()
        try:
            return self._run_tools(parsed)
        finally:
            if not self.hold_sandbox:
                self._release_sandbox()

    def _run_tools(self, parsed: ParsedAction) -> tuple[list[dict[str, Any]], list[ToolCallRecord]]:
        episode = self.episode
        messages, records = [], []
        ctx = ToolContext(self.sandbox, self.task, self.tool_timeout_s, self.max_tool_output_chars)
        for item in parsed.items:
            record = ToolCallRecord(
                turn=episode.turns,
                index=item.index,
                name=getattr(item, "name", ""),
                arguments=copy.deepcopy(dict(getattr(item, "arguments", {}))),
                output="",
                sandbox={k: episode.sandbox.get(k) for k in ("backend", "image")},
            )
            if isinstance(item, ToolCallError):
                record.error, record.malformed = item.message, True
                record.output = f"Error: malformed tool call: {item.message}"
            elif item.name not in self.tools:
                record.error, record.malformed = f"unknown tool {item.name!r}; available: {', '.join(self.tools)}", True
                record.output = f"Error: {record.error}"
            else:
                try:
                    scratch = f"/tmp/.agentrl-{episode.turns}-{item.index}"
                    result = self.tools[item.name](dataclasses.replace(ctx, scratch=scratch), item.arguments)
                except SandboxInfraError as exc:
                    record.error = f"sandbox failure: {exc}"
                    records.append(record)
                    episode.tool_calls.append(record)
                    episode.end_reason = "sandbox_error"
                    self._infra_error = exc
                    break
                record.output, record.exit_code, record.timed_out = result.output, result.exit_code, result.timed_out
                record.duration_s, record.error, record.malformed = result.duration_s, result.error, result.malformed
                if result.ends_episode:
                    episode.submitted, episode.answer, episode.end_reason = True, result.answer, "submit"
            records.append(record)
            episode.tool_calls.append(record)
            messages.append({"role": "tool", "name": record.name or "invalid", "content": record.output})
            if episode.done:
                break  # calls after submit are not run
        return messages, records

    def _verify(self) -> Verification:
        """The verdict; a sandbox failure the policy may have caused is settled by :mod:`envs.anomalies`."""
        found: dict[str, Any] = {}
        if self.episode.end_reason == "sandbox_error":
            exc = self._infra_error
            result = Verification.anomalous(f"sandbox_{getattr(exc, 'cause', 'infra')}: {exc}", verifier="env")
        else:
            # What the policy left running, before the judge kills it (from the agent: nothing spawned).
            found = anomalies.hazards(self.sandbox)
            ctx = VerifyContext(task=self.task, sandbox=self.sandbox, episode=self.episode, max_turns=self.max_turns)
            result = self.verifier.verify(ctx)
        if result.passed:
            return result
        # Space is read after the judge: its own files count, and a full mount is what starved it.
        kind = anomalies.hazard_kind(found, anomalies.hazards(self.sandbox), self.spec_for_sandbox)
        if not result.is_anomaly:
            return anomalies.with_kind(result, kind)
        old = self.sandbox
        snapshot = old.snapshot if old is not None and old.healthy else None
        return anomalies.settle(result, kind=kind, snapshot=snapshot, rejudge=self._rejudge)

    def _rejudge(self, snapshot: Any) -> Verification:
        """Judges again in a fresh sandbox: the final workspace restored from ``snapshot``, or (None) the
        episode's tool calls replayed from the task's start state."""
        fresh = self._acquire(self.spec_for_sandbox)
        try:
            if fresh is self.sandbox:  # a lender handed back the episode's own sandbox: nothing fresh to judge in
                raise SandboxInfraError("no fresh sandbox to re-verify in", cause=anomalies.NO_FRESH_SANDBOX)
            if snapshot is not None:
                self.setup_sandbox(fresh, self.task)
                fresh.restore(snapshot)
            else:
                anomalies.replay(self, fresh)
            ctx = VerifyContext(task=self.task, sandbox=fresh, episode=self.episode, max_turns=self.max_turns)
            return self.verifier.verify(ctx)
        finally:
            self._release(fresh)

    def _release_sandbox(self) -> None:
        sandbox, self.sandbox = self.sandbox, None
        if sandbox is not None:
            self._release(sandbox)


def register_domain(name: str, *, env_id: str | None = None):
    """Class decorator: registers an :class:`AgentEnv` subclass as ``agentrl/<name>-v0`` with gymnasium."""

    def wrap(cls: type[AgentEnv]) -> type[AgentEnv]:
        if not (isinstance(cls, type) and issubclass(cls, AgentEnv)):
            raise TypeError(f"register_domain({name!r}): expected an AgentEnv subclass, got {cls!r}")
        if not cls.domain:
            raise ValueError(f"{cls.__name__}.domain: a registered environment must name its domain")
        if "outcome" not in cls.roles():
            raise ValueError(f"{cls.__name__}.verifier_roles: must bind 'outcome' to a registered verifier")
        cls.env_id = env_id or f"agentrl/{name}-v0"
        if cls.env_id not in gym.registry:
            # Honest flag: tool outputs (clocks, pids, timings in info) are not reproducible from the
            # seed. Seeded task choice and the transcript are; tests/envs checks that separately.
            gym.register(id=cls.env_id, entry_point=cls, nondeterministic=True)
        DOMAINS[cls.domain] = cls
        return cls

    return wrap


DOMAINS: dict[str, type[AgentEnv]] = {}


def env_for_domain(domain: str) -> type[AgentEnv]:
    """The environment class that runs tasks of ``domain`` (for mixed task streams)."""
    if domain not in DOMAINS:
        raise KeyError(f"no environment registered for domain {domain!r}; registered: {sorted(DOMAINS)}")
    return DOMAINS[domain]
