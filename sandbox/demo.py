"""A short tour of the sandbox: run it to see isolation, limits and snapshots at work.

python -m sandbox.demo [--backend bwrap|docker|all]
"""

from __future__ import annotations

import argparse
import sys
import time

from sandbox import SandboxInfraError, SandboxSpec, get_backend

STEPS = [
    ("run Python", "python3 -c 'import sys; print(sys.version.split()[0], sum(range(10**6)))'", 10),
    ("no network", "curl -sS -m 3 http://1.1.1.1 || echo 'network unreachable (as intended)'", 10),
    ("read-only root", "touch /usr/evil 2>&1 || true", 5),
    ("memory limit", "python3 -c 'x = bytearray(600 << 20)'", 20),
    ("timeout kills the tree", "setsid sleep 300 & trap '' TERM; sleep 300", 1),
    ("processes left", "ps -e -o comm= | tr '\\n' ' '", 5),
]


def tour(backend_name: str) -> None:
    backend = get_backend(backend_name)
    spec = SandboxSpec(memory_mb=256, workspace_mb=64, tmp_mb=32)
    t0 = time.perf_counter()
    with backend.create(spec) as sb:
        print(f"\n== {backend_name}: sandbox {sb.id} up in {1e3 * (time.perf_counter() - t0):.0f} ms ==")
        for title, cmd, timeout in STEPS:
            r = sb.exec(cmd, timeout=timeout)
            out = (r.stdout_text + r.stderr_text).strip().splitlines()
            flags = ", ".join(k for k in ("timed_out", "oom_killed", "truncated") if getattr(r, k))
            print(
                f"- {title:24s} exit={r.exit_code:<3d} {r.duration_s * 1e3:7.1f} ms {flags:10s} | {out[-1] if out else ''}"
            )
        sb.write_files({"notes.txt": "before\n"})
        snap = sb.snapshot()
        sb.exec("echo after > notes.txt; touch junk")
        sb.restore(snap)
        print(f"- snapshot/restore         {sb.exec('cat notes.txt; ls').stdout_text.split()}")
        n = 200
        t = time.perf_counter()
        for _ in range(n):
            sb.exec("true")
        print(f"- exec round trip          {1e3 * (time.perf_counter() - t) / n:.2f} ms per `true` (mean of {n})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="bwrap", choices=["bwrap", "docker", "all"])
    args = parser.parse_args(argv)
    names = ["bwrap", "docker"] if args.backend == "all" else [args.backend]
    for name in names:
        try:
            tour(name)
        except SandboxInfraError as exc:
            print(f"\n== {name}: unavailable: {exc}", file=sys.stderr)
            if args.backend != "all":
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
