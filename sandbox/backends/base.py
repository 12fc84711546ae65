"""The `Sandbox` API every backend implements, and the `Backend` that makes them.

Argument checking lives here, once: a backend only starts an isolated
``python3`` and returns a transport to it (see :mod:`sandbox.backends.channel`).
"""

from __future__ import annotations

import abc
import atexit
import dataclasses
import logging
import math
import os
import posixpath
import threading
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sandbox import identity, seccomp
from sandbox.agent.confine import AGENT_CAPS
from sandbox.backends.channel import AgentChannel, Transport, closed_error
from sandbox.errors import SandboxFileError, SandboxInfraError, SandboxUsageError
from sandbox.spec import ExecResult, SandboxSpec, check_env

MAX_COMMAND_BYTES = 1 << 20
MAX_STDIN_BYTES = 64 << 20
MAX_WRITE_BYTES = 1 << 30
DEFAULT_READ_BYTES = 64 << 20
# The most a snapshot may hold (its tar), on the way out and on the way back in: the host keeps
# snapshots in memory (a pool keeps one per sandbox), so this is what one can cost it.
SNAPSHOT_MAX_BYTES = 256 << 20
# The agent enforces the command's timeout itself; the host waits this much
# longer before it declares the agent unresponsive (an infrastructure failure).
HOST_GRACE_S = 15.0
BOOT_TIMEOUT_S = 60.0
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LABEL = "agentrl.sandbox"

log = logging.getLogger(__name__)
_live: weakref.WeakSet[Sandbox] = weakref.WeakSet()


def _close_all_live() -> None:
    for sandbox in list(_live):
        try:
            sandbox.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


atexit.register(_close_all_live)


def live_sandbox_ids() -> set[str]:
    """Ids of this process's sandboxes not yet closed: what a sweep of a host must leave alone."""
    return {sb.id for sb in list(_live) if not sb.closed}


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A restorable copy of a sandbox's writable directories, held on the host."""

    backend: str
    sandbox_id: str
    data: bytes = dataclasses.field(repr=False)
    created: float

    @property
    def size_bytes(self) -> int:
        return len(self.data)


def writable_roots(spec: SandboxSpec) -> list[dict[str, Any]]:
    """Every directory a command can write, with its owner and mode: what a reset empties and a probe lists."""
    uid, gid = identity.USERS["sandbox"]
    judge_uid, judge_gid = identity.USERS["judge"]
    shared = {"uid": 0, "gid": 0, "mode": 0o1777, "snapshot": True}
    return [
        {"path": spec.workdir, "uid": uid, "gid": gid, "mode": 0o755, "snapshot": True},
        {"path": "/tmp", **shared},
        {"path": "/dev/shm", **shared},
        # POSIX message queues: writable by anyone, emptied on reset, never snapshotted.
        {"path": "/dev/mqueue", **shared, "snapshot": False, "optional": True},
        # The judge's ground: emptied on reset like the others, never snapshotted (not the model's state).
        {"path": identity.JUDGE_HOME, "uid": judge_uid, "gid": judge_gid, "mode": 0o700, "snapshot": False},
    ]


class Sandbox(abc.ABC):
    """One isolated machine for running untrusted commands. Use as a context manager.

    Subclasses implement :meth:`_start` (return a transport to a booted
    ``python3 -c BOOTSTRAP``), :meth:`_diagnose` and :meth:`_teardown`.
    """

    backend: ClassVar[str] = "abstract"

    def __init__(self, spec: SandboxSpec):
        if not isinstance(spec, SandboxSpec):
            raise SandboxUsageError(f"spec: expected a SandboxSpec, got {type(spec).__name__}")
        self.spec = spec
        self.id = f"agentrl-{uuid.uuid4().hex[:12]}"
        self._channel: AgentChannel | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        self.started_at = time.monotonic()
        self.confinement: dict[str, Any] = {}
        _live.add(self)

    # -- subclass hooks -------------------------------------------------------
    @abc.abstractmethod
    def _diagnose(self, reason: str) -> SandboxInfraError:
        """Explains a broken channel: vanished sandbox, dead daemon, ..."""

    @abc.abstractmethod
    def _teardown(self) -> None:
        """Destroys the isolated environment; must be idempotent and never raise."""

    @abc.abstractmethod
    def _abort(self) -> None:
        """Kills the isolated environment without closing any host file descriptor; safe from any thread."""

    def _boot(
        self,
        transport: Transport,
        *,
        oom_files: Sequence[str] = (),
        rlimits: Mapping[str, int] | None = None,
        boot_mounts: Sequence[Mapping[str, str]] = (),
    ) -> None:
        """Starts the agent: it confines itself (``boot_mounts`` first) and then serves requests."""
        env = {"PATH": BASE_PATH, "HOME": self.spec.workdir, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
        env.update(self.spec.env)
        # The judge's minimal environment: nothing from the spec, nothing that points at model ground.
        judge_env = {"PATH": BASE_PATH, "HOME": identity.JUDGE_HOME, "LANG": "C.UTF-8", "TMPDIR": identity.JUDGE_HOME}
        config = {
            "workdir": self.spec.workdir,
            "judge": {"env": judge_env, "cwd": identity.JUDGE_HOME},
            "writable": writable_roots(self.spec),
            "users": {name: list(ids) for name, ids in identity.USERS.items()},
            "env": env,
            "oom_files": list(oom_files),
            "rlimits": {"NOFILE": 4096, "CORE": 0, **(rlimits or {})},
            "confine": {
                "mounts": [dict(m) for m in boot_mounts],
                "keep_caps": list(AGENT_CAPS),
                "seccomp": seccomp.bpf_program(allow_mount=False).hex(),
            },
        }
        self._channel = AgentChannel(transport, self.backend, self._diagnose)
        hello = self._channel.boot(config, BOOT_TIMEOUT_S)
        self.confinement = dict(hello.get("confinement") or {})

    # -- public API -----------------------------------------------------------
    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
        user: str = "sandbox",
    ) -> ExecResult:
        """Runs ``cmd`` (a bash script string, or an argv list) and returns what it did.

        ``user`` is ``"sandbox"`` (uid 1000, the default: the model's commands) or
        ``"judge"`` (uid 1001: code that decides a reward, out of the commands' reach).
        Non-zero exits, timeouts and OOM kills come back in the result; only a
        failure of the sandbox machinery raises :class:`SandboxInfraError`.
        """
        header: dict[str, Any] = {
            "user": identity.check_user(user),
            "cmd": _check_command(cmd),
            "timeout": _check_timeout(self.spec.timeout_s if timeout is None else timeout),
            "env": check_env(env, "exec(env=)"),
            "cwd": self._resolve(cwd, "exec(cwd=)") if cwd is not None else None,
            "max_output": self.spec.max_output_bytes,
        }
        blobs = [_check_bytes(stdin, "exec(stdin=)", MAX_STDIN_BYTES)] if stdin else []
        response, (out, err) = self._call("exec", header, blobs, timeout=header["timeout"] + HOST_GRACE_S)
        return ExecResult(
            exit_code=int(response["exit_code"]),
            stdout=out,
            stderr=err,
            timed_out=bool(response["timed_out"]),
            truncated=bool(response["truncated"]),
            duration_s=float(response["duration_s"]),
            oom_killed=bool(response["oom_killed"]),
        )

    def write_files(self, files: Mapping[str, bytes | str], *, mode: int = 0o644, user: str = "sandbox") -> None:
        """Writes files (paths relative to the workdir, or absolute in a writable dir), owned by ``user``.

        Whatever is at a path is replaced, never followed: a symlink or FIFO a command planted there
        is not written through.
        """
        identity.check_user(user)
        if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
            raise SandboxUsageError(f"write_files(mode=): expected permission bits in [0, 0o7777], got {mode!r}")
        if not isinstance(files, Mapping):
            raise SandboxUsageError(
                f"write_files(files=): expected a mapping of path to bytes/str, got {type(files).__name__}"
            )
        metas, blobs, total = [], [], 0
        for path, data in files.items():
            blob = _check_bytes(data, f"write_files[{path!r}]", MAX_WRITE_BYTES)
            total += len(blob)
            metas.append({"path": self._resolve(path, "write_files path"), "mode": mode})
            blobs.append(blob)
        if total > MAX_WRITE_BYTES:
            raise SandboxUsageError(f"write_files: {total} bytes in one call, more than {MAX_WRITE_BYTES}")
        if metas:
            self._call("write", {"files": metas, "user": user}, blobs, timeout=BOOT_TIMEOUT_S)

    def read_file(self, path: str, *, max_bytes: int = DEFAULT_READ_BYTES) -> bytes:
        """Reads a regular file from the sandbox (symlinks are not followed).

        :class:`SandboxFileError` if it is missing, not a regular file, or larger than ``max_bytes``.
        """
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise SandboxUsageError(f"read_file(max_bytes=): expected an int >= 0, got {max_bytes!r}")
        header = {"path": self._resolve(path, "read_file(path=)"), "max_bytes": max_bytes}
        _, (data,) = self._call("read", header, timeout=BOOT_TIMEOUT_S)
        return data

    def snapshot(self, *, max_bytes: int = SNAPSHOT_MAX_BYTES) -> Snapshot:
        """Captures the writable directories (workspace, /tmp) so they can be restored.

        The agent streams the tar in bounded chunks. :class:`SandboxFileError` naming the cap and the
        size reached if it grows past ``max_bytes`` (at most :data:`SNAPSHOT_MAX_BYTES`, which
        :meth:`restore` accepts), or if a file is sparse.
        """
        if not isinstance(max_bytes, int) or not 0 < max_bytes <= SNAPSHOT_MAX_BYTES:
            raise SandboxUsageError(
                f"snapshot(max_bytes=): expected an int in [1, {SNAPSHOT_MAX_BYTES}], got {max_bytes!r}"
            )
        _, chunks = self._call("snapshot", {"max_bytes": max_bytes}, timeout=BOOT_TIMEOUT_S)
        return Snapshot(self.backend, self.id, b"".join(chunks), time.time())

    def restore(self, snapshot: Snapshot) -> None:
        """Kills every process and puts the writable directories back as they were."""
        if not isinstance(snapshot, Snapshot):
            raise SandboxUsageError(f"restore(snapshot=): expected a Snapshot, got {type(snapshot).__name__}")
        if snapshot.size_bytes > SNAPSHOT_MAX_BYTES:
            raise SandboxFileError(
                f"restore: snapshot of {snapshot.size_bytes} bytes is larger than max_bytes={SNAPSHOT_MAX_BYTES}"
            )
        self._call("restore", {}, [snapshot.data], timeout=BOOT_TIMEOUT_S)

    def kill_all(self) -> None:
        """Kills every process but the agent and clears System V IPC, POSIX message queues and ``/dev/shm``."""
        self._call("killall", {}, timeout=BOOT_TIMEOUT_S)

    def ping(self) -> dict[str, Any]:
        """Round trip to the agent; returns its pid and process count."""
        response, _ = self._call("ping", {}, timeout=BOOT_TIMEOUT_S)
        return {"pid": response["pid"], "processes": response["processes"]}

    def probe(self) -> dict[str, Any]:
        """What the writable dirs hold and how many processes run, from the agent (no command is spawned).

        Returns ``{"entries": [[path, kind, size, mode, uid], ...] (sorted; kind d/f/l/o), "truncated": bool,
        "ipc": [[kind, id, uid], ...] (System V objects), "roots": [[path, "root", mtime ns, [xattr digests]], ...]
        (the writable roots themselves), "processes": int}``; the warm pool compares it with a fresh sandbox's
        after every reset.
        """
        response, _ = self._call("probe", {"max_entries": 10000}, timeout=BOOT_TIMEOUT_S)
        return {k: response[k] for k in ("entries", "truncated", "ipc", "roots", "processes")}

    def resources(self) -> dict[str, Any]:
        """What a policy can exhaust, from the agent (no command spawned, no listing): ``{"processes": int,
        "ipc": [[kind, id, uid], ...], "space": {writable root: [free blocks, free inodes]}}``."""
        response, _ = self._call("resources", {}, timeout=BOOT_TIMEOUT_S)
        return {k: response[k] for k in ("processes", "ipc", "space")}

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def healthy(self) -> bool:
        return not self._closed and self._channel is not None and not self._channel.broken

    def abort(self) -> None:
        """Kills the sandbox underneath, from any thread: a call blocked in another thread fails at once.

        This is how a wall-clock limit is enforced from outside (the scheduler's job timeouts, batch
        cancellation). Unlike :meth:`close` it frees no host resources: closing a descriptor that another
        thread is blocked on could hand that thread a descriptor the next sandbox reuses. The owning thread
        still calls :meth:`close`. Idempotent; never raises.
        """
        if self._closed:
            return
        try:
            self._abort()
        except Exception as exc:  # noqa: BLE001 - best effort: close() still tears everything down
            log.warning("abort of sandbox %s failed: %s", self.id, exc)

    def describe(self) -> dict[str, Any]:
        """Where and what this sandbox is, for trajectories and logs."""
        return {"backend": self.backend, "id": self.id, "image": self.spec.image}

    def close(self) -> None:
        """Destroys the sandbox. Idempotent; never raises."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._channel is not None:
            self._channel.close()
        self._teardown()
        _live.discard(self)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- helpers ----------------------------------------------------------------
    def _call(self, op: str, header: dict[str, Any], blobs: Sequence[bytes] = (), *, timeout: float):
        if self._closed or self._channel is None:
            raise closed_error(self.backend)
        return self._channel.call(op, header, blobs, timeout=timeout)

    def _resolve(self, path: Any, where: str) -> str:
        if not isinstance(path, str) or not path or "\0" in path or len(path) > 4096:
            raise SandboxUsageError(
                f"{where}: expected a non-empty path without NUL (<= 4096 chars), got {path!r:.100}"
            )
        return posixpath.normpath(posixpath.join(self.spec.workdir, path))


def _check_command(cmd: Any) -> str | list[str]:
    if isinstance(cmd, str):
        parts = [cmd]
    elif isinstance(cmd, Sequence) and not isinstance(cmd, (bytes, bytearray)) and cmd:
        parts = list(cmd)
        if not all(isinstance(p, str) for p in parts):
            raise SandboxUsageError("exec(cmd=): an argv list must hold only str")
    else:
        raise SandboxUsageError(f"exec(cmd=): expected a str or a non-empty list of str, got {cmd!r:.100}")
    if any("\0" in p for p in parts):
        raise SandboxUsageError("exec(cmd=): NUL bytes cannot be passed to a process")
    size = sum(len(p.encode("utf-8", "surrogateescape")) for p in parts)
    if size > MAX_COMMAND_BYTES:
        raise SandboxUsageError(f"exec(cmd=): {size} bytes, more than {MAX_COMMAND_BYTES}; write it to a file")
    return cmd if isinstance(cmd, str) else parts


def _check_timeout(timeout: Any) -> float:
    ok = isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and math.isfinite(timeout)
    if not ok or not 0 < timeout <= 86400:
        raise SandboxUsageError(f"exec(timeout=): expected seconds in (0, 86400], got {timeout!r}")
    return float(timeout)


def _check_bytes(data: Any, where: str, limit: int) -> bytes:
    if isinstance(data, str):
        data = data.encode("utf-8")
    elif isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise SandboxUsageError(f"{where}: expected bytes or str, got {type(data).__name__}")
    if len(data) > limit:
        raise SandboxUsageError(f"{where}: {len(data)} bytes, more than the limit of {limit}")
    return data


class Backend(abc.ABC):
    """Makes sandboxes of one kind on one host; shared by many sandboxes."""

    name: ClassVar[str] = "abstract"

    @abc.abstractmethod
    def create(self, spec: SandboxSpec) -> Sandbox:
        """Starts a sandbox; raises :class:`SandboxInfraError` if it cannot."""

    @abc.abstractmethod
    def check(self, spec: SandboxSpec | None = None) -> None:
        """Raises a clear :class:`SandboxInfraError` if this backend cannot run ``spec`` here."""

    @abc.abstractmethod
    def gc(self, *, all_owners: bool = False) -> int:
        """Removes sandboxes leaked by dead processes (all of them with ``all_owners``); returns the count."""

    @property
    def address(self) -> str:
        """Where sandboxes live (a daemon URL, ``local``)."""
        return "local"

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Releases connections; the sandboxes it made are closed by their owners."""


def owner_tag() -> str:
    """Identifies this process in labels, so gc() can tell leaked sandboxes from live ones."""
    return f"{os.uname().nodename}:{os.getpid()}"
