"""The fast local backend: bubblewrap namespaces + cgroups + a seccomp filter.

Each sandbox is one ``bwrap`` process holding new user, PID, network, mount,
IPC and UTS namespaces, with the agent as PID 1. ``bwrap`` itself runs as an
unprivileged host uid, and the sandbox's user namespace maps sandbox uids
0..65535 onto agentrl's own range of host uids (:mod:`sandbox.identity`): no
process in a sandbox is ever host root, so host-global kernel interfaces
(``/proc/sys``, keyrings) stay closed even to sandbox root. The host writes the
uid map while ``bwrap`` waits on ``--userns-block-fd``, and puts the sandbox's
init into its cgroup in the same pause, before anything inside runs.

The root filesystem is the one the image build produced (read-only), so code
sees the same Python and tools as under Docker; ``SandboxSpec.host_system``
binds the host's system directories instead. Writable directories are tmpfs
mounts capped in bytes and inodes. Memory, process and CPU limits come from a
per-sandbox cgroup.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import os
import select
import shutil
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

from sandbox import identity, images, seccomp
from sandbox.agent import BOOTSTRAP
from sandbox.agent.confine import AGENT_CAPS
from sandbox.backends.base import Backend, Sandbox
from sandbox.backends.cgroups import SandboxCgroup, cgroup_version, gc_cgroups
from sandbox.backends.channel import PipeTransport
from sandbox.backends.drain import StderrDrain
from sandbox.backends.link_protection import require_link_protections
from sandbox.backends.uid_slots import UidSlot, acquire_slot
from sandbox.errors import (
    BackendUnavailable,
    ImageMissing,
    SandboxInfraError,
    SandboxStartError,
    SandboxUsageError,
    SandboxVanished,
)
from sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)

# `--die-with-parent` (PR_SET_PDEATHSIG) fires when the *thread* that forked bwrap exits, not the
# process. The warm pool and the scheduler create sandboxes from short-lived threads, which would
# take their sandboxes down with them; so every bwrap is forked by this one long-lived thread.
_spawner = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrl-bwrap-spawner")


def _popen(argv: list[str], **kwargs) -> subprocess.Popen:
    try:
        future = _spawner.submit(subprocess.Popen, argv, **kwargs)
    except RuntimeError:  # interpreter shutting down: no new threads; the caller's is all there is
        return subprocess.Popen(argv, **kwargs)
    return future.result()


# Entries of the image root that are bound read-only; the rest are fresh mounts.
_SKIP_ROOT_ENTRIES = {"proc", "dev", "sys", "tmp", "run", "workspace", "lost+found", ".agentrl-complete"}
_HOST_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc/alternatives", "etc/ssl")
# The agent needs these at boot (its remounts, cutting its bounding set) and drops them before serving.
_BOOT_ONLY_CAPS = ("SYS_ADMIN", "SETPCAP")
# Kernel interfaces under /proc made read-only at boot, as Docker does.
_READONLY_PROC = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
_SETUP_TIMEOUT_S = 30.0


class BwrapSandbox(Sandbox):
    backend = "bwrap"

    def __init__(self, spec: SandboxSpec, backend: BwrapBackend):
        super().__init__(spec)
        self._proc: subprocess.Popen | None = None
        self._stderr: StderrDrain | None = None
        self._init_pidfd: int | None = None
        self._pidfd_lock = threading.Lock()  # abort() may race close(): never signal a recycled descriptor
        self._cgroup: SandboxCgroup | None = None
        self._slot: UidSlot | None = None
        version = backend.cgroups
        try:
            self._slot = acquire_slot(backend.host_ids)  # its own host uids: per-user kernel budgets per sandbox
            if version is not None:
                self._cgroup = SandboxCgroup(
                    f"{os.getpid()}-{self.id}",
                    memory_bytes=spec.memory_mb << 20,
                    pids=spec.pids,
                    cpus=spec.cpus,
                    version=version,
                )
                self._cgroup.create()
            self._start(backend)
        except BaseException:
            self.close()
            raise

    def _start(self, backend: BwrapBackend) -> None:
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        seccomp_fd = seccomp.seccomp_fd(allow_mount=True)  # the agent closes mount itself after its boot mounts
        argv = [
            backend.bwrap,
            "--unshare-user",
            "--userns-block-fd",
            str(block_r),
            "--info-fd",
            str(info_w),
            "--seccomp",
            str(seccomp_fd),
            *self._namespace_args(),
            *self._mount_args(),
            "python3",
            "-I",
            "-S",
            "-u",
            "-c",
            BOOTSTRAP,
        ]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        host_uid, host_gid = self.host_ids
        try:
            try:
                self._proc = _popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    close_fds=True,
                    pass_fds=(info_w, block_r, seccomp_fd),
                    user=host_uid,
                    group=host_gid,
                    extra_groups=[],
                )
            except OSError as exc:
                raise SandboxStartError(f"cannot run bwrap: {exc}", backend=self.backend) from exc
            finally:
                for fd in (info_w, block_r, seccomp_fd):
                    os.close(fd)
            self._stderr = StderrDrain(self._proc.stderr, name=self.id)
            child = self._read_child_pid(info_r)
            self._init_pidfd = os.pidfd_open(child)  # it waits on us: alive, so this names it (no pid reuse)
            # bwrap waits on block_r: map the ids and place the init in its cgroup before anything runs.
            try:
                for name, first in (("uid_map", host_uid), ("gid_map", host_gid)):
                    with open(f"/proc/{child}/{name}", "w") as f:
                        f.write(identity.uid_map(first))
                if self._cgroup is not None:
                    for procs in self._cgroup.procs_files:
                        with open(procs, "w") as f:
                            f.write(str(child))
            except OSError as exc:
                raise self._diagnose(f"cannot set up the user namespace or cgroup of pid {child}: {exc}") from exc
            os.write(block_w, b"1")
        finally:
            for fd in (info_r, block_w):
                os.close(fd)
        transport = PipeTransport(self._proc.stdin, self._proc.stdout)
        oom_files = ["/run/agentrl/oom"] if self._cgroup is not None else []
        self._boot(transport, oom_files=oom_files, boot_mounts=self._boot_mounts())

    def _read_child_pid(self, info_r: int) -> int:
        """The sandbox init's host pid, from bwrap's ``--info-fd`` JSON."""
        deadline = time.monotonic() + _SETUP_TIMEOUT_S
        data = b""
        while True:
            try:
                return int(json.loads(data)["child-pid"])
            except (ValueError, KeyError):
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([info_r], [], [], remaining)[0]:
                raise self._diagnose(f"bwrap did not report its child within {_SETUP_TIMEOUT_S:.0f}s")
            chunk = os.read(info_r, 4096)
            if not chunk:
                self._proc.wait(timeout=10)
                raise self._diagnose("bwrap exited during setup")
            data += chunk

    def _boot_mounts(self) -> list[dict[str, str]]:
        """What the agent remounts before it serves: inode caps, hidepid, read-only kernel interfaces."""
        spec = self.spec
        mounts = []
        for path, size_mb in ((spec.workdir, spec.workspace_mb), ("/tmp", spec.tmp_mb), ("/dev/shm", spec.tmp_mb)):
            inodes = spec.inodes_for(size_mb)
            mounts.append({"op": "tmpfs", "path": path, "options": f"size={size_mb}m,nr_inodes={inodes}"})
        judge_inodes = spec.inodes_for(identity.JUDGE_HOME_MB)
        mounts.append(
            {
                "op": "tmpfs",
                "path": identity.JUDGE_HOME,
                "options": f"size={identity.JUDGE_HOME_MB}m,nr_inodes={judge_inodes}",
            }
        )
        mounts.append({"op": "hidepid"})
        mounts += [{"op": "readonly", "path": path} for path in (*_READONLY_PROC, "/dev")]
        return mounts

    def _namespace_args(self) -> list[str]:
        args = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not self.spec.network:
            args.append("--unshare-net")
        args += ["--uid", "0", "--gid", "0", "--hostname", "sandbox", "--cap-drop", "ALL"]
        for cap in (*AGENT_CAPS, *_BOOT_ONLY_CAPS):
            args += ["--cap-add", f"CAP_{cap}"]
        args += ["--die-with-parent", "--new-session", "--as-pid-1", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin"]
        return args

    def _mount_args(self) -> list[str]:
        spec = self.spec
        args: list[str] = []
        if spec.host_system:
            for sub in _HOST_SYSTEM_DIRS:
                host = Path("/") / sub
                if host.is_symlink():
                    args += ["--symlink", os.readlink(host), f"/{sub}"]
                elif host.is_dir():
                    args += ["--ro-bind", str(host), f"/{sub}"]
        else:
            root = images.rootfs_dir(spec.image)
            for entry in sorted(root.iterdir()):
                if entry.name in _SKIP_ROOT_ENTRIES:
                    continue
                if entry.is_symlink():
                    args += ["--symlink", os.readlink(entry), f"/{entry.name}"]
                elif entry.is_dir():
                    args += ["--ro-bind", str(entry), f"/{entry.name}"]
        args += ["--proc", "/proc", "--dev", "/dev", "--mqueue", "/dev/mqueue", "--dir", "/run/agentrl"]
        args += ["--size", str(spec.tmp_mb << 20), "--tmpfs", "/tmp"]
        args += ["--size", str(spec.tmp_mb << 20), "--tmpfs", "/dev/shm"]
        args += ["--size", str(spec.workspace_mb << 20), "--tmpfs", spec.workdir]
        args += ["--size", str(identity.JUDGE_HOME_MB << 20), "--tmpfs", identity.JUDGE_HOME]
        if self._cgroup is not None:
            args += ["--ro-bind", self._cgroup.oom_file, "/run/agentrl/oom"]
        args += ["--remount-ro", "/", "--chdir", "/"]
        return args

    @property
    def host_ids(self) -> tuple[int, int]:
        """(host uid, host gid) that this sandbox's root maps to and bwrap runs as: its slot's first ids."""
        if self._slot is None:
            raise SandboxUsageError(f"sandbox {self.id} holds no uid slot (it failed to start)")
        return self._slot.uid, self._slot.gid

    def _diagnose(self, reason: str) -> SandboxInfraError:
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            err = self._stderr.tail(wait_s=2.0)[-2000:] if self._stderr is not None else ""
            return SandboxVanished(f"{reason}; bwrap exited with {proc.returncode}: {err}", backend=self.backend)
        return SandboxInfraError(reason, backend=self.backend, cause="agent_lost")

    def _kill_init(self) -> None:
        """SIGKILL to the sandbox's PID 1: the kernel then kills everything in its PID namespace."""
        with self._pidfd_lock:
            if self._init_pidfd is not None:
                try:
                    signal.pidfd_send_signal(self._init_pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _teardown(self) -> None:
        self._kill_init()
        with self._pidfd_lock:
            if self._init_pidfd is not None:
                os.close(self._init_pidfd)
                self._init_pidfd = None
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("bwrap sandbox %s did not exit after SIGKILL", self.id)
            for stream in (proc.stdin, proc.stdout):  # stderr is closed by its drain at EOF
                try:
                    stream.close()
                except (OSError, AttributeError):
                    pass
        if self._cgroup is not None:
            self._cgroup.destroy()
        if self._slot is not None:
            self._slot.release()  # last: nothing of this sandbox runs under the slot's uids any more

    def _abort(self) -> None:
        self._kill_init()  # not only bwrap: its child would answer one more request before its death signal
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    def describe(self) -> dict:
        return dict(super().describe(), cgroup=self._cgroup is not None)


class BwrapBackend(Backend):
    """Makes bwrap sandboxes on this machine."""

    name = "bwrap"

    def __init__(self, *, use_cgroups: bool = True):
        self.bwrap = shutil.which("bwrap") or ""
        self.cgroups = cgroup_version() if use_cgroups and os.geteuid() == 0 else None
        self._host_ids = identity.host_range()

    @property
    def host_ids(self) -> tuple[int, int]:
        """(first host uid, first host gid) of agentrl's registered range; each sandbox takes a slot of it."""
        if self._host_ids is None:
            self._host_ids = identity.host_range()
        if self._host_ids is None:
            raise BackendUnavailable(
                f"no host uid range is registered for {identity.RANGE_OWNER}, so sandbox uids cannot be kept "
                "off host root: run `python -m sandbox.identity setup` as root (scripts/system_setup.sh does)",
                backend=self.name,
            )
        return self._host_ids

    def check(self, spec: SandboxSpec | None = None) -> None:
        if not self.bwrap:
            raise BackendUnavailable("bubblewrap is not installed: apt-get install -y bubblewrap", backend=self.name)
        if os.geteuid() != 0:
            raise BackendUnavailable(
                "the bwrap backend runs as root: it maps each sandbox's uids onto agentrl's own unprivileged host "
                "range (which takes root) and limits it with a cgroup; use the docker backend otherwise",
                backend=self.name,
            )
        if self.cgroups is None:
            raise BackendUnavailable(
                f"no writable cgroup hierarchy with memory, pids and cpu controllers under {cgroup_root()}",
                backend=self.name,
            )
        self.host_ids  # noqa: B018 - raises the clear error when the range is missing
        require_link_protections(self.name)
        spec = spec or SandboxSpec()
        if not spec.read_only_root:
            raise SandboxUsageError(
                "SandboxSpec.read_only_root=False: the bwrap backend shares one read-only root filesystem between "
                "sandboxes; use the docker backend for a writable root"
            )
        if not spec.host_system and not images.rootfs_ready(spec.image):
            raise ImageMissing(
                f"root filesystem for {spec.image} not found at {images.rootfs_dir(spec.image)}: "
                f"run `{images.BUILD_COMMAND} --no-docker` (or set host_system=True)",
                backend=self.name,
            )
        if not spec.host_system:
            _check_traversable(images.rootfs_dir(spec.image), self.name)

    def create(self, spec: SandboxSpec) -> BwrapSandbox:
        self.check(spec)
        return BwrapSandbox(spec, self)

    def gc(self, *, all_owners: bool = False) -> int:
        """Removes cgroups left by dead processes (bwrap itself dies with its parent)."""

        def is_live(name: str) -> bool:
            pid = int(name.split("-", 1)[0]) if name.split("-", 1)[0].isdigit() else -1
            if all_owners and pid != os.getpid():
                return False
            try:
                os.kill(pid, 0)
            except PermissionError:
                return True
            except (ProcessLookupError, OverflowError, ValueError):
                return False
            return True

        return gc_cgroups(is_live) if self.cgroups is not None else 0


def cgroup_root() -> str:
    from sandbox.backends import cgroups

    return str(cgroups.ROOT)


def _check_traversable(path: Path, backend: str) -> None:
    """bwrap runs unprivileged: every directory above the root filesystem must let others through."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise ImageMissing(
                f"the root filesystem at {path} is not reachable by the sandbox's unprivileged host uid: {parent} "
                f"is mode {stat.filemode(mode)}. Build images under a world-traversable directory (the default "
                f"for root is {images.ROOT_ROOTFS_HOME}) or set AGENTRL_ROOTFS_DIR",
                backend=backend,
            )
