"""Sandbox cold start and exec p50 of this checkout against another git revision, A/B in one run.

Timings on a shared machine drift by more than the changes they judge, so the
two versions are measured alternately (A, B, A, B, ...), each round in a fresh
interpreter importing one version's ``sandbox`` package from its own tree (a
``git worktree`` of ``--against``, removed at the end). The ratio of the
medians (this / against) is the figure to quote.

    python benchmarks/sandbox_ab.py --against 8fb4e44 [--backends bwrap,docker] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One round, run by the interpreter of one version: cold starts (create + first exec + close) and execs.
ROUND = r"""
import json, sys, time
from sandbox import SandboxSpec, get_backend
backend = get_backend(sys.argv[1])
spec = SandboxSpec()
backend.create(spec).close()  # warm the image and the imports
cold = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    with backend.create(spec) as sb:
        sb.exec("true")
    cold.append(time.perf_counter() - t)
with backend.create(spec) as sb:
    execs = []
    for _ in range(int(sys.argv[3])):
        t = time.perf_counter()
        sb.exec("true")
        execs.append(time.perf_counter() - t)
print(json.dumps({"cold": cold, "exec": execs}))
"""


def _round(tree: str, backend: str, cold: int, execs: int) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run(
        [sys.executable, "-c", ROUND, backend, str(cold), str(execs)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="git revision to compare with (e.g. 8fb4e44)")
    parser.add_argument("--backends", default="bwrap,docker")
    parser.add_argument("--rounds", type=int, default=4, help="A/B pairs per backend")
    parser.add_argument("--cold", type=int, default=5, help="cold starts per round")
    parser.add_argument("--execs", type=int, default=50, help="execs per round")
    args = parser.parse_args(argv)
    base = tempfile.mkdtemp(prefix="agentrl-ab-")
    subprocess.run(
        ["git", "-C", HERE, "worktree", "add", "--detach", base, args.against], check=True, capture_output=True
    )
    try:
        for backend in args.backends.split(","):
            samples: dict[str, dict[str, list[float]]] = {
                "this": {"cold": [], "exec": []},
                "base": {"cold": [], "exec": []},
            }
            for i in range(args.rounds):
                for name, tree in (("this", HERE), ("base", base)) if i % 2 == 0 else (("base", base), ("this", HERE)):
                    got = _round(tree, backend, args.cold, args.execs)
                    for key in ("cold", "exec"):
                        samples[name][key] += got[key]
                print(f"  ... {backend}: round {i + 1}/{args.rounds}", file=sys.stderr, flush=True)
            for key, label in (("cold", "cold start"), ("exec", "exec p50")):
                this, ref = (statistics.median(samples[n][key]) * 1e3 for n in ("this", "base"))
                print(
                    f"{backend:6s} {label:10s} this {this:8.2f} ms   {args.against} {ref:8.2f} ms   ratio {this / ref:.2f}x"
                )
    finally:
        subprocess.run(["git", "-C", HERE, "worktree", "remove", "--force", base], check=False, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
