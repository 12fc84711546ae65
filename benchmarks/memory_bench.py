r"""Peak resident memory (RSS) of a training run, and where in the run it was reached.

    python benchmarks/memory_bench.py                                  # the full quickstart
    python benchmarks/memory_bench.py --config.sft.steps=50 --config.loop.steps=4   # overrides pass through
    python benchmarks/memory_bench.py --interval 1 --timeline          # print every sample

Runs ``python -m rl.train --config=configs/quickstart.py`` (or ``--config=...`` given) in a fresh
temporary workdir, samples the trainer's ``VmRSS`` every ``--interval`` seconds together with the
phase and step of the last line of ``metrics.jsonl``, and prints the kernel's peak (``VmHWM`` /
``ru_maxrss``, the figure ``/usr/bin/time -v`` reports) with the peak per phase. Sandboxes are
separate processes and are not counted. Exit status: the run's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _status_kb(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _last_metrics(workdir: Path) -> tuple[str, int]:
    """(phase, step) of the newest metrics line ("start" before the first)."""
    try:
        with open(workdir / "metrics.jsonl", "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            line = f.read().decode(errors="replace").strip().splitlines()[-1]
        record = json.loads(line)
        return str(record.get("phase", "?")), int(record.get("step", -1))
    except (OSError, IndexError, ValueError):
        return "start", 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between RSS samples")
    parser.add_argument("--timeline", action="store_true", help="print every sample")
    parser.add_argument("--keep", action="store_true", help="keep the workdir (printed)")
    args, overrides = parser.parse_known_args()
    if not any(o.startswith("--config=") for o in overrides):
        overrides.insert(0, "--config=configs/quickstart.py")
    workdir = Path(tempfile.mkdtemp(prefix="memory_bench_"))
    cmd = [sys.executable, "-m", "rl.train", *overrides, f"--workdir={workdir}"]
    print("running:", " ".join(cmd), flush=True)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err_path = workdir.parent / f"{workdir.name}.stderr"
    samples: list[tuple[float, int, str, int]] = []
    with open(err_path, "w") as err_file:
        import threading

        pump = threading.Thread(target=shutil.copyfileobj, args=(proc.stderr, err_file), daemon=True)
        pump.start()
        while proc.poll() is None:
            rss = _status_kb(proc.pid, "VmRSS")
            hwm = _status_kb(proc.pid, "VmHWM")
            if rss is not None:
                phase, step = _last_metrics(workdir)
                samples.append((time.perf_counter() - start, rss, phase, step))
                if args.timeline:
                    print(
                        f"{samples[-1][0]:7.1f}s  rss {rss / 1024:7.0f} MB  hwm {(hwm or 0) / 1024:7.0f} MB  "
                        f"after {phase} step {step}",
                        flush=True,
                    )
            time.sleep(args.interval)
        pump.join(timeout=5)
    seconds = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    print(f"\nexit status {proc.returncode}, {seconds / 60:.1f} min")
    by_phase: dict[str, int] = {}
    for _, rss, phase, _ in samples:
        by_phase[phase] = max(by_phase.get(phase, 0), rss)
    for phase, rss in by_phase.items():
        print(f"  sampled peak RSS after a '{phase}' line: {rss / 1024:7.0f} MB")
    print(f"peak RSS (ru_maxrss): {peak_kb / 1024:.0f} MB = {peak_kb / 1024**2:.2f} GiB")
    if proc.returncode:
        print("".join(err_path.read_text().splitlines(keepends=True)[-20:]), file=sys.stderr)
    if args.keep:
        print(f"workdir: {workdir} (stderr: {err_path})")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
        err_path.unlink(missing_ok=True)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
