"""``pipeline_output``: the outcome of data-pipeline tasks, by rerunning the agent's config on hidden data.

The agent edits a pipeline config (``task.metadata["config_path"]``). Grading:

1. ``kill_all``: no process of the agent survives to watch the hidden data
   arrive, swap the runner or rewrite the output.
2. The config is read on the host (never through a symlink).
3. For each dataset of ``task.hidden["datasets"]`` (the visible one and unseen
   variants with the same schema), the judge (uid 1001) makes a fresh mode-0700
   directory; the host writes into it, owned by the judge, the dataset's input
   files, the config and a pristine runner; the runner runs there as the judge;
   the host reads its output file and the directory is removed. (/dev/shm
   stands in for /tmp when the agent filled /tmp.)
4. The output is compared with the dataset's expected rows *on the host*: the
   expected outputs never enter the sandbox, and the hidden inputs exist in it
   only inside the judge's directory, after the agent's last process is gone.

The runner (``in_sandbox/runner.py``) never evaluates the config as
code: YAML through ``yaml.safe_load``, ``derive`` expressions through a
whitelist of arithmetic AST nodes, paths confined to ``data/`` and ``out/``.
That is why it may run as the judge; a config that hangs it or exhausts its
memory only fails (a timeout, an exit status). So nothing the agent changed
besides the config (the runner, the input CSVs, a visible ``expected.csv``)
plays a part, and a config that special-cases the visible rows fails the
variants. The score is the share of datasets reproduced exactly (header, order,
formatting). Full staging mounts (the agent's doing) fail the datasets they
block; only :class:`sandbox.SandboxInfraError` makes an anomaly.
"""

from __future__ import annotations

import csv
import io
import secrets
from pathlib import Path
from typing import Any

from envs.in_sandbox import source
from envs.verifiers.base import Verification, Verifier, VerifyContext, register_verifier
from sandbox import SandboxFileError

RUNNER = Path(__file__).resolve().parent / "in_sandbox" / "runner.py"
STAGING_PARENTS = ("/tmp", "/dev/shm")
MAX_OUTPUT_BYTES = 8 << 20


def rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def first_difference(expected: str, actual: str) -> str:
    want, got = rows(expected), rows(actual)
    for i, (a, b) in enumerate(zip(want, got, strict=False)):
        if a != b:
            return f"row {i}: expected {a}, got {b}"
    return f"expected {len(want)} rows, got {len(got)}"


def stage(sandbox: Any, files: dict[str, str | bytes]) -> tuple[str | None, str]:
    """Writes ``files`` into a fresh mode-0700 directory of the judge; (its path, or None; why not).

    /tmp first, /dev/shm if /tmp is full (each is a mount of its own): an agent that filled one
    still gets its config graded.
    """
    problems = []
    for parent in STAGING_PARENTS:
        root = f"{parent}/.agentrl-pipe-{secrets.token_hex(12)}"
        made = sandbox.exec(["mkdir", "-m", "700", root], user="judge", cwd="/", timeout=30)
        if not made.ok:
            problems.append(f"{parent}: {made.stderr_text.strip()[-200:]}")
            continue
        try:
            sandbox.write_files({f"{root}/{path}": content for path, content in files.items()}, user="judge")
            return root, ""
        except SandboxFileError as exc:
            problems.append(f"{parent}: {exc}")
            sandbox.exec(["rm", "-rf", "--", root], user="judge", cwd="/", timeout=30)
    return None, "cannot stage the dataset: " + "; ".join(problems)


def run_pipeline(
    sandbox: Any, config_name: str, config: bytes, files: dict[str, str], output: str, *, timeout_s: float = 30.0
) -> tuple[str | None, str]:
    """Runs the pristine runner on ``config`` over ``files`` as the judge, in a fresh private directory.

    Returns (the output text, or None if there is none; the runner's log).
    """
    root, problem = stage(sandbox, {**files, config_name: config, "runner.py": source(RUNNER)})
    if root is None:
        return None, problem
    try:
        argv = ["python3", "-I", "-B", f"{root}/runner.py", f"{root}/{config_name}"]
        result = sandbox.exec(argv, cwd=root, timeout=timeout_s, user="judge")
        log = ("timed out; " if result.timed_out else "") + (result.stdout_text + result.stderr_text)[-500:]
        try:
            return sandbox.read_file(f"{root}/{output}", max_bytes=MAX_OUTPUT_BYTES).decode("utf-8", "replace"), log
        except SandboxFileError:
            return None, log
    finally:
        sandbox.exec(["rm", "-rf", "--", root], user="judge", cwd="/", timeout=30)


@register_verifier("pipeline_output")
class PipelineOutputVerifier(Verifier):
    """Share of hidden datasets on which the agent's config reproduces the expected output."""

    role = "outcome"
    OPTIONS = {"timeout_s": 30.0}

    def check(self, ctx: VerifyContext) -> Verification:
        task = ctx.task
        config_path, output = task.metadata["config_path"], task.metadata["output_path"]
        ctx.sandbox.kill_all()
        try:
            config = ctx.sandbox.read_file(config_path, max_bytes=1 << 20)
        except SandboxFileError as exc:
            return self.result(0.0, details={"error": f"{config_path} cannot be read: {exc}"})
        results = []
        for dataset in task.hidden["datasets"]:
            text, log = run_pipeline(
                ctx.sandbox, config_path, config, dataset["files"], output, timeout_s=self.options["timeout_s"]
            )
            ok = text is not None and rows(text) == rows(dataset["expected"])
            why = "ok" if ok else (f"no output: {log}" if text is None else first_difference(dataset["expected"], text))
            results.append({"dataset": dataset["name"], "ok": ok, "detail": why})
        score = sum(r["ok"] for r in results) / len(results)
        return self.result(score, passed=score == 1.0, details={"datasets": results})
