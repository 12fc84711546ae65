"""``agentrl/Math-v0``: final-answer math problems, with a Python tool for calculation."""

from __future__ import annotations

from typing import ClassVar

from envs.core import AgentEnv, register_domain
from envs.tasks import Task
from sandbox import SandboxSpec


@register_domain("Math")
class MathEnv(AgentEnv):
    """A reply without a tool call is the final answer; ``submit(answer=...)`` works too."""

    domain = "math"
    tool_names = ("python", "submit")
    verifier_roles: ClassVar = {"outcome": "math_answer"}
    default_tasks = "builtin:math"
    final_answer_ends_episode = True
    sandbox_spec = SandboxSpec(memory_mb=512, timeout_s=30.0)
    system_prompt = (
        "Solve the math problem. You may call the `python` tool to calculate. "
        "When you are done, reply with your reasoning and the final answer written as \\boxed{answer}."
    )

    def gold_actions(self, task: Task) -> list[str]:
        return [f"The final answer is \\boxed{{{task.gold['answer']}}}."]

    def noop_actions(self, task: Task) -> list[str]:
        return ["I cannot solve this problem."]
