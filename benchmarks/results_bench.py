"""How fast ``rl.results.load_run`` turns a 10k-episode run into tables, beside plain ``json.loads``.

A run is synthesised with :func:`rl.rollout.trajectory.write_step` at realistic sizes:
40 steps x 32 tasks x 8 episodes = 10,240 episodes of ~300 tokens each (a
system + user prompt, 2-3 assistant turns, a ``bash`` tool call with ~200
characters of output per non-final turn, a weighted verification with nested
details), two domains. Then, alternating, best of ``--rounds``:

* **reference**: ``json.loads`` of every line of every step file, then
  ``pd.DataFrame`` of the records (nested columns left as Python objects; no
  flattening, no tool-call table, no task table);
* **load_run**: ``load_run(workdir)`` + ``.episodes`` (flattened, verifier
  components as columns) + ``.task_table()`` + ``.sandbox_latencies()``;
* **refresh**: the same tables again after :meth:`Run.refresh` (what a notebook
  watching a live run pays per refresh when no step was added).

Also printed: one full episode with its token arrays (``Run.episode``). Goal:
the whole table build in seconds for 10k episodes.

    python benchmarks/results_bench.py [--steps 40] [--rounds 3] [--workdir /tmp/results-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pandas as pd  # noqa: E402

from benchmarks.machine import describe_machine  # noqa: E402
from rl.results import load_run  # noqa: E402
from rl.rollout.trajectory import EpisodeRecord, step_files, write_step  # noqa: E402

SYSTEM = "You are an agent working in a Linux sandbox. Use the tools to complete the task."
PROMPT = "The tests in tests/test_temperature.py fail. Fix units/temperature.py so that they pass, then submit."


def _text(rng: random.Random, n: int, alphabet: str = "abcdefghij klmnopqrstuvwxyz(),.:=\n") -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def synthetic_episode(rng: random.Random, step: int, group: int, index: int, domain: str) -> EpisodeRecord:
    """One realistic episode: ~300 tokens, 2-3 turns, a tool call per non-final turn."""
    e = EpisodeRecord(step, f"{domain}/train/{step * 32 + group:05d}", domain, group, index, rng.randrange(1 << 31))
    e.messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
    e.append([rng.randrange(256) for _ in range(60)], sampled=False)
    e.prompt_len = 60
    turns = rng.choice((2, 3))
    for t in range(turns):
        n = rng.randrange(50, 100)
        text = _text(rng, n)
        e.append([rng.randrange(256) for _ in range(n)], sampled=True, logprobs=[-rng.random() for _ in range(n)])
        turn = {"completion": text, "finish_reason": "stop", "tokens": n, "env_s": rng.random() * 0.05}
        if t < turns - 1:
            output = _text(rng, 200, "0123456789 .F\n") + "\n[exit code: 1]"
            call = {
                "turn": t + 1,
                "index": 0,
                "name": "bash",
                "arguments": {"command": "python3 -m pytest -q tests"},
                "output": output,
                "exit_code": rng.choice((0, 1)),
                "timed_out": False,
                "duration_s": rng.lognormvariate(-3.5, 0.5),
                "error": None,
                "malformed": False,
                "sandbox": {"backend": "bwrap", "image": "agentrl-sandbox:32e924d3e5"},
            }
            e.tool_calls.append(call)  # stored once per episode, with its turn (as the rollout stores them)
            e.append([rng.randrange(256) for _ in range(40)], sampled=False)
        e.turns.append(turn)
    passed = rng.random() < 0.4
    outcome = {"reward": float(passed), "passed": passed, "components": {"hidden_tests": float(passed)}}
    outcome.update(details={"passed": 3 * passed, "failed": 3 * (not passed)}, anomaly=None, verifier="hidden_tests")
    e.verification = {
        "reward": float(passed) + 0.1 / turns,
        "passed": passed,
        "components": {"outcome": float(passed), "efficiency": 1 / turns},
        "details": {"outcome": outcome},
        "anomaly": None if rng.random() > 0.01 else "sandbox_vanished: container gone",
        "verifier": "weighted",
        "duration_s": rng.random() * 0.2,
    }
    e.end_reason = "submit"
    e.sandbox = {
        "backend": "bwrap",
        "id": f"agentrl-{rng.randrange(1 << 40):010x}",
        "image": "agentrl-sandbox:32e924d3e5",
    }
    return e


def synthesise(workdir: Path, steps: int, tasks: int = 32, group: int = 8) -> int:
    rng = random.Random(0)
    (workdir / "config.json").write_text(json.dumps({"seed": 0, "rollout": {"group_size": group}}))
    with open(workdir / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            f.write(json.dumps({"step": step, "phase": "rl", "rollout/reward_mean": rng.random()}) + "\n")
    for step in range(1, steps + 1):
        domains = ("repair", "math")
        episodes = [synthetic_episode(rng, step, g, i, domains[g % 2]) for g in range(tasks) for i in range(group)]
        write_step(workdir, step, episodes)
    return steps * tasks * group


def reference(workdir: Path) -> pd.DataFrame:
    records = []
    for _, path in step_files(workdir):
        with open(path, encoding="utf-8") as f:
            records += [json.loads(line) for line in f]
    return pd.DataFrame(records)


def ours(workdir: Path) -> tuple:
    run = load_run(workdir)
    return run, run.episodes, run.task_table(), run.sandbox_latencies()


def again(run) -> tuple:
    run.refresh()
    return run.episodes, run.task_table(), run.sandbox_latencies()


def timed(fn, *args) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="steps of 32 tasks x 8 episodes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None, help="keep the synthetic run here (default: a temp dir)")
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be >= 1")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="results-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        t, n = timed(synthesise, workdir, args.steps)
        size = sum(p.stat().st_size for _, p in step_files(workdir))
        print(f"machine: {describe_machine()}")
        print(f"synthesised {n} episodes ({size / 1e6:.0f} MB of JSONL) in {t:.1f} s under {workdir}")
        ref_t, ours_t, refresh_t = [], [], []
        for _ in range(args.rounds):
            t, frame = timed(reference, workdir)
            ref_t.append(t)
            t, (run, episodes, tasks, latencies) = timed(ours, workdir)
            ours_t.append(t)
            t, _ = timed(again, run)
            refresh_t.append(t)
        assert len(frame) == len(episodes) == n, (len(frame), len(episodes), n)
        t, record = timed(run.episode, args.steps // 2, 100)
        print(f"\n{'path':58s} {'best s':>8s} {'episodes/s':>11s} {'vs reference':>13s}")
        rows = [
            ("reference: json.loads every line + pd.DataFrame", min(ref_t)),
            ("load_run + episodes + task_table + sandbox_latencies", min(ours_t)),
            ("refresh (cached step files) + the same tables", min(refresh_t)),
        ]
        for label, best in rows:
            print(f"{label:58s} {best:8.2f} {n / best:11.0f} {best / min(ref_t):12.2f}x")
        print(f"\nRun.episode(step, row) with token arrays: {t * 1000:.1f} ms ({len(record['token_ids'])} tokens)")
        print(f"tables: episodes {episodes.shape}, tasks {tasks.shape}, tool calls {latencies.shape}")
        print(f"all rounds (s): reference {ref_t}, load_run {ours_t}, refresh {refresh_t}")
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
