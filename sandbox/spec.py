"""What a sandbox is allowed to use (`SandboxSpec`) and what one command did (`ExecResult`)."""

from __future__ import annotations

import dataclasses
import math
import posixpath
from collections.abc import Mapping
from typing import Any

from sandbox.errors import SandboxUsageError
from sandbox.images import DEFAULT_IMAGE

_MAX_ENV_BYTES = 1 << 20
AGENT_RESERVE_MB = 64  # memory kept free of tmpfs files, for the agent and processes
INODE_COST_BYTES = 1024  # kernel memory of one tmpfs inode + dentry, charged to the sandbox (measured ~960 B)


def _check(cond: bool, field: str, expected: str, value: Any) -> None:
    if not cond:
        raise SandboxUsageError(f"SandboxSpec.{field}: expected {expected}, got {value!r}")


def check_env(env: Any, where: str) -> dict[str, str]:
    """Validates an environment mapping; returns a plain dict copy."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise SandboxUsageError(f"{where}: expected a mapping of str to str, got {type(env).__name__}")
    out: dict[str, str] = {}
    total = 0
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise SandboxUsageError(f"{where}: bad variable name {key!r} (non-empty str without '=' or NUL)")
        if not isinstance(value, str) or "\0" in value:
            raise SandboxUsageError(f"{where}[{key!r}]: expected a str without NUL, got {value!r:.80}")
        total += len(key) + len(value)
        out[key] = value
    if total > _MAX_ENV_BYTES:
        raise SandboxUsageError(f"{where}: environment is {total} bytes, more than {_MAX_ENV_BYTES}")
    return out


@dataclasses.dataclass(frozen=True)
class SandboxSpec:
    """Resources and isolation of one sandbox. Validated on construction.

    Attributes:
      image: Docker image tag; the bwrap backend runs on the root filesystem the
        image build left next to it (see :mod:`sandbox.images`).
      cpus: CPU quota in cores (fractions allowed).
      memory_mb: memory limit of everything inside, tmpfs contents included; must cover
        ``workspace_mb + 2 * tmp_mb`` (/tmp and /dev/shm) plus a 64 MB reserve.
      pids: maximum number of processes and threads (fork-bomb containment).
      workspace_mb: size of the writable workspace (a tmpfs: this is the disk quota).
      tmp_mb: size of the writable ``/tmp`` (and of ``/dev/shm``).
      max_inodes: files, directories and links each writable mount (the workspace,
        /tmp, /dev/shm) may hold; creating one more fails with ``ENOSPC``. ``None``
        (default): one per 8 KiB of the mount's size, at least 1024 (ext4 gives one
        per 16 KiB). Inodes cost kernel memory charged to the sandbox (~1 KiB each),
        so they count toward ``memory_mb`` like the tmpfs contents do.
      timeout_s: default wall-clock limit of one :meth:`Sandbox.exec`.
      max_output_bytes: per-stream cap on captured stdout / stderr.
      network: False (default) gives the sandbox no network at all, loopback only.
      env: environment every command sees (on top of a minimal PATH/HOME/LANG).
      workdir: the writable workspace and default working directory.
      read_only_root: mount the root filesystem read-only.
      host_system: bwrap only: bind the host's /usr, /bin, /lib instead of the
        image's root filesystem (for laptops without a built image).
    """

    image: str = DEFAULT_IMAGE
    cpus: float = 1.0
    memory_mb: int = 1024
    pids: int = 256
    workspace_mb: int = 256
    tmp_mb: int = 64
    max_inodes: int | None = None
    timeout_s: float = 60.0
    max_output_bytes: int = 1 << 20
    network: bool = False
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    workdir: str = "/workspace"
    read_only_root: bool = True
    host_system: bool = False

    def __post_init__(self):
        _check(isinstance(self.image, str) and bool(self.image.strip()), "image", "a non-empty image tag", self.image)
        _check(
            isinstance(self.cpus, (int, float)) and math.isfinite(self.cpus) and 0.01 <= self.cpus <= 256,
            "cpus",
            "a number of cores in [0.01, 256]",
            self.cpus,
        )
        for name, low, high in (
            ("memory_mb", 16, 1 << 20),
            ("pids", 8, 1 << 16),
            ("workspace_mb", 1, 1 << 20),
            ("tmp_mb", 1, 1 << 20),
            ("max_output_bytes", 1, 1 << 30),
        ):
            value = getattr(self, name)
            ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
            _check(ok, name, f"an int in [{low}, {high}]", value)
        _check(
            isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s) and 0 < self.timeout_s <= 86400,
            "timeout_s",
            "seconds in (0, 86400]",
            self.timeout_s,
        )
        if self.max_inodes is not None:
            value = self.max_inodes
            ok = isinstance(value, int) and not isinstance(value, bool) and 16 <= value <= 1 << 24
            _check(ok, "max_inodes", f"None or an int in [16, {1 << 24}]", value)
        for name in ("network", "read_only_root", "host_system"):
            _check(isinstance(getattr(self, name), bool), name, "a bool", getattr(self, name))
        _check(
            isinstance(self.workdir, str)
            and self.workdir.startswith("/")
            and posixpath.normpath(self.workdir) == self.workdir
            and self.workdir not in ("/", "/proc", "/sys", "/dev", "/tmp"),
            "workdir",
            "a normalised absolute path other than /, /proc, /sys, /dev, /tmp",
            self.workdir,
        )
        # Files in the tmpfs mounts (workspace, /tmp, /dev/shm) and their inodes are memory of the
        # sandbox: if they could fill the memory limit, the next fork would OOM-kill the agent and a
        # model's own doing would look like an infrastructure failure.
        inodes_mb = math.ceil(sum(self.inodes_for(mb) for mb in self.tmpfs_sizes_mb()) * INODE_COST_BYTES / (1 << 20))
        floor = self.workspace_mb + 2 * self.tmp_mb + inodes_mb + AGENT_RESERVE_MB
        if self.memory_mb < floor:
            raise SandboxUsageError(
                f"SandboxSpec.memory_mb: expected >= workspace_mb + 2 * tmp_mb + {inodes_mb} (their inodes) + "
                f"{AGENT_RESERVE_MB} = {floor} (tmpfs contents count as memory), got {self.memory_mb}; raise "
                "memory_mb or lower workspace_mb/tmp_mb/max_inodes"
            )
        object.__setattr__(self, "env", check_env(self.env, "SandboxSpec.env"))

    def tmpfs_sizes_mb(self) -> tuple[int, int, int]:
        """Sizes of the writable tmpfs mounts: workspace, /tmp, /dev/shm."""
        return (self.workspace_mb, self.tmp_mb, self.tmp_mb)

    def inodes_for(self, size_mb: int) -> int:
        """The inode cap of a writable mount of ``size_mb`` (see ``max_inodes``)."""
        return self.max_inodes if self.max_inodes is not None else max(1024, size_mb * 128)

    def replace(self, **changes: Any) -> SandboxSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def spec_key(spec: SandboxSpec) -> tuple:
    """A hashable identity of a spec, for grouping sandboxes by spec (its ``env`` dict makes the spec unhashable)."""
    fields = tuple((f.name, getattr(spec, f.name)) for f in dataclasses.fields(spec) if f.name != "env")
    return (*fields, ("env", tuple(sorted(spec.env.items()))))


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """What one command did. A timeout or an OOM kill is a result, not an error.

    ``exit_code`` follows the shell: 128+N when the process died of signal N.
    ``stdout``/``stderr`` are raw bytes (commands may print binary); use
    :attr:`stdout_text` for a lossless-enough ``str``.
    """

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (text decoded) for trajectories and logs."""
        return {
            "exit_code": self.exit_code,
            "stdout": self.stdout_text,
            "stderr": self.stderr_text,
            "timed_out": self.timed_out,
            "truncated": self.truncated,
            "duration_s": round(self.duration_s, 6),
            "oom_killed": self.oom_killed,
        }
