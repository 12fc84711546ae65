"""The production backend: one long-lived Docker container per sandbox, via the Engine API.

The container's PID 1 is the agent (no ``docker exec`` per command: requests
travel over the attach socket, which is what makes exec cheap). Isolation:
no network by default, memory/CPU/pids limits, every capability dropped but
the few the agent needs to run commands as the unprivileged ``sandbox`` uid
(commands have none), no-new-privileges, agentrl's seccomp profile
(:mod:`sandbox.seccomp`), read-only root, tmpfs workspace, /tmp and /dev/shm
capped in bytes and inodes, a private IPC namespace.
``stdin_once`` + ``auto_remove`` mean that if the host process dies — even by
SIGKILL — the agent sees EOF, exits, and the daemon removes the container;
:meth:`DockerBackend.gc` sweeps anything left (also run on start-up).

A backend talks to one daemon, local or remote (``unix://``, ``tcp://``,
``ssh://``); several backends spread sandboxes over several hosts.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from sandbox import identity, images, seccomp
from sandbox.agent import BOOTSTRAP
from sandbox.agent.confine import AGENT_CAPS
from sandbox.backends.base import LABEL, Backend, Sandbox, owner_tag
from sandbox.backends.channel import MultiplexedSocketTransport
from sandbox.backends.link_protection import require_link_protections
from sandbox.backends.socket_memory import bound_docker_container
from sandbox.errors import (
    DaemonUnreachable,
    ImageMissing,
    SandboxInfraError,
    SandboxStartError,
    SandboxVanished,
)
from sandbox.spec import SandboxSpec

# How long the first contact with a daemon may take: an unreachable daemon must be named within seconds.
CONNECT_TIMEOUT_S = 5.0
log = logging.getLogger(__name__)

_OOM_FILES = ["/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"]
_REMOVE_WAIT_S = 10.0


def _docker():
    import docker  # deferred: `import sandbox` must not need the SDK's import time

    return docker


def _requests_error() -> type[Exception]:
    import requests  # the SDK's transport

    return requests.exceptions.RequestException


class DockerSandbox(Sandbox):
    backend = "docker"

    def __init__(self, spec: SandboxSpec, backend: DockerBackend):
        super().__init__(spec)
        self._backend = backend
        self._container = None
        self._transport: MultiplexedSocketTransport | None = None
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        docker = _docker()
        spec = self.spec
        client = self._backend.client
        uid, gid = identity.USERS["sandbox"]

        def tmpfs(size_mb: int, owner: str) -> str:
            return f"rw,exec,nosuid,nodev,{owner},size={size_mb}m,nr_inodes={spec.inodes_for(size_mb)}"

        try:
            api = client.api
            host_config = api.create_host_config(
                auto_remove=True,
                network_mode="bridge" if spec.network else "none",
                mem_limit=spec.memory_mb << 20,
                memswap_limit=spec.memory_mb << 20,
                nano_cpus=int(spec.cpus * 1e9),
                pids_limit=spec.pids,
                cap_drop=["ALL"],
                # The agent gives up SETPCAP at boot, after it has cut its bounding set to AGENT_CAPS.
                cap_add=[*AGENT_CAPS, "SETPCAP"],
                security_opt=["no-new-privileges:true", f"seccomp={seccomp.docker_profile()}"],
                read_only=spec.read_only_root,
                # "none": a private IPC namespace whose /dev/shm is ours to mount (capped like the others).
                ipc_mode="none",
                tmpfs={
                    spec.workdir: tmpfs(spec.workspace_mb, f"mode=755,uid={uid},gid={gid}"),
                    "/tmp": tmpfs(spec.tmp_mb, "mode=1777"),
                    "/dev/shm": tmpfs(spec.tmp_mb, "mode=1777"),
                    identity.JUDGE_HOME: tmpfs(
                        identity.JUDGE_HOME_MB, "mode=700,uid={},gid={}".format(*identity.USERS["judge"])
                    ),
                },
                log_config=docker.types.LogConfig(type="none"),
            )
            created = api.create_container(
                spec.image,
                command=["python3", "-I", "-S", "-u", "-c", BOOTSTRAP],
                name=self.id,
                hostname="sandbox",
                user="0:0",
                working_dir=spec.workdir,
                stdin_open=True,  # with detach=False this sets StdinOnce: our detaching = EOF = exit
                # The agent is PID 1 and ignores SIGTERM: `docker stop` and a daemon shutdown would
                # only wait out their grace period before the SIGKILL that actually ends it.
                stop_signal="SIGKILL",
                detach=False,
                tty=False,
                labels={LABEL: "1", "agentrl.owner": owner_tag(), "agentrl.created": f"{time.time():.0f}"},
                host_config=host_config,
            )
            self._container = client.containers.prepare_model({"Id": created["Id"]})
            raw = client.api.attach_socket(
                self._container.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            self._attach = raw  # keep the response alive: collecting it closes the socket
            self._container.start()
            bound_docker_container(
                created["Id"],
                spec.memory_mb << 20,
                daemon_cgroup_version=self._backend.cgroup_version,
                daemon=self._backend.address,
            )
        except docker.errors.ImageNotFound as exc:
            raise self._backend.missing_image(spec.image) from exc
        except docker.errors.APIError as exc:
            raise SandboxStartError(
                f"cannot start a container from {spec.image}: {exc.explanation or exc}", backend=self.backend
            ) from exc
        except docker.errors.DockerException as exc:  # transport-level: daemon gone
            raise DaemonUnreachable(f"{self._backend.address}: {exc}", backend=self.backend) from exc
        except (_requests_error(), OSError) as exc:  # the SDK lets these through when the daemon dies mid-call
            raise DaemonUnreachable(f"{self._backend.address}: {exc}", backend=self.backend) from exc
        transport = MultiplexedSocketTransport(getattr(raw, "_sock", raw))
        self._transport = transport
        self._boot(transport, oom_files=_OOM_FILES)

    def _diagnose(self, reason: str) -> SandboxInfraError:
        docker = _docker()
        if self._container is None:
            return SandboxStartError(reason, backend=self.backend)
        try:
            self._container.reload()
        except docker.errors.NotFound:
            return SandboxVanished(
                f"{reason}; container {self.id} no longer exists (killed or removed)", backend=self.backend
            )
        except Exception as exc:  # noqa: BLE001 - any failure to reach the daemon
            return DaemonUnreachable(
                f"{reason}; daemon {self._backend.address} unreachable: {exc}", backend=self.backend
            )
        state = self._container.attrs.get("State", {})
        if state.get("Status") != "running":
            detail = f"status={state.get('Status')} exit={state.get('ExitCode')} oom={state.get('OOMKilled')}"
            return SandboxVanished(f"{reason}; container {self.id} stopped ({detail})", backend=self.backend)
        return SandboxInfraError(
            f"{reason}; container {self.id} still running", backend=self.backend, cause="agent_lost"
        )

    def _teardown(self) -> None:
        if self._container is None:
            return
        docker = _docker()
        try:
            self._container.remove(force=True)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress (auto_remove)
                log.warning("could not remove container %s: %s", self.id, exc)
        except Exception as exc:  # noqa: BLE001 - daemon gone: gc() removes it later
            log.warning("could not remove container %s (daemon %s): %s", self.id, self._backend.address, exc)
            return
        self._wait_gone(_REMOVE_WAIT_S)

    def _wait_gone(self, timeout: float) -> None:
        """Until the daemon no longer lists the container (an auto-removal may still be in flight)."""
        docker = _docker()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self._backend.client.api.inspect_container(self._container.id)
            except docker.errors.NotFound:
                return
            except Exception:  # noqa: BLE001 - daemon gone: gc() removes it later
                return
            time.sleep(0.02)
        log.warning("container %s still listed %.0fs after its removal", self.id, timeout)

    def _abort(self) -> None:
        container = self._container
        if container is not None:
            # The kill is an Engine API call that can hang on a lost remote daemon: off this thread.
            threading.Thread(target=self._kill_quietly, args=(container,), daemon=True).start()
        if self._transport is not None:
            self._transport.interrupt()  # a call blocked on the socket sees EOF now

    def _kill_quietly(self, container) -> None:
        try:
            container.kill()
        except Exception as exc:  # noqa: BLE001 - gone already, or the daemon is: close() cleans up
            log.debug("abort: kill of %s failed: %s", self.id, exc)

    def describe(self) -> dict:
        return dict(super().describe(), host=self._backend.address)


class DockerBackend(Backend):
    """Makes Docker sandboxes on one daemon.

    Args:
      url: daemon URL (``unix:///var/run/docker.sock``, ``tcp://10.0.0.2:2375``,
        ``ssh://user@host``); default ``DOCKER_HOST`` or the local socket.
      gc_on_start: remove containers leaked by dead processes on first use.
      timeout: seconds for each Engine API call.
    """

    name = "docker"

    def __init__(
        self, url: str | None = None, *, gc_on_start: bool = True, timeout: float = 60.0, max_pool_size: int = 64
    ):
        self.url = url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self._timeout = timeout
        self._pool = max_pool_size
        self._client = None
        self._lock = threading.Lock()
        self._gc_on_start = gc_on_start
        self._images_seen: set[str] = set()
        self._cgroup_version: str | None = None

    @property
    def address(self) -> str:
        return self.url

    @property
    def client(self):
        """The SDK client, connected on first use; :class:`DaemonUnreachable` if the daemon is down."""
        with self._lock:
            if self._client is None:
                docker = _docker()
                try:
                    client = docker.DockerClient(
                        base_url=self.url,
                        version="auto",
                        timeout=min(self._timeout, CONNECT_TIMEOUT_S),  # a TCP peer that never answers
                        max_pool_size=self._pool,
                        # ssh:// through the system `ssh` binary (as the docker CLI does): no paramiko
                        # needed, and ~/.ssh/config, agents and known_hosts apply.
                        use_ssh_client=self.url.startswith("ssh://"),
                    )
                    client.ping()
                    client.api.timeout = self._timeout  # answered: requests get their full time again
                except Exception as exc:  # noqa: BLE001 - every way of not reaching it
                    raise DaemonUnreachable(
                        f"no Docker daemon answers at {self.url} ({exc.__class__.__name__}: {exc}); "
                        "start it (`dockerd &` as root, or `bash scripts/system_setup.sh`) or pass another url",
                        backend=self.name,
                    ) from exc
                self._client = client
                if self._gc_on_start:
                    self._gc_locked(all_owners=False)
            return self._client

    @property
    def cgroup_version(self) -> str:
        """The daemon's cgroup version ("1" or "2"), asked once: it decides how socket memory is bounded."""
        if self._cgroup_version is None:
            try:
                self._cgroup_version = str(self.client.info().get("CgroupVersion") or "1")
            except Exception as exc:  # noqa: BLE001 - every way of not reaching it
                raise DaemonUnreachable(f"{self.url}: {exc}", backend=self.name) from exc
        return self._cgroup_version

    def missing_image(self, image: str) -> ImageMissing:
        where = "" if self.url == "unix:///var/run/docker.sock" else f" --docker-url {self.url}"
        return ImageMissing(
            f"image {image} not found on {self.url}: run `{images.BUILD_COMMAND}{where}`", backend=self.name
        )

    def check(self, spec: SandboxSpec | None = None) -> None:
        spec = spec or SandboxSpec()
        client = self.client
        if spec.image in self._images_seen:
            return
        if self.url.startswith(
            "unix://"
        ):  # the daemon's kernel is this one; a remote host's setup script checks its own
            require_link_protections(self.name)
        try:
            client.images.get(spec.image)
        except _docker().errors.ImageNotFound as exc:
            raise self.missing_image(spec.image) from exc
        except Exception as exc:  # noqa: BLE001
            raise DaemonUnreachable(f"{self.url}: {exc}", backend=self.name) from exc
        self._images_seen.add(spec.image)

    def create(self, spec: SandboxSpec) -> DockerSandbox:
        self.check(spec)
        return DockerSandbox(spec, self)

    def gc(self, *, all_owners: bool = False) -> int:
        """Removes agentrl containers whose owning process is gone (or all with ``all_owners``)."""
        self.client  # noqa: B018 - connect (and fail clearly) first
        with self._lock:
            return self._gc_locked(all_owners=all_owners)

    def _gc_locked(self, *, all_owners: bool) -> int:
        docker = _docker()
        me = owner_tag()
        node = os.uname().nodename
        removed = 0
        for container in labelled_containers(self._client, [LABEL]):
            owner = container["labels"].get("agentrl.owner", "")
            host, _, pid = owner.rpartition(":")
            if not all_owners:
                if owner == me or host != node or not pid.isdigit() or _pid_alive(int(pid)):
                    continue
            elif owner == me:
                continue
            try:
                self._client.api.remove_container(container["id"], force=True)
                removed += 1
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code != 409:
                    log.warning("gc: could not remove %s: %s", container["name"], exc)
        if removed:
            log.info("gc removed %d leaked sandbox containers on %s", removed, self.url)
        return removed

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def labelled_containers(client, labels: list[str]) -> list[dict]:
    """``[{"id", "name", "labels"}]`` of the containers carrying every label, from one list call.

    Not ``client.containers.list``: it inspects each container after listing, and one that an
    auto-removal takes away in between makes the whole call fail with ``NotFound``.
    """
    found = client.api.containers(all=True, filters={"label": list(labels)})
    return [
        {"id": c["Id"], "name": (c.get("Names") or ["/"])[0].lstrip("/"), "labels": c.get("Labels") or {}}
        for c in found
    ]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
