"""Gymnasium environments for language-model agents acting in sandboxes, with verifiers and task sets.

    import gymnasium as gym
    import envs  # registers agentrl/Math-v0, CodeCompletion-v0, RepoRepair-v0, ShellOps-v0, DataPipeline-v0, Arithmetic-v0

    env = gym.make("agentrl/RepoRepair-v0", backend="bwrap")
    obs, info = env.reset(seed=0)            # info["messages"], info["tools"]
    obs, reward, terminated, truncated, info = env.step(model_reply)
    info["verification"]                     # at the last step

``envs`` imports no JAX, Flax, optax, grain, ``rl`` or ``configs``, not even
lazily: it runs with any policy, including one behind an API. Each domain is
one package under ``envs/domains/`` (its environment, verifiers, loaders,
self-checks, in-sandbox programs), found and registered at import; adding one
is a new package there plus its tasks (:mod:`envs.domains`). The task-quality
tools are in :mod:`envs.quality`; SFT demonstration sources in
:mod:`envs.demonstrations`.
"""

from envs.core import DOMAINS, MIN_TURNS, AgentEnv, env_for_domain, register_domain
from envs.episode import Episode, ToolCallRecord, approx_tokens
from envs.parsing import (
    ParsedAction,
    ToolCall,
    ToolCallError,
    format_tool_call,
    observation_text,
    parse_tool_calls,
    tool_response_block,
)
from envs.sandboxes import FreshSandboxes, WarmPool
from envs.spaces import UnicodeText
from envs.tasks import Task, TaskError, TaskSource, load_tasks, read_jsonl, write_jsonl
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
    "MIN_TURNS",
    "TOOLS",
    "VERIFIERS",
    "AgentEnv",
    "Episode",
    "FreshSandboxes",
    "ParsedAction",
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
    "WarmPool",
    "approx_tokens",
    "build_verifier",
    "env_for_domain",
    "format_tool_call",
    "get_tools",
    "load_tasks",
    "make_verifier",
    "observation_text",
    "parse_tool_calls",
    "read_jsonl",
    "register_domain",
    "register_tool",
    "register_verifier",
    "tool_response_block",
    "write_jsonl",
]

# Last, after every name above is bound: a domain package does `from envs import AgentEnv, ...`,
# and discovery imports it while this module is still initialising (a circular import otherwise).
import envs.domains  # noqa: E402, F401 - registers the shipped domains with gymnasium
