"""One line describing the machine a benchmark ran on, printed beside its figures.

Every benchmark reports its ratio against a reference measured in the same run;
this line says where (CPU model and ISA, cores usable, load, kernel, Python), so a
figure pasted into the README or a closing note carries its machine with it.
"""

from __future__ import annotations

import os
import platform


def describe_machine() -> str:
    cpu, details = platform.processor() or "unknown cpu", ""
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        cpu = info.get("model name", cpu)
        flags = set(info.get("flags", "").split())
        isa = ",".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags)
        details = f" (family {info.get('cpu family', '?')} model {info.get('model', '?')}, {isa})"
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = f", load {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return (
        f"{cpu}{details}, {os.cpu_count()} cores ({usable} usable){load}, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )
