"""The fast local backend: bubblewrap namespaces + cgroups + rlimits.

Each sandbox is one ``bwrap`` process holding new user, PID, network, mount,
IPC and UTS namespaces, with the agent as PID 1. The root filesystem is the one
the image build produced (read-only), so code sees the same Python and tools as
under Docker; ``SandboxSpec.host_system`` binds the host's system directories
instead. Writable directories are size-capped tmpfs mounts. Memory, process and
CPU limits come from a per-sandbox cgroup when the host offers one (as root),
else from rlimits alone, which the startup log says.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import shutil
import subprocess
from pathlib import Path

from sandbox import images
from sandbox.agent import BOOTSTRAP
from sandbox.base import Backend, Sandbox
from sandbox.cgroups import SandboxCgroup, cgroup_version, gc_cgroups
from sandbox.channel import PipeTransport
from sandbox.errors import BackendUnavailable, ImageMissing, SandboxInfraError, SandboxStartError, SandboxVanished
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
_JOIN_CGROUPS = 'for f in $AGENTRL_CGROUP_PROCS; do echo $$ > "$f" || exit 97; done; exec "$@"'


class BwrapSandbox(Sandbox):
    backend = "bwrap"

    def __init__(self, spec: SandboxSpec, backend: BwrapBackend):
        super().__init__(spec)
        self._proc: subprocess.Popen | None = None
        self._cgroup: SandboxCgroup | None = None
        version = backend.cgroups
        try:
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
        spec = self.spec
        argv = [
            backend.bwrap,
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
        rlimits = {}
        if self._cgroup is not None:
            env["AGENTRL_CGROUP_PROCS"] = " ".join(self._cgroup.procs_files)
            argv = ["/bin/sh", "-c", _JOIN_CGROUPS, "sh", *argv]
        else:  # no cgroup: per-process limits are all we have
            rlimits.update({"AS": spec.memory_mb << 20, "CPU": int(spec.timeout_s * 4) + 60})
        try:
            self._proc = _popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, close_fds=True
            )
        except OSError as exc:
            raise SandboxStartError(f"cannot run bwrap: {exc}", backend=self.backend) from exc
        transport = PipeTransport(self._proc.stdin, self._proc.stdout)
        oom_files = ["/run/agentrl/oom"] if self._cgroup is not None else []
        self._boot(transport, oom_files=oom_files, rlimits=rlimits)

    def _namespace_args(self) -> list[str]:
        args = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not self.spec.network:
            args.append("--unshare-net")
        args += ["--disable-userns", "--uid", "0", "--gid", "0", "--hostname", "sandbox", "--cap-drop", "ALL"]
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
                    args += ["--ro-bind" if spec.read_only_root else "--bind", str(entry), f"/{entry.name}"]
        args += ["--proc", "/proc", "--dev", "/dev", "--dir", "/run/agentrl"]
        args += ["--size", str(spec.tmp_mb << 20), "--tmpfs", "/tmp"]
        args += ["--size", str(spec.tmp_mb << 20), "--tmpfs", "/dev/shm"]
        args += ["--size", str(spec.workspace_mb << 20), "--tmpfs", spec.workdir, "--chmod", "1777", spec.workdir]
        if self._cgroup is not None:
            args += ["--ro-bind", self._cgroup.oom_file, "/run/agentrl/oom"]
        if spec.read_only_root:
            args += ["--remount-ro", "/"]
        args += ["--chdir", spec.workdir]
        return args

    def _diagnose(self, reason: str) -> SandboxInfraError:
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read().decode("utf-8", "replace").strip()[-2000:] if proc.stderr else ""
            return SandboxVanished(f"{reason}; bwrap exited with {proc.returncode}: {err}", backend=self.backend)
        return SandboxInfraError(reason, backend=self.backend, cause="agent_lost")

    def _teardown(self) -> None:
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("bwrap sandbox %s did not exit after SIGKILL", self.id)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    stream.close()
                except (OSError, AttributeError):
                    pass
        if self._cgroup is not None:
            self._cgroup.destroy()

    def _abort(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()  # the agent is PID 1 of the namespace: everything inside dies with it

    def describe(self) -> dict:
        return dict(super().describe(), cgroup=self._cgroup is not None)


class BwrapBackend(Backend):
    """Makes bwrap sandboxes on this machine."""

    name = "bwrap"

    def __init__(self, *, use_cgroups: bool = True):
        self.bwrap = shutil.which("bwrap") or ""
        self.cgroups = cgroup_version() if use_cgroups and os.geteuid() == 0 else None
        if self.bwrap and self.cgroups is None:
            log.warning("bwrap backend: no writable cgroups; memory/pids limits fall back to per-process rlimits")

    def check(self, spec: SandboxSpec | None = None) -> None:
        if not self.bwrap:
            raise BackendUnavailable("bubblewrap is not installed: apt-get install -y bubblewrap", backend=self.name)
        spec = spec or SandboxSpec()
        if not spec.host_system and not images.rootfs_ready(spec.image):
            raise ImageMissing(
                f"root filesystem for {spec.image} not found at {images.rootfs_dir(spec.image)}: "
                f"run `{images.BUILD_COMMAND} --no-docker` (or set host_system=True)",
                backend=self.name,
            )

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
