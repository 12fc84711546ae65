"""``agentrl/RepoRepair-v0``: fix a small repository until its hidden tests pass."""

from __future__ import annotations

from typing import ClassVar

from envs.core import AgentEnv, register_domain
from envs.parsing import format_tool_call
from envs.tasks import Task, TaskError
from sandbox import Sandbox, SandboxSpec

# A fixed identity and date make the squashed commit (and its hash) reproducible.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "agentrl",
    "GIT_AUTHOR_EMAIL": "agentrl@localhost",
    "GIT_COMMITTER_NAME": "agentrl",
    "GIT_COMMITTER_EMAIL": "agentrl@localhost",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
}
_GIT_INIT = "git init -q -b main && git add -A && git commit -q -m 'Initial commit' && git gc -q --prune=now"


@register_domain("RepoRepair")
class RepoRepairEnv(AgentEnv):
    """Fix a small repository until its (hidden) test suite passes.

    The workspace is a git repository with one squashed commit, so history
    never holds the fix. The hidden tests enter the sandbox only after
    ``submit``, and only where the code under test cannot reach them: they run
    in a judge process under another uid, with the repository behind a
    plain-data proxy (``hidden_tests``, :mod:`envs.domains.repair.split_judge`).
    """

    domain = "repair"
    tool_names = ("bash", "read_file", "write_file", "apply_patch", "run_tests", "submit")
    verifier_roles: ClassVar = {"outcome": "hidden_tests"}
    min_near_misses = 3  # authored per task (a patch each, played like the gold)
    default_tasks = "builtin:repair"
    sandbox_spec = SandboxSpec(memory_mb=1024, timeout_s=60.0)
    system_prompt = (
        "You are a software engineer fixing a bug in the repository in /workspace. Inspect the code, run the tests "
        "with `run_tests`, edit files with `write_file` or `apply_patch`, and call `submit` when the fix is complete. "
        "Hidden tests will check the behaviour described in the task, not only the visible tests."
    )

    def setup_sandbox(self, sandbox: Sandbox, task: Task) -> None:
        super().setup_sandbox(sandbox, task)
        result = sandbox.exec(_GIT_INIT, env=_GIT_ENV, timeout=60)
        if not result.ok:
            raise TaskError(f"task {task.id!r}: could not create the repository: {result.stderr_text[-300:]}")

    def gold_actions(self, task: Task) -> list[str]:
        return [format_tool_call("apply_patch", {"patch": task.gold["patch"]}), format_tool_call("submit")]
