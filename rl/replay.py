r"""Re-execute recorded episodes in fresh sandboxes and report any divergence.

    python -m rl.replay runs/q/trajectories/step_00000012.jsonl [--row 3] [--backend bwrap] [--repeats 2]

Every recorded assistant turn is fed again, verbatim, to a fresh environment of
the same domain on the same task; each tool call's output and exit code, and
the final verification, are compared with the recording. A difference means
the environment is nondeterministic (clocks, randomness, network) or the
verdict is flaky — both worth knowing before trusting a reward. Exit status 1
if anything diverged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import envs  # noqa: F401 - registers the domains
from envs import Task, env_for_domain
from rl.trajectory import read_step, read_tasks


def _strip_timing(call: dict[str, Any]) -> dict[str, Any]:
    return {k: call.get(k) for k in ("name", "arguments", "output", "exit_code", "timed_out", "error")}


def replay_episode(
    record: dict[str, Any], task: Task, *, backend: str = "bwrap", max_turns: int | None = None
) -> list[str]:
    """Replays one recorded episode; returns human-readable divergences (empty: identical)."""
    cls = env_for_domain(task.domain)
    turns = record.get("turns", [])
    env = cls(tasks=[task], backend=backend, max_turns=max_turns or max(2, len(turns)))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("trajectory", type=Path, help="a trajectories/step_XXXXXXXX.jsonl file")
    parser.add_argument("--row", type=int, action="append", help="episode row(s) to replay (default: all)")
    parser.add_argument("--backend", default="bwrap", choices=["bwrap", "docker"])
    parser.add_argument("--repeats", type=int, default=1, help="replay each episode this many times")
    args = parser.parse_args(argv)
    if not args.trajectory.exists():
        print(f"error: {args.trajectory} does not exist", file=sys.stderr)
        return 2
    records = read_step(args.trajectory, arrays=False)
    tasks = read_tasks(args.trajectory)
    chosen = [r for r in records if args.row is None or r["row"] in args.row]
    diverged = 0
    for record in chosen:
        task = tasks.get(record["task_id"])
        if task is None:
            print(f"row {record['row']}: task {record['task_id']} is not in the step's task file", file=sys.stderr)
            diverged += 1
            continue
        for r in range(args.repeats):
            problems = replay_episode(record, task, backend=args.backend)
            status = "identical" if not problems else f"{len(problems)} divergence(s)"
            print(f"row {record['row']:4d} {record['task_id']:40s} repeat {r + 1}: {status}")
            for p in problems:
                print(f"    - {p}")
            diverged += bool(problems)
    print(json.dumps({"episodes": len(chosen), "repeats": args.repeats, "diverged": diverged}))
    return 1 if diverged else 0


if __name__ == "__main__":
    sys.exit(main())
