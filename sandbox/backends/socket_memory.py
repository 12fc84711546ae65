"""Socket memory, which cgroup v1 does not charge to a sandbox's memory limit.

On cgroup v2 the memory controller charges socket buffers to ``memory.max``
(unless the kernel was booted with ``cgroup.memory=nosocket``). On v1 TCP
buffers have their own counter, ``memory.kmem.tcp.*``, unlimited by default:
300 loopback connections held 1.17 GB of host memory from a sandbox capped at
96 MiB while its cgroup peaked at 13 MiB. So on v1 both backends set that
limit alongside the memory limit (bwrap with the sandbox's cgroup, Docker's
container after start), and a sandbox whose limit cannot be set does not start.

UDP and other datagram buffers are charged on neither v1 counter, so the
seccomp filter allows AF_INET/AF_INET6 sockets of type SOCK_STREAM only
(:data:`sandbox.seccomp.INET_SOCKET_TYPES`; see docs/sandbox-isolation.md).
"""

from __future__ import annotations

from pathlib import Path

from sandbox.errors import BackendUnavailable

# cgroup v1 keeps TCP socket buffers out of memory.limit_in_bytes (v2 charges them to memory.max):
# unbounded, 300 loopback connections held 1.17 GB of host memory from a 96 MiB sandbox. v1 gets a
# separate TCP limit of this fraction of the memory limit, so a sandbox holds at most
# (1 + 1/TCP_SHARE) x its memory limit of host memory.
TCP_SHARE = 4


def tcp_limit_bytes(memory_bytes: int) -> int:
    """The cgroup v1 TCP buffer limit for a sandbox whose memory limit is ``memory_bytes``."""
    return max(memory_bytes // TCP_SHARE, 1 << 20)


class MemoryNotEnforceable(BackendUnavailable):
    """The host cannot bound a sandbox's socket memory, so its memory limit would be a fiction."""


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def set_tcp_limit(memory_dir: Path, memory_bytes: int, *, backend: str = "bwrap") -> None:
    """Bounds the TCP buffers of the v1 memory cgroup ``memory_dir``; refuses, saying why, if it cannot."""
    path = memory_dir / "memory.kmem.tcp.limit_in_bytes"
    want = tcp_limit_bytes(memory_bytes)
    try:
        _write(path, str(want))
        got = int(path.read_text())
    except OSError as exc:
        raise MemoryNotEnforceable(
            f"cannot bound socket memory: writing {path} failed ({exc}); on cgroup v1 TCP buffers are "
            "not charged to memory.limit_in_bytes, so a sandbox could hold host memory far beyond its "
            "memory_mb (boot with cgroup v2, or a kernel with kmem accounting)",
            backend=backend,
        ) from exc
    if got > want:  # the kernel rounds down to a page; anything above means the write did not take
        raise MemoryNotEnforceable(
            f"{path} reads {got} after writing {want}: socket memory is unbounded", backend=backend
        )


def _docker_memory_cgroup(cid: str) -> Path | None:
    """The local v1 memory cgroup of container ``cid`` (cgroupfs or systemd driver), if on this host."""
    base = Path("/sys/fs/cgroup/memory")
    for d in (base / "docker" / cid, base / "system.slice" / f"docker-{cid}.scope"):
        if d.is_dir():
            return d
    return None


def bound_docker_container(cid: str, memory_bytes: int, *, daemon_cgroup_version: str, daemon: str) -> None:
    """Sets the TCP limit of a started container on a cgroup v1 daemon, or refuses it, saying why.

    Docker's ``KernelMemoryTCP`` is no use: Docker 20.10 with runc 1.1 records it and never writes
    it (the container's ``memory.kmem.tcp.limit_in_bytes`` stays unlimited), and newer Dockers drop
    it. So the host writes the limit itself, after start and before the agent runs any command.
    """
    if daemon_cgroup_version != "1":
        return  # v2 charges socket buffers to memory.max
    memory_dir = _docker_memory_cgroup(cid)
    if memory_dir is None:
        raise MemoryNotEnforceable(
            f"the Docker daemon at {daemon} uses cgroup v1, which does not charge socket buffers to a "
            f"container's memory limit, and container {cid[:12]}'s memory cgroup is not on this host to "
            "bound them: run that daemon on a cgroup v2 host, or run agentrl on the daemon's host",
            backend="docker",
        )
    set_tcp_limit(memory_dir, memory_bytes, backend="docker")
