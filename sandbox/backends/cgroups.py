"""Host cgroups for the bwrap backend: memory, process and CPU limits per sandbox.

rlimits alone cannot contain a fork bomb when the host user is root (the
kernel exempts uid 0 from RLIMIT_NPROC) and cannot bound the sum of a
sandbox's processes' memory; cgroups can. Works with cgroup v1 (one hierarchy
per controller) and v2 (unified). Each sandbox gets ``agentrl/<sandbox id>``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from sandbox.backends.socket_memory import set_tcp_limit

ROOT = Path(os.environ.get("AGENTRL_CGROUP_ROOT", "/sys/fs/cgroup"))
GROUP = "agentrl"
_V1_CONTROLLERS = ("memory", "pids", "cpu")


def cgroup_version() -> int | None:
    """2 for a unified hierarchy with the controllers we need, 1 for v1, None if unusable."""
    if (ROOT / "cgroup.controllers").exists():
        wanted = {"memory", "pids", "cpu"}
        have = set((ROOT / "cgroup.controllers").read_text().split())
        return 2 if wanted <= have and os.access(ROOT, os.W_OK) else None
    if all((ROOT / c / "cgroup.procs").exists() for c in _V1_CONTROLLERS):
        return 1 if all(os.access(ROOT / c, os.W_OK) for c in _V1_CONTROLLERS) else None
    return None


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class SandboxCgroup:
    """Limits for one sandbox. Create before the sandbox starts, destroy after."""

    def __init__(self, name: str, *, memory_bytes: int, pids: int, cpus: float, version: int):
        self.name = name
        self.version = version
        if version == 2:
            self.dirs = [ROOT / GROUP / name]
        else:
            self.dirs = [ROOT / c / GROUP / name for c in _V1_CONTROLLERS]
        self._memory_bytes = memory_bytes
        self._pids = pids
        self._cpus = cpus

    def create(self) -> None:
        if self.version == 2:
            parent = ROOT / GROUP
            parent.mkdir(exist_ok=True)
            for level in (ROOT, parent):
                _write(level / "cgroup.subtree_control", "+memory +pids +cpu")
            d = self.dirs[0]
            d.mkdir()
            _write(d / "memory.max", str(self._memory_bytes))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
            _write(d / "pids.max", str(self._pids))
            _write(d / "cpu.max", f"{int(self._cpus * 100_000)} 100000")
            return
        memory, pids, cpu = self.dirs
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)
        _write(memory / "memory.limit_in_bytes", str(self._memory_bytes))
        set_tcp_limit(memory, self._memory_bytes)  # v1 leaves socket buffers out of the line above
        if (memory / "memory.memsw.limit_in_bytes").exists():
            _write(memory / "memory.memsw.limit_in_bytes", str(self._memory_bytes))
        try:
            _write(memory / "memory.swappiness", "0")
        except OSError:
            pass
        _write(pids / "pids.max", str(self._pids))
        _write(cpu / "cpu.cfs_period_us", "100000")
        _write(cpu / "cpu.cfs_quota_us", str(int(self._cpus * 100_000)))

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid into to join."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    @property
    def oom_file(self) -> str:
        """A file with an ``oom_kill N`` line counting OOM kills in this group."""
        d = self.dirs[0]
        return str(d / ("memory.events" if self.version == 2 else "memory.oom_control"))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in Path(self.procs_files[0]).read_text().split()]
        except OSError:
            return []

    def destroy(self) -> None:
        """Kills anything still inside and removes the group. Never raises."""
        if self.version == 2:
            kill_file = self.dirs[0] / "cgroup.kill"
            if kill_file.exists():
                try:
                    _write(kill_file, "1")
                except OSError:
                    pass
        kill_until_empty(self.pids, tries=200, pause_s=0.005)
        for d in self.dirs:
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last process exits
                    time.sleep(0.01)


def kill_until_empty(list_pids: Callable[[], Iterable[int]], *, tries: int, pause_s: float) -> None:
    """SIGKILLs whatever ``list_pids()`` returns until it returns nothing (what is killed may have forked)."""
    for _ in range(tries):
        left = list(list_pids())
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(pause_s)


def gc_cgroups(is_live: Callable[[str], bool]) -> int:
    """Removes agentrl cgroups whose sandbox is no longer live (``is_live(name)`` False)."""
    version = cgroup_version()
    if version is None:
        return 0
    parents = [ROOT / GROUP] if version == 2 else [ROOT / c / GROUP for c in _V1_CONTROLLERS]
    names = set()
    for parent in parents:
        if parent.is_dir():
            names.update(p.name for p in parent.iterdir() if p.is_dir())
    removed = 0
    for name in sorted(names):
        if not is_live(name):
            SandboxCgroup(name, memory_bytes=0, pids=0, cpus=1, version=version).destroy()
            removed += 1
    return removed
