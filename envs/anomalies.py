"""Who failed: the harness (an anomaly, excluded from the loss) or the policy (reward 0, a named kind).

Anomalies are dropped from the loss and re-queued, so a policy that can turn its
own failing episode into an anomaly escapes its zero reward ("anomaly
hacking"). Everything the policy leaves behind (a full disk, exhausted inodes
or pids, pinned System V memory, processes that flood or wedge the in-sandbox
agent) must therefore end as the *policy's* failure. This module decides that,
once, for every domain (:meth:`envs.core.AgentEnv._verify` calls it):

1. A cause outside the episode's reach (no daemon, no image, no free host: the
   :data:`HARNESS_CAUSES`) stays an anomaly; nothing the policy wrote can do that.
2. Any other sandbox failure is re-judged once in a *fresh* sandbox: the final
   workspace copied over by snapshot when the old sandbox still answers, else
   the episode's tool calls replayed from the task's start state.
3. If the fresh judge gives a verdict, that is the verdict. If it fails the
   same way, the failure travels with the policy's work: reward 0 and a
   :class:`FailureKind` in ``details["failure_kind"]``. A replay that does not
   reproduce the failure leaves the anomaly standing (a sandbox killed from the
   host, a crashed machine: real infrastructure).

A failed (non-anomalous) verdict also carries the kind when the resource probe
(:func:`hazards`, :func:`hazard_kind`) shows the policy exhausted something, so
metrics can count how often policies break their sandboxes.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Mapping
from typing import Any

from envs.tools import ToolContext
from envs.verifiers import Verification
from sandbox import Sandbox, SandboxInfraError, SandboxSpec

FAILURE_KIND = "failure_kind"  # the details key every kind is recorded under


class FailureKind(enum.StrEnum):
    """Why a policy's episode scored 0 although the judge could not finish normally."""

    EXHAUSTED_DISK = "policy_exhausted_disk"
    EXHAUSTED_INODES = "policy_exhausted_inodes"
    EXHAUSTED_PIDS = "policy_exhausted_pids"
    PINNED_MEMORY = "policy_pinned_memory"
    LEFT_PROCESSES = "policy_left_processes"
    # The judge failed as infrastructure in the episode's sandbox and again in a fresh one.
    BROKE_SANDBOX = "policy_broke_sandbox"


NO_FRESH_SANDBOX = "no_fresh_sandbox"  # the re-judging sandbox would be the episode's own (a lender's)
# Causes (SandboxInfraError.cause) no command inside a sandbox can produce: they stay anomalies.
HARNESS_CAUSES = frozenset(
    {
        "daemon_unreachable",
        "backend_unavailable",
        "image_missing",
        "host_unavailable",
        "pool_timeout",
        "start_failed",
        NO_FRESH_SANDBOX,
    }
)
_CAUSE = re.compile(r"\bsandbox_([a-z_]+):")
# The writable mounts a policy can fill and a judge needs (not the judge's own home, nor /dev/mqueue).
FILLABLE = ("/workspace", "/tmp", "/dev/shm")
# Below this many free processes the policy has taken the pid budget (the judge needs a few).
PID_HEADROOM = 8


def sandbox_cause(anomaly: str | None) -> str | None:
    """The sandbox cause inside an anomaly string (``"outcome: sandbox_agent_unresponsive: ..."``), or None."""
    match = _CAUSE.search(anomaly or "")
    return match.group(1) if match else None


def policy_may_cause(anomaly: str | None) -> bool:
    """True for a sandbox failure a command inside the sandbox could have brought about."""
    cause = sandbox_cause(anomaly)
    return cause is not None and cause not in HARNESS_CAUSES


def hazards(sandbox: Sandbox | None) -> dict[str, Any]:
    """What the policy left behind or used up: processes, System V objects, free blocks and inodes per mount.

    From the agent in one round trip, nothing spawned (it runs around every verification). Taken before
    the judge kills anything (``ipc`` outlives the kill) and again after it (its own files count, and a full
    mount is what starved it); ``{}`` when the sandbox no longer answers.
    """
    if sandbox is None or not sandbox.healthy:
        return {}
    try:
        return sandbox.resources()
    except SandboxInfraError:
        return {}


def hazard_kind(found: Mapping[str, Any], after: Mapping[str, Any], spec: SandboxSpec) -> FailureKind | None:
    """The resource the policy exhausted, most specific first, or None.

    ``found`` is :func:`hazards` before the judge ran, ``after`` the same after it (for space).
    """
    space = {path: free for path, free in after.get("space", {}).items() if path in FILLABLE}
    if any(blocks == 0 for blocks, _ in space.values()):
        return FailureKind.EXHAUSTED_DISK
    if any(inodes == 0 for _, inodes in space.values()):
        return FailureKind.EXHAUSTED_INODES
    processes = found.get("processes", 0)
    if processes >= spec.pids - PID_HEADROOM:
        return FailureKind.EXHAUSTED_PIDS
    if any(item and item[0] == "shm" for item in found.get("ipc", ())):
        return FailureKind.PINNED_MEMORY
    if processes > 0:
        return FailureKind.LEFT_PROCESSES
    return None


def policy_failure(kind: FailureKind, first: Verification, details: Mapping[str, Any]) -> Verification:
    """Reward 0, not passed, no anomaly: the policy's own doing, with what showed it."""
    return Verification(
        reward=0.0,
        passed=False,
        components={"outcome": 0.0},
        details={FAILURE_KIND: kind.value, "anomaly_in_episode_sandbox": first.anomaly, **details},
        verifier=first.verifier or "env",
    )


def with_kind(result: Verification, kind: FailureKind | None) -> Verification:
    """``result`` with ``details["failure_kind"]`` set, for a failed verdict; unchanged otherwise."""
    if kind is None or result.passed or result.is_anomaly:
        return result
    return Verification(**{**result.to_dict(), "details": {**result.details, FAILURE_KIND: kind.value}})


def settle(
    first: Verification,
    *,
    kind: FailureKind | None,
    snapshot: Callable[[], Any] | None,
    rejudge: Callable[[Any], Verification],
) -> Verification:
    """Re-judges a policy-causable anomaly once in a fresh sandbox and says whose failure it is.

    Args:
      first: the anomalous verdict from the episode's sandbox.
      kind: what the resource probe saw (:func:`hazard_kind`), or None.
      snapshot: copies the final workspace out of the episode's sandbox; None when that sandbox no
        longer answers (then ``rejudge`` replays the episode instead, and must reproduce the failure).
      rejudge: judges again in a fresh sandbox, from the snapshot (or None: replay); its
        :class:`SandboxInfraError` means the fresh sandbox broke too.
    """
    if not policy_may_cause(first.anomaly):
        return first
    copied = None
    if snapshot is not None:
        try:
            copied = snapshot()
        except SandboxInfraError:
            copied = None  # the snapshot itself broke the old sandbox (e.g. a huge file): replay instead
    how = "snapshot" if copied is not None else "replay"
    try:
        second = rejudge(copied)
    except SandboxInfraError as exc:
        if exc.cause in HARNESS_CAUSES:
            return first  # no fresh sandbox to be had: the harness's problem, not a verdict on the policy
        second = Verification.anomalous(f"sandbox_{exc.cause}: {exc}", verifier="env")
    evidence = {"reverified_by": how, "anomaly_in_fresh_sandbox": second.anomaly}
    if not second.is_anomaly:
        if how == "replay" and kind is None:
            # The replay judged cleanly: the old sandbox's failure did not travel with the policy's work.
            return first
        return with_kind(
            Verification(**{**second.to_dict(), "details": {**second.details, "reverified_by": how}}), kind
        )
    if not policy_may_cause(second.anomaly):
        return first
    return policy_failure(kind or FailureKind.BROKE_SANDBOX, first, evidence)


def replay(env: Any, sandbox: Sandbox) -> None:
    """Runs ``env``'s episode's tool calls again in ``sandbox`` from the task's start state, outputs discarded.

    ``env`` is the :class:`envs.core.AgentEnv` whose episode ended; ``submit`` and malformed calls ran nothing.
    """
    env.setup_sandbox(sandbox, env.task)
    ctx = ToolContext(sandbox, env.task, env.tool_timeout_s, env.max_tool_output_chars)
    for record in env.episode.tool_calls:
        if record.malformed or record.name not in env.tools or record.name == "submit":
            continue
        scratch = f"/tmp/.agentrl-{record.turn}-{record.index}"
        env.tools[record.name](dataclasses.replace(ctx, scratch=scratch), record.arguments)
