"""The template domain's environment and verifier (package docstring)."""

from __future__ import annotations

from typing import Any

from envs import AgentEnv, Task, Verifier, format_tool_call, register_domain, register_verifier

NAME = "template"  # the domain, its task loader (NAME:SEED), its demonstrations and self-checks
ENV_NAME = "Template"  # the gymnasium id agentrl/ENV_NAME-v0
VERIFIER = f"{NAME}_count"


@register_verifier(VERIFIER)
class CountVerifier(Verifier):
    """1.0 if the submitted answer is the hidden count. Reads only the task and the answer: the
    workspace (which the agent could have changed) plays no part in the verdict."""

    def check(self, ctx: Any):
        answer = (ctx.answer or "").strip()
        return self.result(float(answer == str(ctx.task.hidden["count"])), details={"answer": answer[:40]})


@register_domain(ENV_NAME)
class CountEnv(AgentEnv):
    """Reads a file in the workspace with ``bash`` and submits a number.

    ``hold_sandbox`` stays True (the default): the task's files are written into one sandbox at
    reset and the agent's commands run in it, so every episode in flight holds a sandbox (size
    ``config.sandbox.capacity`` for it; the rollout queues what does not fit).
    """

    domain = NAME
    tool_names = ("bash", "submit")
    verifier_roles = {"outcome": VERIFIER}
    default_tasks = f"{NAME}:0"
    system_prompt = "Inspect the files in /workspace with bash, then call submit(answer=<number>)."

    def gold_actions(self, task: Task) -> list[str]:
        """The solution validation replays (and SFT demonstrations imitate): look, then answer."""
        return [
            format_tool_call("bash", {"command": task.gold["command"]}),
            format_tool_call("submit", {"answer": str(task.hidden["count"])}),
        ]
