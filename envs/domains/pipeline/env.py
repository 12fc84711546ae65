"""``agentrl/DataPipeline-v0``: fix a pipeline config; the ``pipeline`` task compiler.

Compiling a source record runs the gold config through the runner on the host,
over the visible data and every hidden variant, to get the expected outputs
(and the visible ``expected.csv``), and refuses a broken config that already
produces them.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from envs.core import AgentEnv, register_domain
from envs.domains.pipeline.verifier import RUNNER
from envs.in_sandbox import source
from envs.parsing import format_tool_call
from envs.quality.hooks import NEAR_MISSES, register_compiler, task_fields
from envs.tasks import Task, TaskError
from sandbox import Sandbox, SandboxSpec


@register_domain("DataPipeline")
class DataPipelineEnv(AgentEnv):
    """Fix a pipeline config so the runner's output matches the expected rows (checked on hidden data too)."""

    domain = "pipeline"
    tool_names = ("bash", "read_file", "write_file", "run_tests", "submit")
    verifier_roles: ClassVar = {"outcome": "pipeline_output"}
    default_tasks = "builtin:pipeline"
    sandbox_spec = SandboxSpec(memory_mb=512, timeout_s=30.0)
    min_near_misses = 3
    system_prompt = (
        "You maintain a data pipeline in /workspace: `runner.py` (documented in its docstring) executes the config "
        "`pipeline.yaml` over the CSV files in data/. Fix the config so the output matches the task; `run_tests` "
        "runs the pipeline and diffs against expected.csv. Do not edit runner.py or the data: grading reruns your "
        "config with a pristine runner, also on other data with the same columns. Call `submit` when done."
    )

    def setup_sandbox(self, sandbox: Sandbox, task: Task) -> None:
        super().setup_sandbox(sandbox, task)
        sandbox.write_files({"runner.py": source(RUNNER)})

    def gold_actions(self, task: Task) -> list[str]:
        writes = [format_tool_call("write_file", {"path": p, "content": c}) for p, c in task.gold["files"].items()]
        return ["\n".join(writes), format_tool_call("submit")]


def load_pipeline_runner():
    """The runner as a module of this process (authoring runs trusted gold configs on the host)."""
    spec = importlib.util.spec_from_file_location("agentrl_pipeline_runner", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_pipeline_locally(config: str, data: dict[str, str]) -> tuple[str, str]:
    """(output path, output text) of ``config`` over ``data``, run on the host in a scratch directory."""
    runner = load_pipeline_runner()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for path, content in {**data, "pipeline.yaml": config}.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(content)
        out, _ = runner.run(str(root / "pipeline.yaml"))
        return str(Path(out).relative_to(root)), Path(out).read_text()


@register_compiler("pipeline")
def compile_pipeline(records: list[dict[str, Any]], **_: Any) -> list[Task]:
    """Pipeline tasks; every dataset's expected output comes from running the gold config on the host."""
    tasks = []
    for r in records:
        data = dict(r["data"])
        output, expected = run_pipeline_locally(r["gold"], data)
        datasets = [{"name": "visible", "files": data, "expected": expected}]
        for variant in r.get("variants", []):
            _, variant_expected = run_pipeline_locally(r["gold"], variant["data"])
            datasets.append({"name": variant["name"], "files": dict(variant["data"]), "expected": variant_expected})
        try:
            broken = run_pipeline_locally(r["config"], data)
        except Exception:  # noqa: BLE001 - a crashing config is a fine starting point
            broken = None
        if broken == (output, expected):
            raise TaskError(f"pipeline source {r['id']!r}: the broken config already produces the expected output")
        gold = {"files": {"pipeline.yaml": r["gold"]}}
        if r.get("near_misses"):
            gold[NEAR_MISSES] = _near_misses(r, datasets)
        metadata = {
            "source": "agentrl",
            "config_path": "pipeline.yaml",
            "output_path": output,
            "test_command": f"python3 runner.py pipeline.yaml && diff -u expected.csv {output} && echo 'OK: matches'",
        }
        tasks.append(
            Task(
                **task_fields(r, "pipeline"),
                files={**data, "pipeline.yaml": r["config"], "expected.csv": expected},
                hidden={"datasets": datasets},
                gold=gold,
                metadata=metadata,
            )
        )
    return tasks


def _near_misses(record: dict, datasets: list[dict]) -> list[dict]:
    """The record's authored near misses (``name``, ``why``, ``config``) as solutions; each must miss everywhere.

    The verifier pays per dataset, so a near miss that reproduces any dataset's expected
    output would earn a share: the record is refused, naming it (change the data so it misses).
    """
    out = []
    for miss in record["near_misses"]:
        missing = [k for k in ("name", "why", "config") if k not in miss]
        if missing:
            raise TaskError(f"pipeline source {record['id']!r}: near miss {miss.get('name')!r} lacks {missing}")
        hits = [d["name"] for d in datasets if _output(miss["config"], d["files"]) == d["expected"]]
        if hits:
            raise TaskError(f"pipeline source {record['id']!r}: near miss {miss['name']!r} matches dataset {hits}")
        out.append({"name": miss["name"], "why": miss["why"], "files": {"pipeline.yaml": miss["config"]}})
    return out


def _output(config: str, files: dict[str, str]) -> str | None:
    try:
        return run_pipeline_locally(config, dict(files))[1]
    except Exception:  # noqa: BLE001 - a config that crashes matches nothing
        return None
