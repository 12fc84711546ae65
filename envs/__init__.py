"""Gymnasium environments for language-model agents acting in sandboxes, with verifiers and task sets.

    import gymnasium as gym
    import envs  # registers agentrl/Math-v0, CodeCompletion-v0, RepoRepair-v0, ShellOps-v0, DataPipeline-v0

    env = gym.make("agentrl/RepoRepair-v0", backend="bwrap")
    obs, info = env.reset(seed=0)            # info["messages"], info["tools"]
    obs, reward, terminated, truncated, info = env.step(model_reply)
    info["verification"]                     # at the last step

``envs`` imports no JAX, Flax, optax, ``rl`` or ``configs`` (grain, which imports
JAX, is loaded only by :func:`mixed_tasks`): it runs with any policy, including
one behind an API. Adding a domain: subclass :class:`AgentEnv`, register a
:class:`Verifier`, decorate with :func:`register_domain`.
"""

import envs.domains  # noqa: F401 - registers the shipped domains with gymnasium
from envs.core import DOMAINS, AgentEnv, env_for_domain, register_domain
from envs.episode import Episode, ToolCallRecord, approx_tokens
from envs.parsing import ParsedAction, ToolCall, ToolCallError, format_tool_call, parse_tool_calls
from envs.sandboxes import FreshSandboxes, ReusedSandboxes
from envs.spaces import UnicodeText
from envs.tasks import Task, TaskError, TaskSource, load_tasks, mixed_tasks, read_jsonl, write_jsonl
from envs.tools import TOOLS, Tool, ToolContext, ToolResult, get_tools, register_tool
from envs.verifiers import (
    VERIFIERS,
    Verification,
    Verifier,
    VerifyContext,
    build_verifier,
    make_verifier,
    register_verifier,
)

__all__ = [
    "DOMAINS",
    "TOOLS",
    "VERIFIERS",
    "AgentEnv",
    "Episode",
    "FreshSandboxes",
    "ParsedAction",
    "ReusedSandboxes",
    "Task",
    "TaskError",
    "TaskSource",
    "Tool",
    "ToolCall",
    "ToolCallError",
    "ToolCallRecord",
    "ToolContext",
    "ToolResult",
    "UnicodeText",
    "Verification",
    "Verifier",
    "VerifyContext",
    "approx_tokens",
    "build_verifier",
    "env_for_domain",
    "format_tool_call",
    "get_tools",
    "load_tasks",
    "make_verifier",
    "mixed_tasks",
    "parse_tool_calls",
    "read_jsonl",
    "register_domain",
    "register_tool",
    "register_verifier",
    "write_jsonl",
]
