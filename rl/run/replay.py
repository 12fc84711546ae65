"""Re-execute a recorded episode in a fresh sandbox and list how it diverges (``python -m rl.replay``).

Every recorded assistant turn is fed again, verbatim, to a fresh environment of
the same domain on the same task; each tool call's output and exit code, and
the final verification, are compared with the recording. A difference means
the environment is nondeterministic (clocks, randomness, network) or the
verdict is flaky — both worth knowing before trusting a reward.
"""

from __future__ import annotations

from typing import Any

import envs  # noqa: F401 - registers the domains
from envs import Task, env_for_domain
from rl.rollout.episode_driver import ENV_MIN_TURNS


def _strip_timing(call: dict[str, Any]) -> dict[str, Any]:
    return {k: call.get(k) for k in ("name", "arguments", "output", "exit_code", "timed_out", "error")}


def replay_episode(
    record: dict[str, Any], task: Task, *, backend: str = "bwrap", max_turns: int | None = None
) -> list[str]:
    """Replays one recorded episode; returns human-readable divergences (empty: identical)."""
    cls = env_for_domain(task.domain)
    turns = record.get("turns", [])
    env = cls(tasks=[task], backend=backend, max_turns=max_turns or max(ENV_MIN_TURNS, len(turns)))
    problems: list[str] = []
    try:
        env.reset(seed=record.get("seed"), options={"task": task})
        info: dict[str, Any] = {}
        calls: list[dict[str, Any]] = []
        for i, turn in enumerate(turns):
            _, _, terminated, truncated, info = env.step(turn["completion"])
            calls += info.get("tool_calls", [])
            if terminated or truncated:
                if i != len(turns) - 1:
                    problems.append(f"episode ended at turn {i + 1} of {len(turns)} recorded")
                break
        recorded = record.get("tool_calls", [])
        if len(calls) != len(recorded):
            problems.append(f"{len(calls)} tool calls replayed, {len(recorded)} recorded")
        for n, (new, old) in enumerate(zip(calls, recorded, strict=False)):
            a, b = _strip_timing(new), _strip_timing(old)
            for key in a:
                if a[key] != b[key]:
                    problems.append(
                        f"tool call {n} ({a['name']}): {key} differs: recorded {b[key]!r:.200} vs {a[key]!r:.200}"
                    )
        old_v, new_v = record.get("verification") or {}, info.get("verification") or {}
        if record.get("end_reason") in ("context_budget", "reset_failed", "env_error"):
            return problems  # the rollout scored these itself
        for key in ("reward", "passed", "anomaly"):
            if old_v.get(key) != new_v.get(key):
                problems.append(f"verification {key}: recorded {old_v.get(key)!r} vs replayed {new_v.get(key)!r}")
    finally:
        env.close()
    return problems
