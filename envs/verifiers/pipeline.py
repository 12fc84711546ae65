"""``pipeline_output``: the outcome of data-pipeline tasks, by rerunning the agent's config on hidden data.

The agent edits a pipeline config (``task.metadata["config_path"]``). Grading
copies that config, a pristine runner and one dataset at a time into a fresh
directory and runs it there, so nothing the agent changed besides the config
(the runner, the input CSVs, a visible ``expected.csv``) can play a part.
``task.hidden["datasets"]`` holds the visible dataset and unseen variants with
the same schema, each with the rows the gold config produces on it: a config
that special-cases the visible rows fails the variants. The score is the share
of datasets reproduced exactly (header, order, formatting).
"""

from __future__ import annotations

import csv
import io
import secrets
from typing import Any

from envs.tasks import DATA_DIR
from envs.verifiers.base import Verification, Verifier, VerifyContext, register_verifier
from envs.verifiers.harness import MAX_REPORT_BYTES
from sandbox import SandboxFileError

RUNNER = DATA_DIR / "pipeline_runner.py"


def rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def first_difference(expected: str, actual: str) -> str:
    want, got = rows(expected), rows(actual)
    for i, (a, b) in enumerate(zip(want, got, strict=False)):
        if a != b:
            return f"row {i}: expected {a}, got {b}"
    return f"expected {len(want)} rows, got {len(got)}"


def run_pipeline(
    sandbox: Any, config_name: str, config: bytes, files: dict[str, str], output: str
) -> tuple[str | None, str]:
    """Runs the pristine runner on ``config`` over ``files`` in a fresh dir; returns (output text, log)."""
    root = f"/tmp/.agentrl-pipe-{secrets.token_hex(12)}"
    sandbox.write_files({f"{root}/{path}": content for path, content in files.items()})
    sandbox.write_files({f"{root}/{config_name}": config, f"{root}/runner.py": RUNNER.read_text()})
    result = sandbox.exec(["python3", "-I", "-B", f"{root}/runner.py", f"{root}/{config_name}"], cwd=root, timeout=60)
    log = (result.stdout_text + result.stderr_text)[-500:]
    try:
        return sandbox.read_file(f"{root}/{output}", max_bytes=MAX_REPORT_BYTES).decode("utf-8", "replace"), log
    except SandboxFileError:
        return None, log


@register_verifier("pipeline_output")
class PipelineOutputVerifier(Verifier):
    """Share of hidden datasets on which the agent's config reproduces the expected output."""

    role = "outcome"

    def check(self, ctx: VerifyContext) -> Verification:
        task = ctx.task
        config_path, output = task.metadata["config_path"], task.metadata["output_path"]
        ctx.sandbox.kill_all()
        try:
            config = ctx.sandbox.read_file(config_path, max_bytes=1 << 20)
        except SandboxFileError:
            return self.result(0.0, details={"error": f"{config_path} is missing"})
        results = []
        for dataset in task.hidden["datasets"]:
            text, log = run_pipeline(ctx.sandbox, config_path, config, dataset["files"], output)
            ok = text is not None and rows(text) == rows(dataset["expected"])
            why = "ok" if ok else (f"no output: {log}" if text is None else first_difference(dataset["expected"], text))
            results.append({"dataset": dataset["name"], "ok": ok, "detail": why})
        score = sum(r["ok"] for r in results) / len(results)
        return self.result(score, passed=score == 1.0, details={"datasets": results})
