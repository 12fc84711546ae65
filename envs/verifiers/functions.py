"""``function_tests``: HumanEval-format function completion, checked in batches inside the sandbox.

A task carries the function's prompt (``metadata.code_prompt``: signature and
docstring), its ``entry_point`` and the hidden ``check(candidate)`` test
(``hidden.test``). The model's reply is a completion: the body that continues
the prompt, or a whole ``def`` of the entry point, optionally in a fenced code
block. :func:`run_function_tests` sends any number of problems to the trusted
driver (``envs/data/harness/function_driver.py``) in one sandbox command; see
its docstring for how early exits, patched builtins and always-equal objects
are caught.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from envs.verifiers.base import Verification, Verifier, VerifyContext, register_verifier
from envs.verifiers.harness import HARNESS_DIR, MAX_REPORT_BYTES
from sandbox import SandboxFileError

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str:
    """The last fenced code block of a reply, or the reply itself when it has none."""
    blocks = _FENCE.findall(text or "")
    return blocks[-1] if blocks else (text or "")


def build_program(prompt: str, completion: str, entry_point: str) -> str:
    """Prompt + completion, or prompt + a full redefinition when the completion re-declares the function."""
    if re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", completion, re.M):
        return prompt + "\n\n" + completion
    return prompt + completion


def run_function_tests(
    sandbox: Any, problems: Sequence[Mapping[str, str]], *, timeout_s: float = 10.0, workers: int = 2
) -> dict[str, str]:
    """Runs each problem (``id``, ``prompt``, ``program``, ``test``, ``entry_point``); returns id -> result.

    A result is ``"passed"``, ``"timed out"`` or ``"failed: <why>"``. Problems
    without a result (the driver was killed by a candidate) count as failed.
    """
    ids = [p["id"] for p in problems]
    if len(set(ids)) != len(ids):
        raise ValueError("run_function_tests(problems=): problem ids must be unique")
    sandbox.kill_all()
    root = f"/tmp/.agentrl-fn-{secrets.token_hex(12)}"
    results_path = f"{root}/results-{secrets.token_hex(8)}.json"
    sandbox.write_files(
        {
            f"{root}/problems.json": json.dumps([dict(p) for p in problems]),
            f"{root}/function_driver.py": (HARNESS_DIR / "function_driver.py").read_text(),
        }
    )
    key = secrets.token_bytes(32)
    budget = timeout_s * (len(problems) / max(workers, 1) + 2) + 30
    sandbox.exec(
        [
            "python3",
            "-I",
            "-B",
            f"{root}/function_driver.py",
            f"{root}/problems.json",
            results_path,
            str(workers),
            str(timeout_s),
        ],
        stdin=key,
        timeout=budget,
    )
    sandbox.kill_all()
    results = {pid: "failed: no result (the driver did not finish)" for pid in ids}
    try:
        envelope = json.loads(sandbox.read_file(results_path, max_bytes=MAX_REPORT_BYTES))
        body = envelope["body"]
        mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
        if hmac.compare_digest(mac, str(envelope["mac"])):
            results.update({k: v for k, v in json.loads(body).items() if k in results})
        else:
            results = {pid: "failed: the results were forged" for pid in ids}
    except (SandboxFileError, ValueError, KeyError, TypeError):
        pass
    return results


def problem_from_task(task: Any, completion: str) -> dict[str, str]:
    """The driver's view of a function-completion task and a completion for it."""
    meta = task.metadata
    return {
        "id": task.id,
        "prompt": meta["code_prompt"],
        "program": build_program(meta["code_prompt"], completion, meta["entry_point"]),
        "test": task.hidden["test"],
        "entry_point": meta["entry_point"],
    }


@register_verifier("function_tests")
class FunctionTestsVerifier(Verifier):
    """1.0 if the completion passes the hidden ``check``, else 0.0."""

    role = "outcome"
    OPTIONS = {"timeout_s": 10.0}

    def check(self, ctx: VerifyContext) -> Verification:
        completion = extract_code(ctx.answer or "")
        if not completion.strip():
            return self.result(0.0, details={"result": "failed: empty completion"})
        problem = problem_from_task(ctx.task, completion)
        result = run_function_tests(ctx.sandbox, [problem], timeout_s=self.options["timeout_s"], workers=1)[ctx.task.id]
        return self.result(float(result == "passed"), details={"result": result})
