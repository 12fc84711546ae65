"""``sandbox_state``: the outcome of shell / system-operations tasks, from the sandbox's final state.

``task.hidden["checks"]`` lists declarative checks (what each means:
:mod:`envs.domains.shell.rules`). Nothing that decides the verdict runs where
the agent's code can reach it:

1. Services first, and only for tasks that declare ``metadata.keep_services``:
   the ``http``/``tcp`` checks are probed by the checker as the judge (uid
   1001), while the agent's processes still run. Those processes cannot see,
   signal or read a process of another uid; the request and the answer travel
   over the exec's own pipes to the sandbox agent.
2. ``kill_all``: no process of the agent survives to watch, race or rewrite
   what follows (a leftover process reading the checker's request from
   ``/proc/<pid>/fd/0`` and writing a forged report to its ``fd/1`` was the
   known hack).
3. The rest, in order, in segments cut after each ``cron`` check with
   ``run: true``: files, trees, crontabs and databases are observed as the
   agent's uid (owner-only files are part of the state; nothing of that uid is
   alive any more), commands run as the judge with git hardened
   (``envs/in_sandbox/git_env.py``). The crontab command, which is agent
   code, runs in an exec of its own as the agent's user, after the paths of
   ``metadata.reset_before_cron`` were put back as the task made them, and
   ``kill_all`` follows it before anything else is looked at.

The in-sandbox checker (``in_sandbox/state_checker.py``) only reports
what it saw; every comparison with an expected value happens here, on the
host, so no expected value ever enters the sandbox and there is no report to
forge (the HMAC and nonce of the earlier design are gone with that reason).
An unreadable file, a FIFO, a symlink into ``/proc``, a full disk: each fails
its check; only :class:`sandbox.SandboxInfraError` makes an anomaly.

The reward is all or nothing: 1 when every check holds, else 0. A share of
checks would pay near misses (a stand-in service that gets the config right,
an archive with the right names) a part of the reward, and a policy climbs
any slope it is given. The share of ``hidden.goal_checks`` that hold (the
checks that fail in the initial state, found when the task is compiled) is
kept in ``details["goal_share"]`` for reading runs, 0 if any other check broke.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envs.domains.shell.rules import (
    CHECK_TYPES,
    NETWORK_TYPES,
    Verdict,
    check_name,
    cron_resets,
    find_cron,
    judge,
    keeps_services,
    mode_of,
    request_for,
    validate_checks,
    with_nonce,
)
from envs.in_sandbox import bundle, shared, source
from envs.verifiers.base import Verification, Verifier, VerifyContext, register_verifier
from sandbox import SandboxFileError, SandboxUsageError

__all__ = ["CHECK_TYPES", "SandboxStateVerifier", "ask_checker", "check_name", "run_state_checks", "validate_checks"]

WORKSPACE = "/workspace"
CHECKER = bundle(
    source(Path(__file__).resolve().parent / "in_sandbox" / "state_checker.py"), {"git_env": shared("git_env")}
)
USERS = {"observe": "sandbox", "commands": "judge", "network": "judge"}
CRON_TIMEOUT_S = 20.0
MAX_CRON_COMMAND = 64 << 10


def ask_checker(sandbox: Any, mode: str, items: Sequence[Mapping[str, Any]], *, timeout_s: float) -> list[dict]:
    """One checker run in ``mode`` over ``items``; one observation each (``{"error"}`` ones if it did not report)."""
    if not items:
        return []
    request = json.dumps({"mode": mode, "items": list(items), "budget_s": max(timeout_s - 10.0, timeout_s / 2)})
    result = sandbox.exec(
        ["python3", "-I", "-B", "-c", CHECKER], stdin=request, user=USERS[mode], cwd="/", timeout=timeout_s
    )
    try:
        observations = json.loads(result.stdout_text)["observations"]
        if len(observations) == len(items) and all(isinstance(o, dict) for o in observations):
            return observations
    except (ValueError, KeyError, TypeError):
        pass
    why = "timed out" if result.timed_out else f"exit {result.exit_code}"
    tail = (result.stdout_text + result.stderr_text)[-300:]
    return [{"error": f"the checker did not report ({why}): {tail}"} for _ in items]


def run_cron_command(sandbox: Any, command: str) -> Verdict:
    """Runs a crontab command (agent code) as the agent's user, then kills whatever it left running."""
    if "\0" in command or len(command.encode("utf-8", "surrogateescape")) > MAX_CRON_COMMAND:
        return False, "the crontab command cannot be run (NUL byte or longer than 64 KiB)"
    try:
        result = sandbox.exec(["bash", "-c", command], cwd=WORKSPACE, timeout=CRON_TIMEOUT_S, user="sandbox")
    except SandboxUsageError as exc:
        return False, f"the crontab command cannot be run: {exc}"
    finally:
        sandbox.kill_all()
    ok = result.exit_code == 0 and not result.timed_out
    status = f"exit {result.exit_code}" + (" (timed out)" if result.timed_out else "")
    tail = (result.stdout_text + result.stderr_text)[-200:]
    return ok, f"ran {command[:200]!r} as the agent's user: {status}, output {tail!r}"


def reset_paths(sandbox: Any, paths: Sequence[str], initial_files: Mapping[str, str]) -> str | None:
    """Puts workspace ``paths`` back as the task made them (before a cron job runs); returns a problem or None."""
    if not paths:
        return None
    removed = sandbox.exec(["rm", "-rf", "--", *paths], cwd=WORKSPACE, user="sandbox", timeout=60)
    if not removed.ok:
        return f"cannot reset {list(paths)} before running the job: {removed.stderr_text[-200:]}"
    under = {p: c for p, c in initial_files.items() if any(p == r or p.startswith(r + "/") for r in paths)}
    try:
        sandbox.write_files(under)
    except SandboxFileError as exc:
        return f"cannot reset {list(paths)} before running the job: {exc}"
    return None


def _judge_segment(
    sandbox: Any,
    checks: Sequence[Mapping[str, Any]],
    indices: list[int],
    verdicts: dict[int, Verdict],
    timeout_s: float,
    reset: tuple[Sequence[str], Mapping[str, str]],
) -> None:
    """Observes (as the agent's uid), then runs commands (as the judge), then a closing crontab command."""
    cron: tuple[int, str] | None = None
    for mode in ("observe", "commands"):
        group = [i for i in indices if mode_of(checks[i]) == mode]
        observations = ask_checker(sandbox, mode, [request_for(checks[i]) for i in group], timeout_s=timeout_s)
        for i, obs in zip(group, observations, strict=True):
            verdicts[i] = judge(checks[i], obs)
            if checks[i]["type"] == "cron" and checks[i].get("run") and verdicts[i][0]:
                cron = (i, find_cron(checks[i], obs)[0])
    if cron is not None:
        problem = reset_paths(sandbox, *reset)
        verdicts[cron[0]] = (False, problem) if problem else run_cron_command(sandbox, cron[1])


def run_state_checks(
    sandbox: Any,
    checks: Sequence[Mapping[str, Any]],
    *,
    keep_services: bool = False,
    reset_before_cron: Sequence[str] = (),
    initial_files: Mapping[str, str] | None = None,
    timeout_s: float = 120.0,
) -> list[dict]:
    """Runs the checks (see the module docstring); returns ``[{"name", "ok", "detail"}]`` in check order.

    Kills every process in the sandbox. With ``keep_services`` False the http/tcp checks fail unprobed.
    ``reset_before_cron`` paths are reset to ``initial_files`` (the task's files) before a cron job runs.
    """
    reset = (list(reset_before_cron), dict(initial_files or {}))
    checks = [with_nonce(c, secrets.token_hex(8)) for c in checks]
    verdicts: dict[int, Verdict] = {}
    live = [i for i, c in enumerate(checks) if c["type"] in NETWORK_TYPES]
    if keep_services:
        observations = ask_checker(sandbox, "network", [request_for(checks[i]) for i in live], timeout_s=timeout_s)
        verdicts.update({i: judge(checks[i], obs) for i, obs in zip(live, observations, strict=True)})
    else:
        why = "no process outlives the agent's turn unless the task declares metadata.keep_services"
        verdicts.update({i: (False, why) for i in live})
    sandbox.kill_all()
    segment: list[int] = []
    for i, check in enumerate(checks):
        if i in verdicts:
            continue
        segment.append(i)
        if check["type"] == "cron" and check.get("run"):
            _judge_segment(sandbox, checks, segment, verdicts, timeout_s, reset)
            segment = []
    if segment:
        _judge_segment(sandbox, checks, segment, verdicts, timeout_s, reset)
    return [
        {"name": check_name(c, i), "ok": bool(verdicts[i][0]), "detail": str(verdicts[i][1])[:500]}
        for i, c in enumerate(checks)
    ]


@register_verifier("sandbox_state")
class SandboxStateVerifier(Verifier):
    """Share of ``task.hidden["checks"]`` that hold in the final sandbox state."""

    role = "outcome"
    OPTIONS = {"timeout_s": 120.0}

    def check(self, ctx: VerifyContext) -> Verification:
        task = ctx.task
        checks = task.hidden.get("checks")
        validate_checks(checks, f"task {task.id!r} hidden.checks")
        keep = keeps_services(task.id, task.metadata, checks)
        resets = cron_resets(task.id, task.metadata, checks)
        results = run_state_checks(
            ctx.sandbox,
            checks,
            keep_services=keep,
            reset_before_cron=resets,
            initial_files=task.files,
            timeout_s=self.options["timeout_s"],
        )
        ok = {r["name"]: r["ok"] for r in results}
        passed = all(ok.values())
        goals = task.hidden.get("goal_checks")
        if goals:
            broken = [name for name, good in ok.items() if name not in goals and not good]
            share = 0.0 if broken else sum(1 for g in goals if ok.get(g)) / len(goals)
        else:
            share = sum(ok.values()) / len(ok)
        details = {"checks": results, "goal_checks": goals or [], "goal_share": share, "keep_services": keep}
        return self.result(1.0 if passed else 0.0, passed=passed, details=details)
