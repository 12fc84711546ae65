"""``sandbox_state``: the outcome of shell / system-operations tasks, from the sandbox's final state.

``task.hidden["checks"]`` lists declarative checks (files and permissions,
directory trees, commands, HTTP and TCP services on loopback, crontab entries,
sqlite contents; see ``envs/data/harness/state_checker.py``). The checker runs
from ``python3 -I -c`` (no file an agent's leftover process could swap) with
services the agent started still alive, since they are part of the state. Its
HMAC-signed report is the verdict. ``passed`` needs every check to hold.

When the task lists ``hidden.goal_checks`` (the checks that fail in the
initial state, found when the task is compiled), the score is 0 if any other
check broke (the agent destroyed something that was fine) and otherwise the
share of goal checks that hold, so doing nothing scores 0. Without it, the
score is the share of all checks that hold.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from envs.verifiers.base import Verification, Verifier, VerifyContext, register_verifier
from envs.verifiers.harness import HARNESS_DIR

CHECK_TYPES = ("file", "tree", "command", "http", "tcp", "cron", "sqlite")


def validate_checks(checks: Any, where: str) -> None:
    """Raises ValueError naming ``where`` unless ``checks`` is a non-empty list of known, uniquely named checks."""
    if not isinstance(checks, list) or not checks:
        raise ValueError(f"{where}: expected a non-empty list of checks")
    names = set()
    for i, check in enumerate(checks):
        if not isinstance(check, Mapping) or check.get("type") not in CHECK_TYPES:
            raise ValueError(f"{where}[{i}].type: expected one of {CHECK_TYPES}, got {check!r:.80}")
        name = check_name(check, i)
        if name in names:
            raise ValueError(f"{where}[{i}].name: {name!r} is used twice")
        names.add(name)


def check_name(check: Mapping[str, Any], index: int) -> str:
    """The name a check reports under (the same rule as the in-sandbox checker)."""
    return check.get("name") or f"{check['type']}#{index}"


def run_state_checks(sandbox: Any, checks: Sequence[Mapping[str, Any]], *, timeout_s: float = 120.0) -> list[dict]:
    """Runs the checks in the sandbox; returns ``[{"name", "ok", "detail"}]`` (all failed if unreadable)."""
    nonce = secrets.token_hex(16)
    source = (HARNESS_DIR / "state_checker.py").read_text()
    request = json.dumps({"checks": list(checks), "nonce": nonce})
    result = sandbox.exec(["python3", "-I", "-B", "-c", source], stdin=request, timeout=timeout_s)
    failed = [
        {"name": check_name(c, i), "ok": False, "detail": "the checker did not report"} for i, c in enumerate(checks)
    ]
    try:
        envelope = json.loads(result.stdout_text)
        body = envelope["body"]
        mac = hmac.new(nonce.encode(), body.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(mac, str(envelope["mac"])):
            return [dict(f, detail="the checker's report was forged") for f in failed]
        return json.loads(body)
    except (ValueError, KeyError, TypeError):
        tail = (result.stdout_text + result.stderr_text)[-300:]
        return [dict(f, detail=f"the checker did not report (exit {result.exit_code}): {tail}") for f in failed]


@register_verifier("sandbox_state")
class SandboxStateVerifier(Verifier):
    """Share of ``task.hidden["checks"]`` that hold in the final sandbox state."""

    role = "outcome"
    OPTIONS = {"timeout_s": 120.0}

    def check(self, ctx: VerifyContext) -> Verification:
        checks = ctx.task.hidden.get("checks")
        validate_checks(checks, f"task {ctx.task.id!r} hidden.checks")
        results = run_state_checks(ctx.sandbox, checks, timeout_s=self.options["timeout_s"])
        ok = {r["name"]: r["ok"] for r in results}
        passed = all(ok.values())
        goals = ctx.task.hidden.get("goal_checks")
        if goals:
            broken = [name for name, good in ok.items() if name not in goals and not good]
            score = 0.0 if broken else sum(1 for g in goals if ok.get(g)) / len(goals)
        else:
            score = sum(ok.values()) / len(ok)
        return self.result(score, passed=passed, details={"checks": results, "goal_checks": goals or []})
