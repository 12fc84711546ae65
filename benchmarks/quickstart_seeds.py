"""The quickstart on several seeds: does it learn on every one, and how soon?

    python benchmarks/quickstart_seeds.py                      # seeds 0..4, runs/quickstart_seeds/seed_N
    python benchmarks/quickstart_seeds.py --seeds 0 1 --workdir /tmp/qs -- --config.sft.steps=300
    python benchmarks/quickstart_seeds.py --jobs 5             # all seeds at once: same figures, slower minutes
    python benchmarks/quickstart_seeds.py --config configs/repair_from_scratch.py --seeds 0 1 2 --workdir runs/repair_seeds

Runs ``python -m rl.train --config=configs/quickstart.py`` (or ``--config``) once per seed, one after the
other or ``--jobs`` at a time (each in its own process and workdir; flags after ``--`` go to
every run; a run's figures do not depend on its neighbours, only its minutes do), watches
each run's ``metrics.jsonl`` as it is written, and prints a markdown table: the SFT loss
over its last 10 steps (below ~0.2 means the copy skill arrived), the held-out greedy pass rate at every
evaluation (random init, after SFT, each RL evaluation), the final sampled pass@1 and
pass@4, the minutes from process start to the first greedy pass rate >= 0.9, the
run's total minutes and its peak RSS, with the machine it ran on. Wall times are the process's (start-up
included), so a loaded machine inflates them: the machine line carries the load average.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.machine import describe_machine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.9  # greedy pass rate whose first appearance is timed


def _read_new(path: Path, seen: int) -> tuple[list[dict[str, Any]], int]:
    """Complete lines of ``path`` past byte ``seen`` (a torn last line waits for the next poll)."""
    if not path.exists():
        return [], seen
    with open(path, "rb") as f:
        f.seek(seen)
        data = f.read()
    end = data.rfind(b"\n") + 1
    rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return rows, seen + end


DEFAULT_CONFIG = "configs/quickstart.py"


def run_seed(
    seed: int, workdir: Path, extra: list[str], poll_s: float = 0.5, config: str = DEFAULT_CONFIG
) -> dict[str, Any]:
    """One run of ``config``; each metrics line is stamped with its arrival time since process start."""
    if workdir.exists():
        shutil.rmtree(workdir)
    cmd = [sys.executable, "-m", "rl.train", f"--config={config}", f"--workdir={workdir}"]
    cmd += [f"--config.seed={seed}", *extra]
    log = workdir.with_name(workdir.name + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    seen = 0
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # wait4: the run's own peak RSS
            done = pid != 0
            new, seen = _read_new(workdir / "metrics.jsonl", seen)
            now = time.perf_counter() - start
            rows += [{**r, "_wall_s": now} for r in new]
            if done:
                break
            time.sleep(poll_s)
    total = time.perf_counter() - start
    rc, rss_gb = os.waitstatus_to_exitcode(status), usage.ru_maxrss / 2**20  # ru_maxrss: KiB on Linux
    return {"seed": seed, "rc": rc, "rows": rows, "total_s": total, "rss_gb": rss_gb, "log": str(log)}


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    rows = run["rows"]
    sft = [r for r in rows if "sft/loss" in r]
    evals = [r for r in rows if "eval/greedy_pass_rate" in r]
    hit = next((r for r in evals if r["eval/greedy_pass_rate"] >= TARGET), None)
    last = evals[-1] if evals else {}
    ended = next((r["sft/ended_at"] for r in rows if "sft/ended_at" in r), None)  # a check ended SFT early
    return {
        "seed": run["seed"],
        "rc": run["rc"],
        "sft_loss": sum(r["sft/loss"] for r in sft[-10:]) / len(sft[-10:]) if sft else None,
        "sft_steps": int(ended) if ended is not None else len(sft),
        "greedy": [(r["step"], r["eval/greedy_pass_rate"]) for r in evals],
        "pass1": last.get("eval/pass@1"),
        "pass4": last.get("eval/pass@4"),
        "to_target_min": hit["_wall_s"] / 60 if hit else None,
        "to_target_step": hit["step"] if hit else None,
        "total_min": run["total_s"] / 60,
        "rss_gb": run["rss_gb"],
        "tool_calls": last.get("eval_greedy/tool_calls_mean"),
        "rechecked": last.get("eval_greedy/passing_rechecked"),
    }


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def table(summaries: list[dict[str, Any]]) -> str:
    lines = [
        "| seed | SFT steps | SFT loss (last 10 steps) | greedy: init → after SFT → evals (step) | pass@1 final "
        f"| pass@4 final | min to greedy ≥ {TARGET} (step) | total min | peak RSS GB "
        "| tool calls final (greedy) | passing re-checked final |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        greedy = " → ".join(f"{g:.3f}" + (f" ({step})" if i >= 2 else "") for i, (step, g) in enumerate(s["greedy"]))
        hit = f"{s['to_target_min']:.2f} ({s['to_target_step']})" if s["to_target_min"] is not None else "never"
        rc = "" if s["rc"] == 0 else f" (exit {s['rc']})"
        lines.append(
            f"| {s['seed']}{rc} | {s['sft_steps']} | {_fmt(s['sft_loss'])} | {greedy} | {_fmt(s['pass1'])} | {_fmt(s['pass4'])} "
            f"| {hit} | {s['total_min']:.2f} | {s['rss_gb']:.2f} | {_fmt(s['tool_calls'], '.2f')} | {_fmt(s['rechecked'], '.2f')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="the config file every seed runs")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--workdir", default="runs/quickstart_seeds", help="seed N runs in WORKDIR/seed_N")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (minutes then count shared cores)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs: expected >= 1, got {args.jobs}")
    base = Path(args.workdir)
    base = base if base.is_absolute() else ROOT / base
    summaries = []
    machine_before = describe_machine()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as workers:
        futures = [
            workers.submit(run_seed, seed, base / f"seed_{seed}", extra, config=args.config) for seed in args.seeds
        ]
        for seed, future in zip(args.seeds, futures, strict=True):
            run = future.result()
            summaries.append(summarize(run))
            s = summaries[-1]
            hit = "never" if s["to_target_min"] is None else f"{s['to_target_min']:.2f} min"
            print(
                f"seed {seed}: exit {run['rc']}, {s['total_min']:.2f} min, greedy >= {TARGET} at {hit} "
                f"(load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    print()
    jobs = f", {args.jobs} at a time" if args.jobs > 1 else ""
    print(f"{args.config} seeds{' with ' + ' '.join(extra) if extra else ''}{jobs}")
    print(f"machine at start: {machine_before}")
    print(f"machine at end:   {describe_machine()}")
    print()
    print(table(summaries))
    return 0 if all(s["rc"] == 0 for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
