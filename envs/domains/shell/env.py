"""``agentrl/ShellOps-v0``: bring a sandbox into a described state; the ``shell`` task compiler.

A task's ``hidden.checks`` say what the final state must be
(:mod:`envs.domains.shell.rules`); compiling a source record finds its goal
checks, those that fail before the agent acts, so that doing nothing scores 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from envs.core import AgentEnv, register_domain
from envs.domains.shell.rules import cron_resets, keeps_services, validate_checks
from envs.domains.shell.verifier import run_state_checks
from envs.parsing import format_tool_call
from envs.quality.hooks import NEAR_MISSES, register_compiler, task_fields
from envs.tasks import Task, TaskError
from sandbox import Sandbox, SandboxSpec, get_backend


@register_domain("ShellOps")
class ShellOpsEnv(AgentEnv):
    """Bring the sandbox into a described state (files, permissions, services, cron entries).

    ``task.metadata["setup"]`` is a bash script run at reset (ownership of
    modes, timestamps, fixtures) after ``task.files`` are written.
    ``task.metadata["keep_services"]`` (bool, default false) says the agent's
    processes must survive its turn because a check probes a service it started;
    otherwise every process is killed before the state is checked (see
    :mod:`envs.domains.shell.verifier`); ``task.metadata["reset_before_cron"]`` lists
    the paths a crontab job works on, reset before the checker runs the job. Both
    are validated at reset, so a task that gets them wrong fails to build instead
    of failing every episode.
    """

    domain = "shell"
    tool_names = ("bash", "read_file", "write_file", "submit")
    verifier_roles: ClassVar = {"outcome": "sandbox_state"}
    default_tasks = "builtin:shell"
    sandbox_spec = SandboxSpec(memory_mb=1024, timeout_s=60.0)
    min_near_misses = 3
    system_prompt = (
        "You are a Linux system administrator working in a sandbox (Debian, no network; you are the unprivileged "
        "user `sandbox`, uid 1000; only /workspace and /tmp are writable). Use the tools to carry out the task, then call `submit`. "
        "The final state of the sandbox is checked. Processes you leave running are stopped first, unless the task "
        "asks you to leave a service running: then that service is checked too."
    )

    def setup_sandbox(self, sandbox: Sandbox, task: Task) -> None:
        try:
            keeps_services(task.id, task.metadata, task.hidden.get("checks"))
            cron_resets(task.id, task.metadata, task.hidden.get("checks"))
        except ValueError as exc:
            raise TaskError(str(exc)) from None
        super().setup_sandbox(sandbox, task)
        script = task.metadata.get("setup")
        if script:
            result = sandbox.exec(script, timeout=60)
            if not result.ok:
                raise TaskError(f"task {task.id!r}: metadata.setup failed: {result.stderr_text[-300:]}")

    def gold_actions(self, task: Task) -> list[str]:
        return [format_tool_call("bash", {"command": task.gold["script"]}), format_tool_call("submit")]

    def solution_actions(self, task: Task, solution: Mapping[str, Any]) -> list[str]:
        """A shell solution is a ``script`` (the gold's kind, and each authored near miss's): one bash action, then submit."""
        if isinstance(solution.get("script"), str):
            return [format_tool_call("bash", {"command": solution["script"]}), format_tool_call("submit")]
        return super().solution_actions(task, solution)


def near_misses(record: dict[str, Any]) -> list[dict[str, str]]:
    """``near_misses`` of a shell source record, validated: at least 3 of ``{name, why, script}``, names unique."""
    where = f"shell source {record.get('id')!r} near_misses"
    items = record.get("near_misses")
    if not isinstance(items, list) or len(items) < 3:
        raise TaskError(f"{where}: expected a list of at least 3 wrong end states, got {items!r:.80}")
    for i, m in enumerate(items):
        if not isinstance(m, dict) or not all(isinstance(m.get(k), str) and m[k] for k in ("name", "why", "script")):
            raise TaskError(f"{where}[{i}]: expected {{name, why, script}} strings, got {m!r:.80}")
    if len({m["name"] for m in items}) != len(items):
        raise TaskError(f"{where}: names must be unique")
    return [{k: m[k] for k in ("name", "why", "script")} for m in items]


@register_compiler("shell")
def compile_shell(records: list[dict[str, Any]], *, backend: str = "bwrap", **_: Any) -> list[Task]:
    """Shell tasks; the goal checks are those that fail in the initial state (found in a sandbox)."""
    tasks = []
    with get_backend(backend).create(SandboxSpec(timeout_s=120)) as sandbox:
        pristine = sandbox.snapshot()
        for r in records:
            validate_checks(r["checks"], f"shell source {r['id']!r} checks")
            sandbox.restore(pristine)
            if r.get("files"):
                sandbox.write_files(dict(r["files"]))
            if r.get("setup") and not sandbox.exec(r["setup"], timeout=60).ok:
                raise TaskError(f"shell source {r['id']!r}: setup failed")
            initial = run_state_checks(sandbox, r["checks"])
            goals = [c["name"] for c in initial if not c["ok"]]
            if not goals:
                raise TaskError(f"shell source {r['id']!r}: every check already holds before the agent acts")
            tasks.append(
                Task(
                    **task_fields(r, "shell"),
                    files=dict(r.get("files", {})),
                    hidden={"checks": list(r["checks"]), "goal_checks": goals},
                    gold={"script": r["gold"], NEAR_MISSES: near_misses(r)},
                    metadata={
                        "source": "agentrl",
                        "setup": r.get("setup", ""),
                        **{k: r[k] for k in ("keep_services", "reset_before_cron") if k in r},
                    },
                )
            )
            print(f"  {r['id']}: {len(r['checks'])} checks, {len(goals)} fail in the initial state", flush=True)
    return tasks
