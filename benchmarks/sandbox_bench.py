"""Sandbox latency and throughput, each beside a reference measured in the same run.

References: the Docker CLI (`docker run --rm`, `docker exec`, `docker commit`)
and plain `subprocess` with no isolation. Goals: docker-backend exec within
1.2x of raw `docker exec`; bwrap exec p50 under 10 ms.

    python benchmarks/sandbox_bench.py [--backends bwrap,docker] [--quick]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.machine import describe_machine  # noqa: E402
from sandbox import SandboxSpec, get_backend  # noqa: E402


def timeit(fn: Callable[[], object], n: int, label: str) -> list[float]:
    out = []
    t_start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
        if time.perf_counter() - t_start > 5 and i % max(1, n // 5) == 0:
            print(f"  ... {label}: {i + 1}/{n}", file=sys.stderr, flush=True)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def fmt(xs: list[float]) -> str:
    return f"{1e3 * statistics.median(xs):8.2f} / {1e3 * pct(xs, 0.99):8.2f}"


def run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def bench_backend(name: str, n: int, rows: list[tuple[str, str, str]]) -> dict[str, list[float]]:
    backend = get_backend(name)
    spec = SandboxSpec()
    backend.check(spec)
    print(f"[{name}] cold start x{n // 4}", file=sys.stderr, flush=True)

    def cold() -> None:
        with backend.create(spec) as sb:
            sb.ping()

    res: dict[str, list[float]] = {"cold": timeit(cold, max(5, n // 4), f"{name} cold")}
    with backend.create(spec) as sb:
        print(f"[{name}] warm exec x{n}", file=sys.stderr, flush=True)
        res["true"] = timeit(lambda: sb.exec("true"), n, f"{name} true")
        res["python"] = timeit(lambda: sb.exec("python3 -c pass"), max(10, n // 4), f"{name} python")
        sb.write_files({f"src/m{i}.py": "x = 1\n" * 100 for i in range(200)})
        snap = sb.snapshot()
        res["snapshot"] = timeit(sb.snapshot, 20, f"{name} snapshot")
        res["restore"] = timeit(lambda: sb.restore(snap), 20, f"{name} restore")
        snap_kb = snap.size_bytes / 1024
    conc = 8
    boxes = [backend.create(spec) for _ in range(conc)]
    try:
        per = n
        t = time.perf_counter()
        with cf.ThreadPoolExecutor(conc) as pool:
            list(pool.map(lambda sb: [sb.exec("true") for _ in range(per)], boxes))
        res["throughput"] = [conc * per / (time.perf_counter() - t)]
    finally:
        for sb in boxes:
            sb.close()
    rows += [
        (f"{name}: cold start (create+ping+close)", fmt(res["cold"]), ""),
        (f"{name}: exec `true`", fmt(res["true"]), ""),
        (f"{name}: exec `python3 -c pass`", fmt(res["python"]), ""),
        (f"{name}: snapshot ({snap_kb:.0f} KB workspace)", fmt(res["snapshot"]), ""),
        (f"{name}: restore", fmt(res["restore"]), ""),
        (f"{name}: {conc} sandboxes concurrently", f"{res['throughput'][0]:8.0f} exec/s", ""),
    ]
    return res


def bench_references(n: int, image: str, rows: list, docker: bool) -> dict[str, list[float]]:
    res: dict[str, list[float]] = {}
    print("[reference] subprocess", file=sys.stderr, flush=True)
    res["sub_true"] = timeit(lambda: run(["true"]), n, "subprocess true")
    res["sub_python"] = timeit(lambda: run([sys.executable, "-S", "-c", "pass"]), max(10, n // 4), "subprocess python")
    rows += [
        ("reference: subprocess `true` (no isolation)", fmt(res["sub_true"]), ""),
        ("reference: subprocess `python -c pass`", fmt(res["sub_python"]), ""),
    ]
    if not docker:
        return res
    print("[reference] docker CLI", file=sys.stderr, flush=True)
    res["docker_run"] = timeit(
        lambda: run(["docker", "run", "--rm", "--network", "none", image, "true"]), max(5, n // 4), "docker run"
    )
    cid = subprocess.run(
        ["docker", "run", "-d", "--rm", "--network", "none", image, "sleep", "3600"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        res["docker_exec"] = timeit(lambda: run(["docker", "exec", cid, "true"]), max(20, n // 2), "docker exec")
        res["docker_exec_py"] = timeit(
            lambda: run(["docker", "exec", cid, "python3", "-c", "pass"]), max(10, n // 4), "docker exec python"
        )

        def commit_and_start() -> None:
            img = subprocess.run(["docker", "commit", cid], check=True, capture_output=True, text=True).stdout.strip()
            new = subprocess.run(
                ["docker", "run", "-d", "--rm", "--network", "none", img, "sleep", "60"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            run(["docker", "rm", "-f", new])
            run(["docker", "rmi", "-f", img])

        res["commit"] = timeit(commit_and_start, 5, "docker commit")
    finally:
        run(["docker", "rm", "-f", cid])
    rows += [
        ("reference: `docker run --rm` (CLI)", fmt(res["docker_run"]), ""),
        ("reference: `docker exec true` (CLI)", fmt(res["docker_exec"]), ""),
        ("reference: `docker exec python3 -c pass` (CLI)", fmt(res["docker_exec_py"]), ""),
        ("reference: `docker commit` + start (snapshot by image)", fmt(res["commit"]), ""),
    ]
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="bwrap,docker")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    n = 40 if args.quick else 200
    names = [b for b in args.backends.split(",") if b]
    rows: list[tuple[str, str, str]] = []
    results = {name: bench_backend(name, n, rows) for name in names}
    ref = bench_references(n, SandboxSpec().image, rows, docker="docker" in names)

    print(f"\nmachine: {describe_machine()}\n")
    print(f"| {'measurement':58s} | {'p50 / p99 (ms)':19s} |")
    print(f"|{'-' * 60}|{'-' * 21}|")
    for label, value, _ in rows:
        print(f"| {label:58s} | {value:19s} |")
    print()
    if "docker" in results:
        ratio = statistics.median(results["docker"]["true"]) / statistics.median(ref["docker_exec"])
        ratio_py = statistics.median(results["docker"]["python"]) / statistics.median(ref["docker_exec_py"])
        snap = statistics.median(results["docker"]["snapshot"]) + statistics.median(results["docker"]["restore"])
        commit = statistics.median(ref["commit"])
        print(f"docker exec / raw docker exec: {ratio:.3f}x for `true`, {ratio_py:.3f}x for python (goal <= 1.2x)")
        print(f"snapshot+restore by workspace archive {1e3 * snap:.1f} ms vs docker commit+start {1e3 * commit:.0f} ms")
    if "bwrap" in results:
        p50 = 1e3 * statistics.median(results["bwrap"]["true"])
        print(f"bwrap exec p50: {p50:.2f} ms (goal < 10 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
