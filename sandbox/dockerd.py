"""A private Docker daemon on this machine: its own socket, data root, exec root and containerd.

Multi-host behaviour (placement, a daemon lost mid-batch, a daemon without the
image) needs more than one daemon, and the machine's main daemon is shared and
must never be stopped. This starts a second one that can be killed, stopped and
restarted at will — the tests use it as a fixture; it also serves a quick local
experiment with a many-host pool:

    python -m sandbox.dockerd --root /tmp/agentrl-d2 --tcp-port 23750   # Ctrl-C or kill stops and cleans it

Needs root and ``dockerd``. No bridge network and no iptables rules are made,
so nothing on the host's network changes (sandboxes have no network anyway).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from sandbox import images
from sandbox.backends.cgroups import kill_until_empty


class PrivateDockerd:
    """One extra ``dockerd`` under ``root``; :meth:`cleanup` leaves no process, mount or file behind.

    Args:
      root: directory for the socket, data root, exec root, pid file and log (created; removed by cleanup).
      tcp_port: also listen on ``tcp://127.0.0.1:<port>`` (to exercise ``tcp://`` URLs).
    """

    def __init__(self, root: str | Path, *, tcp_port: int | None = None, dockerd: str = "dockerd"):
        self.root = Path(root).resolve()
        if len(str(self.root / "exec/containerd/containerd.sock")) > 100:
            raise ValueError(f"root: {self.root} is too long for a unix socket path under it; use a shorter one")
        self.tcp_port = tcp_port
        self.dockerd = shutil.which(dockerd) or ""
        self.proc: subprocess.Popen | None = None
        self._log = None
        self._lost = False  # killed: containerd shims (and their containers) may be left running

    @property
    def url(self) -> str:
        return f"unix://{self.root}/docker.sock"

    @property
    def tcp_url(self) -> str:
        if self.tcp_port is None:
            raise ValueError("tcp_url: this daemon was started without tcp_port")
        return f"tcp://127.0.0.1:{self.tcp_port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60.0) -> None:
        """Starts the daemon and waits until it answers."""
        if not self.dockerd:
            raise RuntimeError("dockerd is not installed: apt-get install -y docker.io")
        if os.geteuid() != 0:
            raise RuntimeError("a private dockerd needs root")
        if self.running:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        argv = [
            self.dockerd,
            f"--host={self.url}",
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.root / 'exec'}",
            f"--pidfile={self.root / 'docker.pid'}",
            "--bridge=none",
            "--iptables=false",
            "--ip-masq=false",
            "--shutdown-timeout=2",
        ]
        if self.tcp_port is not None:
            argv.append(f"--host={self.tcp_url}")
        self._log = open(self.root / "dockerd.log", "ab")  # noqa: SIM115 - held for the daemon's lifetime
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited with {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not answer within {timeout}s: {self.log_tail()}")
            time.sleep(0.1)
        self._lost = False

    def _answers(self) -> bool:
        import docker

        try:
            client = docker.APIClient(base_url=self.url, version="auto", timeout=2)
            try:
                return client.ping()
            finally:
                client.close()
        except Exception:  # noqa: BLE001 - not up yet
            return False

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful stop (SIGTERM): the daemon kills and removes its containers first."""
        if not self.running:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: the daemon vanishes as a lost host would (its shims keep containers alive until restart)."""
        if self.running:
            self.proc.kill()
            self.proc.wait(30)
            self._lost = True

    def restart(self, timeout: float = 60.0) -> None:
        self.stop()
        self.start(timeout)

    def import_image(self, tag: str = images.DEFAULT_IMAGE) -> str:
        """Imports the sandbox image from the root filesystem already built for the main daemon."""
        return images.import_image(tag, url=self.url)

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join((self.root / "dockerd.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def container_ids(self) -> set[str]:
        """Every container this daemon, its containerd or runc has state for (live or leaked)."""
        ids: set[str] = set()
        for sub in (
            "data/containers",
            "exec/runtime-runc/moby",
            "exec/containerd/daemon/io.containerd.runtime.v2.task/moby",
        ):
            try:
                ids.update(p.name for p in (self.root / sub).iterdir())
            except OSError:
                continue
        for pid in _pids_mentioning(str(self.root)):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"-id" in argv[:-1]:
                ids.add(argv[argv.index(b"-id") + 1].decode())
        return ids

    def leftovers(self, ids: set[str] | None = None) -> dict[str, list]:
        """Processes mentioning ``root`` and container cgroups of ``ids`` (default: :meth:`container_ids`)."""
        groups = [d for cid in (self.container_ids() if ids is None else ids) for d in _container_cgroups(cid)]
        return {"processes": _pids_mentioning(str(self.root)), "cgroups": groups}

    def cleanup(self) -> None:
        """Stops the daemon, ends anything it left, unmounts and deletes ``root``. Never raises.

        A daemon SIGKILLed while creating a container can leave a ``runc init`` that not even
        the restarted daemon knows about; it is found through the container's cgroups.
        """
        ids = self.container_ids()
        try:
            if self._lost and not self.running:
                self.start()  # a restarted daemon kills what the lost one left under its shims
            self.stop()
        except Exception as exc:  # noqa: BLE001 - still clean up what we can
            print(f"PrivateDockerd.cleanup: {exc}", file=sys.stderr)
        self.kill()
        ids |= self.container_ids()
        for pid in _pids_mentioning(str(self.root)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for cid in ids:
            _reap_cgroups(_container_cgroups(cid))
        for mount in images.mounts_under(self.root):  # deepest first
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        if self._log is not None:
            self._log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PrivateDockerd:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()


def _pids_mentioning(needle: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _container_cgroups(cid: str) -> list[Path]:
    """A container's cgroup directories (v1: one per controller under ``docker/``; v2: unified)."""
    if len(cid) != 64 or not all(c in "0123456789abcdef" for c in cid):
        return []
    base = Path("/sys/fs/cgroup")
    return [*base.glob(f"*/docker/{cid}"), *base.glob(f"docker/{cid}"), *base.glob(f"system.slice/docker-{cid}.scope")]


def _reap_cgroups(dirs: list[Path]) -> None:
    def pids() -> set[int]:
        found: set[int] = set()
        for d in dirs:
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except OSError:
                continue
        return found

    kill_until_empty(pids, tries=50, pause_s=0.05)
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.dockerd", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="/tmp/agentrl-d2")
    parser.add_argument("--tcp-port", type=int, default=None)
    parser.add_argument("--no-image", action="store_true", help="do not import the sandbox image")
    args = parser.parse_args(argv)
    # Stop and clean up on Ctrl-C and on `kill` alike (a shell's background job starts with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    daemon = PrivateDockerd(args.root, tcp_port=args.tcp_port)
    try:
        daemon.start()
        if not args.no_image:
            daemon.import_image()
        print(f"dockerd up at {daemon.url}" + (f" and {daemon.tcp_url}" if args.tcp_port else ""), flush=True)
        while daemon.running:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        daemon.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
