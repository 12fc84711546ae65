"""``function_tests``: HumanEval-format function completion, judged on data the candidate cannot reach.

A task carries the function's prompt (``metadata.code_prompt``: signature and
docstring), its ``entry_point``, and its checks *as recorded calls*
(``hidden.calls``: arguments and a check over the result, recorded once with
the reference solution: :mod:`envs.domains.function.records`). The model's
reply is a completion: the body that continues the prompt, or a whole ``def``
of the entry point, optionally in a fenced code block.

Verification is one command in the episode's sandbox and a comparison on the
host. After ``kill_all`` (nothing the agent started survives to answer for the
candidate), the candidate program runs as the command uid in its own process
under the stdlib driver (``in_sandbox/driver.py``), which is given the
recorded *arguments only* and prints each result as plain data
(:mod:`envs.in_sandbox.plain_data`: tagged JSON of exact builtin types). The
host decodes that report (size- and depth-capped) into fresh builtin values and
evaluates each recorded check on them (``in_sandbox/checks.py``). No test,
expected value, nonce or key exists anywhere the candidate runs, so there is
nothing to read from disk, frames or /proc, and nothing to sign: a forged
report can only claim results, and a claimed result is compared like any
other. A crash, a timeout, a malformed or incomplete report, a value that is
not plain data, or one failed check scores 0; none is an anomaly. A task whose
checks could not be recorded is never graded another way: it is an anomaly
(the loaders exclude such tasks by default).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envs.domains.function.in_sandbox.checks import CheckError, describe, evaluate
from envs.in_sandbox import bundle, shared, source
from envs.in_sandbox.plain_data import DecodeError, decode
from envs.verifiers.base import Verification, Verifier, VerifyContext, register_verifier

DRIVER = Path(__file__).resolve().parent / "in_sandbox" / "driver.py"
# The report's own cap, whatever the sandbox's output cap: recording replays the reference under the
# same limit, so a task whose correct results would not fit is refused then, not failed in every episode.
MAX_REPORT_BYTES = 1 << 20
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


@functools.cache
def driver_program() -> str:
    """The driver as one ``python3 -c`` program, the codec bundled in."""
    return bundle(source(DRIVER), {"plain_data": shared("plain_data")})


@dataclasses.dataclass(frozen=True)
class FunctionRun:
    """The host's verdict on one candidate: ``result`` is ``"passed"`` or ``"failed: <why>"``."""

    passed: bool
    result: str
    checked: int
    total: int

    def details(self) -> dict[str, Any]:
        return {"result": self.result, "checked": self.checked, "calls": self.total}


def run_function_tests(
    sandbox: Any,
    program: str,
    entry_point: str,
    calls: Sequence[Mapping[str, Any]],
    *,
    call_timeout_s: float = 5.0,
    timeout_s: float = 30.0,
) -> FunctionRun:
    """Runs ``program`` on the recorded ``calls`` in ``sandbox`` (as the command uid) and judges it on the host."""
    if not calls:
        raise ValueError("run_function_tests(calls=): no recorded calls; a task without them cannot be judged")
    request = {
        "program": program,
        "entry_point": entry_point,
        "calls": [[call["args"], call["kwargs"]] for call in calls],
        "call_timeout_s": float(call_timeout_s),
    }
    sandbox.kill_all()
    result = sandbox.exec(
        ["python3", "-I", "-S", "-B", "-c", driver_program()],
        stdin=json.dumps(request),
        timeout=timeout_s,
        user="sandbox",
    )
    sandbox.kill_all()
    return judge_report(calls, result.stdout, truncated=result.truncated, timed_out=result.timed_out)


def judge_report(
    calls: Sequence[Mapping[str, Any]], stdout: bytes, *, truncated: bool = False, timed_out: bool = False
) -> FunctionRun:
    """Compares the driver's report with the recorded checks: every call, in order, nothing else."""
    total = len(calls)

    def fail(why: str, checked: int = 0) -> FunctionRun:
        return FunctionRun(False, f"failed: {why}", checked, total)

    if truncated or len(stdout) > MAX_REPORT_BYTES:
        return fail("the report exceeds the output cap")
    lines = stdout.split(b"\n")
    if lines[-1] != b"":
        return fail("the report is incomplete (the program did not finish)" if not timed_out else "timed out")
    events = []
    for line in lines[:-1]:
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            event = None
        if type(event) is not list or not event:
            return fail("the report is malformed (a line is not a JSON event)")
        events.append(event)
    if not events or events[0] != ["loaded"]:
        if events and events[0][0] == "load_error" and len(events[0]) == 3:
            return fail(f"the program did not load: {str(events[0][1])[:80]}: {str(events[0][2])[:200]}")
        return fail("the report is malformed (no load event)")
    for i, call in enumerate(calls):
        if i + 1 >= len(events):
            return fail("timed out" if timed_out else f"no result for call {i} (the program exited early)", i)
        event = events[i + 1]
        if event[0] != i or type(event[0]) is not int or len(event) < 2:
            return fail(f"the report is malformed (expected call {i})", i)
        if event[1] != "ok" or len(event) != 3:
            return fail(f"call {i} (line {call.get('line')}): {_describe_event(event)}", i)
        try:
            value = decode(event[2])
        except DecodeError as exc:
            return fail(f"call {i}: the result is not plain data ({exc})", i)
        try:
            holds = evaluate(call["check"], value)
        except CheckError as exc:  # a corrupted record: the harness's fault, not the model's
            raise RuntimeError(f"recorded check of call {i} is malformed: {exc}") from exc
        if not holds:
            return fail(
                f"call {i} (line {call.get('line')}): {describe(call['check'])} is false for R = {_short(value)}", i
            )
    if len(events) != total + 1:
        return fail("the report is malformed (more events than calls)", total)
    if timed_out:
        return fail("timed out", total)
    return FunctionRun(True, "passed", total, total)


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int past the 4300-digit repr limit
        return f"<{type(value).__name__} too long to show>"
    return text if len(text) <= 120 else text[:117] + "..."


def _describe_event(event: list) -> str:
    kind = event[1]
    if kind == "raise" and len(event) == 4:
        return f"raised {str(event[2])[:80]}: {str(event[3])[:200]}"
    if kind == "timeout":
        return "timed out"
    if kind == "unencodable" and len(event) == 3:
        return f"returned a value that is not plain data ({str(event[2])[:200]})"
    return "the report is malformed"


def program_for(task: Any, completion: str) -> str:
    """The candidate program for a function-completion task and a completion of it."""
    meta = task.metadata
    return build_program(meta["code_prompt"], completion, meta["entry_point"])


@register_verifier("function_tests")
class FunctionTestsVerifier(Verifier):
    """1.0 if the completion satisfies every recorded check of the task, else 0.0."""

    role = "outcome"
    OPTIONS = {"call_timeout_s": 5.0, "timeout_s": 30.0}

    def check(self, ctx: VerifyContext) -> Verification:
        calls = ctx.task.hidden.get("calls")
        if not calls:
            why = ctx.task.hidden.get("unconvertible") or "the task carries no recorded calls (hidden.calls)"
            return Verification.anomalous(f"unconvertible_task: {why}", verifier=self.name)
        completion = extract_code(ctx.answer or "")
        if not completion.strip():
            return self.result(0.0, details={"result": "failed: empty completion"})
        run = run_function_tests(
            ctx.sandbox,
            program_for(ctx.task, completion),
            ctx.task.metadata["entry_point"],
            calls,
            call_timeout_s=self.options["call_timeout_s"],
            timeout_s=self.options["timeout_s"],
        )
        return self.result(1.0 if run.passed else 0.0, details=run.details())
