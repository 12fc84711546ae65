"""Operations domains: shell / system administration, and data-pipeline configuration."""

from __future__ import annotations

from typing import ClassVar

from envs.core import AgentEnv, register_domain
from envs.parsing import format_tool_call
from envs.tasks import DATA_DIR, Task, TaskError
from envs.verifiers.state_rules import cron_resets, keeps_services
from sandbox import Sandbox, SandboxSpec


@register_domain("ShellOps")
class ShellOpsEnv(AgentEnv):
    """Bring the sandbox into a described state (files, permissions, services, cron entries).

    ``task.metadata["setup"]`` is a bash script run at reset (ownership of
    modes, timestamps, fixtures) after ``task.files`` are written.
    ``task.metadata["keep_services"]`` (bool, default false) says the agent's
    processes must survive its turn because a check probes a service it started;
    otherwise every process is killed before the state is checked (see
    :mod:`envs.verifiers.state`); ``task.metadata["reset_before_cron"]`` lists
    the paths a crontab job works on, reset before the checker runs the job. Both
    are validated at reset, so a task that gets them wrong fails to build instead
    of failing every episode.
    """

    domain = "shell"
    tool_names = ("bash", "read_file", "write_file", "submit")
    verifier_roles: ClassVar = {"outcome": "sandbox_state"}
    default_tasks = "builtin:shell"
    sandbox_spec = SandboxSpec(memory_mb=1024, timeout_s=60.0)
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


@register_domain("DataPipeline")
class DataPipelineEnv(AgentEnv):
    """Fix a pipeline config so the runner's output matches the expected rows (checked on hidden data too)."""

    domain = "pipeline"
    tool_names = ("bash", "read_file", "write_file", "run_tests", "submit")
    verifier_roles: ClassVar = {"outcome": "pipeline_output"}
    default_tasks = "builtin:pipeline"
    sandbox_spec = SandboxSpec(memory_mb=512, timeout_s=30.0)
    system_prompt = (
        "You maintain a data pipeline in /workspace: `runner.py` (documented in its docstring) executes the config "
        "`pipeline.yaml` over the CSV files in data/. Fix the config so the output matches the task; `run_tests` "
        "runs the pipeline and diffs against expected.csv. Do not edit runner.py or the data: grading reruns your "
        "config with a pristine runner, also on other data with the same columns. Call `submit` when done."
    )

    def setup_sandbox(self, sandbox: Sandbox, task: Task) -> None:
        super().setup_sandbox(sandbox, task)
        sandbox.write_files({"runner.py": (DATA_DIR / "pipeline_runner.py").read_text()})

    def gold_actions(self, task: Task) -> list[str]:
        writes = [format_tool_call("write_file", {"path": p, "content": c}) for p, c in task.gold["files"].items()]
        return ["\n".join(writes), format_tool_call("submit")]
