"""Process and efficiency verifiers that every domain can compose with its outcome.

* ``tool_format`` (process): the share of tool calls that were well-formed and
  named a real tool. Shaping for the call format, never decisive.
* ``turn_efficiency`` (efficiency): fewer turns (and optionally less tool time)
  score higher. Gated by the outcome by default (see ``compose``), so a quick
  give-up earns nothing.
* ``code_compiles`` (process): the share of the workspace's Python files that
  byte-compile, checked inside the sandbox.
"""

from __future__ import annotations

import json

from envs.verifiers.base import Verification, Verifier, VerifyContext, register_verifier

_COMPILE_ALL = r"""
import json, os, sys
root = sys.argv[1]
total, bad = 0, []
for d, dirs, files in os.walk(root):
    dirs[:] = [x for x in dirs if not x.startswith('.') and x != '__pycache__']
    for name in files:
        if name.endswith('.py'):
            path = os.path.join(d, name)
            total += 1
            try:
                with open(path, 'rb') as f:
                    compile(f.read(), path, 'exec', dont_inherit=True)
            except (SyntaxError, ValueError, OSError) as exc:
                bad.append([os.path.relpath(path, root), str(exc)[:200]])
print(json.dumps({'total': total, 'bad': bad}))
"""


@register_verifier("tool_format")
class ToolFormatVerifier(Verifier):
    """Share of tool calls that parsed and named an available tool (1.0 if none were made)."""

    role = "process"
    needs_sandbox = False

    def check(self, ctx: VerifyContext) -> Verification:
        calls = list(getattr(ctx.episode, "tool_calls", []) or [])
        malformed = [c for c in calls if c.malformed]
        score = 1.0 - len(malformed) / len(calls) if calls else 1.0
        return self.result(score, passed=not malformed, details={"calls": len(calls), "malformed": len(malformed)})


@register_verifier("turn_efficiency")
class TurnEfficiencyVerifier(Verifier):
    """1.0 for a one-turn episode, falling linearly to 1/max_turns at the budget.

    With ``tool_time_budget_s`` set, the score is also scaled by the share of that
    budget left unused by tool execution time.
    """

    role = "efficiency"
    needs_sandbox = False
    OPTIONS = {"tool_time_budget_s": None}

    def check(self, ctx: VerifyContext) -> Verification:
        turns = max(int(getattr(ctx.episode, "turns", 1) or 1), 1)
        max_turns = max(int(ctx.max_turns), 1)
        score = max(0.0, (max_turns - turns + 1) / max_turns)
        details = {"turns": turns, "max_turns": max_turns}
        budget = self.options["tool_time_budget_s"]
        if budget:
            spent = float(getattr(ctx.episode, "tool_time_s", 0.0))
            score *= max(0.0, 1.0 - spent / float(budget))
            details["tool_time_s"] = round(spent, 3)
        return self.result(score, passed=True, details=details)


@register_verifier("code_compiles")
class CodeCompilesVerifier(Verifier):
    """Share of ``*.py`` files under the workspace that compile (1.0 when there are none)."""

    role = "process"
    OPTIONS = {"root": "/workspace"}

    def check(self, ctx: VerifyContext) -> Verification:
        result = ctx.sandbox.exec(["python3", "-I", "-c", _COMPILE_ALL, self.options["root"]], timeout=60)
        if not result.ok:
            return self.result(0.0, details={"error": result.stderr_text[-500:]})
        report = json.loads(result.stdout_text)
        total, bad = report["total"], report["bad"]
        score = 1.0 - len(bad) / total if total else 1.0
        return self.result(score, passed=not bad, details={"files": total, "failing": bad[:20]})
