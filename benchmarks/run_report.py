"""Where a finished run's time went and how it learned, from its ``metrics.jsonl``: the tables of
docs/repair_from_scratch.md, for any run.

    python benchmarks/run_report.py runs/repair [--every 50]

Prints markdown:

- **phases**: wall time of SFT steps, SFT checks, held-out evaluations and RL steps (each from the
  step's own timers), and the process's elapsed time at the end;
- **SFT**: the loss (mean over the ``--every`` steps up to each row) and every check's pass rate;
- **evaluations**: greedy pass rate, sampled pass@1, tool calls per greedy episode, and the share of
  passing greedy episodes that re-ran the check after an edit, at every evaluation;
- **RL steps**: the step (less a held-out evaluation it ran) and its split (prefill, decode, tools, judge, learner, waiting), reward,
  pass rate, the engine's average active slots and padded / real prefill tokens.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rl.run.metrics import read_metrics  # noqa: E402

SPLIT = ("time/prefill_s", "time/decode_s", "time/tools_s", "time/verify_s", "time/learn_s", "time/wait_s")


def _f(value: Any, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def phases(rows: list[dict[str, Any]]) -> str:
    sft = [r for r in rows if "sft/loss" in r]
    rl = [r for r in rows if r.get("phase") == "rl" and "time/step_s" in r]
    parts = {
        "SFT steps": sum(r.get("time/learn_s", 0.0) for r in sft),
        "SFT checks": sum(r.get("time/check_s", 0.0) for r in rows),
        "held-out evaluations": sum(r.get("time/eval_s", 0.0) for r in rows),
        "RL steps": sum(r["time/step_s"] - r.get("time/eval_s", 0.0) for r in rl),  # a step's time holds its eval
    }
    elapsed = max((r.get("time/elapsed_s", 0.0) for r in rows), default=0.0)
    lines = ["| phase | wall | share of the run |", "|---|---:|---:|"]
    lines += [f"| {k} | {v / 60:.1f} min | {v / elapsed:.0%} |" for k, v in parts.items() if elapsed]
    if elapsed:
        rest = elapsed - sum(parts.values())
        lines.append(
            f"| the rest: start-up, the evaluation at init, checkpoints | {rest / 60:.1f} min | {rest / elapsed:.0%} |"
        )
    lines.append(f"| the run (elapsed at its last step) | {elapsed / 60:.1f} min | |")
    return "\n".join(lines)


def sft_curve(rows: list[dict[str, Any]], every: int) -> str:
    sft = [r for r in rows if "sft/loss" in r]
    checks = {r["step"]: r["sft/check_pass_rate"] for r in rows if "sft/check_pass_rate" in r}
    lines = ["| SFT step | loss (mean of the last steps) | check pass rate |", "|---:|---:|---:|"]
    for end in range(every, len(sft) + every, every):
        window = sft[max(0, end - every) : end]
        if not window:
            break
        step = window[-1]["step"]
        loss = sum(r["sft/loss"] for r in window) / len(window)
        lines.append(f"| {step} | {loss:.3f} | {_f(checks.get(step))} |")
    return "\n".join(lines)


def evaluations(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| eval | greedy pass rate | pass@1 (sampled) | tool calls / greedy episode | passing that re-checked |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "eval/greedy_pass_rate" not in r:
            continue
        where = r.get("phase", "?") if r.get("phase") != "rl" else f"RL step {r['step']}"
        lines.append(
            f"| {where} | {r['eval/greedy_pass_rate']:.3f} | {_f(r.get('eval/pass@1'))} "
            f"| {_f(r.get('eval_greedy/tool_calls_mean'), '.2f')} | {_f(r.get('eval_greedy/passing_rechecked'), '.2f')} |"
        )
    return "\n".join(lines)


def rl_steps(rows: list[dict[str, Any]]) -> str:
    head = "| step | RL step s | prefill | decode | tools | judge | learner | wait | reward | pass rate "
    head += "| active slots | prefill padded / real |"
    lines = [head, "|---:|" + "---:|" * 11]
    for r in rows:
        if r.get("phase") != "rl" or "time/step_s" not in r:
            continue
        split = " | ".join(f"{r.get(k, 0.0):.1f}" for k in SPLIT)
        real = r.get("rollout/prefill_tokens", 0.0)
        padded = r.get("rollout/prefill_tokens_padded", 0.0) / real if real else None
        lines.append(
            f"| {r['step']} | {r['time/step_s'] - r.get('time/eval_s', 0.0):.1f} | {split} | {_f(r.get('rollout/reward_mean'))} "
            f"| {_f(r.get('rollout/pass_rate'))} | {_f(r.get('rollout/active_slots_mean'), '.1f')} "
            f"| {_f(padded, '.2f')}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", help="a run's workdir (holds metrics.jsonl)")
    parser.add_argument("--every", type=int, default=50, help="SFT rows every this many steps")
    args = parser.parse_args(argv)
    if args.every < 1:
        parser.error(f"--every: expected >= 1, got {args.every}")
    rows = read_metrics(args.workdir)
    if not rows:
        parser.error(f"workdir: no metrics.jsonl records in {args.workdir}")
    for title, table in (
        ("Phases", phases(rows)),
        ("SFT", sft_curve(rows, args.every)),
        ("Evaluations", evaluations(rows)),
        ("RL steps", rl_steps(rows)),
    ):
        print(f"### {title}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
