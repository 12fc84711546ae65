r"""Re-execute recorded episodes in fresh sandboxes and report any divergence.

    python -m rl.replay runs/q/trajectories/step_00000012.jsonl [--row 3] [--backend bwrap] [--repeats 2]

Each chosen episode is replayed by :func:`rl.run.replay.replay_episode`: its
recorded turns fed again to a fresh environment, tool outputs, exit codes and
the verdict compared with the recording. Exit status 1 if anything diverged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rl.rollout.trajectory import read_step, read_tasks
from rl.run.replay import replay_episode


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
