"""``agentrl/RepairGen-v0``: the repair environment cut down for a tiny model, and its one-line edit tool.

The subclass of :class:`~envs.domains.repair.env.RepoRepairEnv` keeps what judges (the
``hidden_tests`` verifier: hidden tests in a judge process under another uid, the repository
behind a proxy) and changes only what a policy of a couple of kilobytes of context needs: four
tools (``run_tests``, ``read_file``, ``replace``, ``submit``), no system turn, and
no git repository (the generated files never held the fix, so there is no history to squash,
and an episode saves the ``git init``/``gc`` it would cost).

``replace(path, old, new)`` is the edit a small model can emit: copy the few words it has read
that must change (the demonstrations copy the fewest that are unique) and write them back
changed. ``old`` must occur exactly once, so an edit never lands somewhere the model did not
mean; every refusal says why, in a line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from envs.core import AgentEnv, register_domain
from envs.domains.repair.env import RepoRepairEnv
from envs.domains.repair_gen.tasks import NAME
from envs.parsing import format_tool_call
from envs.tasks import Task
from envs.tools import Tool, ToolContext, ToolResult, register_tool, truncate_middle
from sandbox import Sandbox, SandboxSpec

ENV_NAME = "RepairGen"


def _replace(ctx: ToolContext, arguments: Mapping[str, Any]) -> ToolResult:
    path, old, new = arguments["path"], arguments["old"], arguments["new"]

    def refuse(msg: str) -> ToolResult:
        return ToolResult(output=f"Error: replace: {msg}", error=msg)

    if not old:
        return refuse("`old` is empty; give the exact text to replace")
    text = ctx.sandbox.read_file(path, max_bytes=1 << 20).decode("utf-8", errors="replace")
    count = text.count(old)
    if count != 1:
        where = "does not occur" if count == 0 else f"occurs {count} times (it must be unique)"
        return refuse(f"`old` {where} in {path}")
    ctx.sandbox.write_files({path: text.replace(old, new, 1)})
    line = text[: text.index(old)].count("\n") + 1
    return ToolResult(output=truncate_middle(replaced_message(path, line), ctx.max_output_chars))


def initial_messages(task: Task) -> list[dict[str, Any]]:
    """The conversation an episode starts from: the task's prompt alone, no system turn.

    A system turn would say the same to every episode, and the byte-level model pays for it in
    context: about 100 tokens, which took a quarter of the verify-and-retry episodes past 1536."""
    return [{"role": "user", "content": task.prompt}]


def replaced_message(path: str, line: int) -> str:
    """What ``replace`` prints on success (the demonstrations print the same)."""
    return f"replaced line {line} of {path}"


REPLACE = register_tool(
    Tool(
        "replace",
        "Replace the exact text `old` (it must occur exactly once) with `new` in the file `path`.",
        {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old": {"type": "string", "description": "exact text to replace, e.g. one whole line"},
                "new": {"type": "string", "description": "the replacement"},
            },
            "required": ["path", "old", "new"],
            "additionalProperties": False,
        },
        _replace,
    )
)


@register_domain(ENV_NAME)
class RepairGenEnv(RepoRepairEnv):
    """Fix a generated one-bug module: run the check, read the module, edit one line, check, submit."""

    domain = NAME
    tool_names = ("run_tests", "read_file", "replace", "submit")
    default_tasks = f"{NAME}:train"
    sandbox_spec = SandboxSpec(memory_mb=512, timeout_s=30.0)
    system_prompt = ""  # no system turn (build_messages)
    min_near_misses = 2
    verifier_roles: ClassVar = dict(RepoRepairEnv.verifier_roles)

    def build_messages(self, task: Task) -> list[dict[str, Any]]:
        return initial_messages(task)

    def setup_sandbox(self, sandbox: Sandbox, task: Task) -> None:
        # The files only: no repository to squash (module docstring).
        AgentEnv.setup_sandbox(self, sandbox, task)

    def gold_actions(self, task: Task) -> list[str]:
        return self.solution_actions(task, task.gold)

    def solution_actions(self, task: Task, solution: Mapping[str, Any]) -> list[str]:
        """``{"edit": {path, old, new}}`` (the gold and the near misses) as one ``replace``, then submit."""
        if "edit" not in solution:
            return super().solution_actions(task, solution)
        return [format_tool_call("replace", dict(solution["edit"])), format_tool_call("submit")]
