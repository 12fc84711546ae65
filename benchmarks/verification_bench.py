"""Verification time per episode, per domain, against another revision in the same run.

A verifier that checks by meaning (parsed configs, schema probes, mutants refused) and
settles whose failure a sandbox error is costs more than one that greps; this measures
how much. Each round plays every task's gold episode and its no-op episode (a failing
verification: the path the anomaly settling adds its probes to) through the domain's
environment on a warm pool, and times the last step (``submit``: the verification).
The reference is ``--against REV``: a detached worktree of that revision, run the same
way in a child process, alternating with this tree round by round (A/B/A/B), so a
loaded machine slows both alike. It prints the median seconds per episode for each
domain and revision and the ratio this tree / REV.

    python benchmarks/verification_bench.py --against 8fb4e44 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOMAINS = ("shell", "pipeline", "repair")


def time_domain(domain: str, backend: str, limit: int | None) -> dict[str, list[float]]:
    """Seconds of the verifying step of each gold and no-op episode of ``builtin:domain``."""
    from envs.core import env_for_domain
    from envs.sandboxes import WarmPool
    from envs.tasks import load_tasks

    tasks = list(load_tasks(f"builtin:{domain}"))[:limit]
    times: dict[str, list[float]] = {"gold": [], "noop": []}
    with WarmPool(backend) as pool:
        env = env_for_domain(domain)(tasks, sandbox_factory=pool.acquire, sandbox_release=pool.release)
        try:
            for task in tasks:
                for kind, actions in (("gold", env.gold_actions(task)), ("noop", env.noop_actions(task))):
                    env.reset(options={"task": task})
                    for action in actions:
                        start = time.perf_counter()
                        _, _, terminated, truncated, info = env.step(action)
                        if terminated or truncated:
                            break
                    if "verification" in info:
                        times[kind].append(time.perf_counter() - start)
        finally:
            env.close()
    return times


def child(args: argparse.Namespace) -> None:
    out = {d: time_domain(d, args.backend, args.limit) for d in args.domains.split(",")}
    print("RESULT " + json.dumps(out), flush=True)


def run_tree(tree: Path, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--domains",
        args.domains,
        "--backend",
        args.backend,
    ]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{tree}: the child failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", default="8fb4e44", help="the reference revision (a detached worktree of it)")
    parser.add_argument("--rounds", type=int, default=2, help="A/B rounds, alternating")
    parser.add_argument("--domains", default=",".join(DOMAINS))
    parser.add_argument("--backend", default="bwrap", choices=["bwrap", "docker"])
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks of each domain")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-") as tmp:
        ref = Path(tmp) / "ref"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(ref), args.against], check=True
        )
        try:
            runs: dict[str, list[dict]] = {"this": [], args.against: []}
            for i in range(args.rounds):
                for name, tree in ((args.against, ref), ("this", ROOT)):
                    start = time.monotonic()
                    runs[name].append(run_tree(tree, args))
                    print(f"[bench] round {i + 1}/{args.rounds} {name}: {time.monotonic() - start:.0f}s", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref)], check=False)
    print(f"\nverification step, median seconds per episode ({args.backend}, {args.rounds} rounds)")
    print(f"{'domain':10s} {'kind':5s} {args.against:>10s} {'this':>10s} {'ratio':>7s}")
    for domain in args.domains.split(","):
        for kind in ("gold", "noop"):
            ref_s = statistics.median(t for r in runs[args.against] for t in r[domain][kind])
            new_s = statistics.median(t for r in runs["this"] for t in r[domain][kind])
            print(f"{domain:10s} {kind:5s} {ref_s:10.3f} {new_s:10.3f} {new_s / ref_s:6.2f}x")


if __name__ == "__main__":
    main()
