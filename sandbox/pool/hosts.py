"""Where sandboxes run: hosts (one backend each), their capacity and health, and placement.

A `Host` is a backend — the local bwrap, or one Docker daemon reached by URL
(``unix://``, ``tcp://``, ``ssh://``) — plus how many of its sandboxes may be
in use at once. The warm pool spreads leases over hosts by free capacity and
takes a host out of rotation when its daemon stops answering; a background
probe with exponential backoff puts it back when it answers again. A host that
lacks an image is skipped for specs naming that image (re-checked with backoff)
instead of failing every job sent to it.

The host's mutable state is guarded by the pool's lock (``PoolState.lock``, see
:mod:`sandbox.pool.state`); the methods that talk to a daemon
(:meth:`Host.probe`, :meth:`Host.sweep`) are called without it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from sandbox.backends.base import LABEL, Backend, owner_tag
from sandbox.backends.docker import labelled_containers
from sandbox.errors import DaemonUnreachable, SandboxInfraError, SandboxUsageError

log = logging.getLogger(__name__)

DOCKER_SCHEMES = ("unix://", "tcp://", "ssh://", "http://", "https://")


def make_backend(target: str, **kwargs: Any) -> Backend:
    """A backend from a short name or a daemon URL: ``bwrap``, ``docker`` (default daemon), ``tcp://h:2375``..."""
    from sandbox import get_backend

    if not isinstance(target, str) or not target:
        raise SandboxUsageError(f"host: expected 'bwrap', 'docker' or a daemon URL, got {target!r}")
    if target in ("bwrap", "docker"):
        return get_backend(target, **kwargs)
    if target.startswith(DOCKER_SCHEMES):
        return get_backend("docker", url=target, **kwargs)
    raise SandboxUsageError(
        f"host: expected 'bwrap', 'docker' or a daemon URL starting with one of {DOCKER_SCHEMES}, got {target!r}"
    )


class Host:
    """One backend in the pool's rotation.

    Args:
      target: a :class:`Backend`, or what :func:`make_backend` accepts.
      capacity: sandboxes that may be leased (running jobs) at once. Default: the
        host's CPU count (``docker info`` for a daemon, ``os.cpu_count()`` locally).
      max_sandboxes: sandboxes that may exist at once (leased + idle + resetting).
        Default ``2 * capacity``: the spare ones are reset while others run.
      name: for metrics and results; default the backend's address.
    """

    def __init__(
        self,
        target: Backend | str,
        *,
        capacity: int | None = None,
        max_sandboxes: int | None = None,
        name: str | None = None,
    ):
        for field, value in (("capacity", capacity), ("max_sandboxes", max_sandboxes)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise SandboxUsageError(f"Host.{field}: expected an int >= 1 or None, got {value!r}")
        self.backend = target if isinstance(target, Backend) else make_backend(target)
        self.name = name or (
            self.backend.address if self.backend.name == "docker" else f"{self.backend.name}:{self.backend.address}"
        )
        self._capacity = capacity
        self._max = max_sandboxes
        if capacity is not None and max_sandboxes is not None and max_sandboxes < capacity:
            raise SandboxUsageError(f"Host.max_sandboxes: expected >= capacity ({capacity}), got {max_sandboxes}")
        # -- state, guarded by the owning pool's lock --------------------------
        self.healthy = True
        self.answered = False  # has its backend ever made a sandbox or passed a probe since the pool began
        self.down_reason = ""
        self.next_probe = 0.0
        self.probe_backoff_s = 0.0
        self.leased = 0  # leases handed out or being created for a waiting acquire
        self.resetting: dict[tuple, int] = {}  # spec key -> sandboxes being reset
        self.warming = 0  # sandboxes being created ahead of demand
        self.idle: dict[tuple, list] = {}  # spec key -> idle pool entries, most recently used last
        self.missing_images: dict[
            str, tuple[float, float, SandboxInfraError]
        ] = {}  # image -> (retry at, backoff, error)

    # -- capacity -------------------------------------------------------------
    @property
    def capacity(self) -> int:
        if self._capacity is None:
            self._capacity = self._detect_cpus()
        return self._capacity

    @property
    def max_sandboxes(self) -> int:
        return self._max or 2 * self.capacity

    def _detect_cpus(self) -> int:
        if self.backend.name == "docker":
            try:
                return max(1, int(self.backend.client.info().get("NCPU", 0)) or (os.cpu_count() or 1))
            except Exception as exc:  # noqa: BLE001 - a down daemon still needs a capacity to come back with
                log.warning("%s: could not read NCPU (%s); assuming this machine's CPU count", self.name, exc)
        return os.cpu_count() or 1

    @property
    def n_idle(self) -> int:
        return sum(len(entries) for entries in self.idle.values())

    @property
    def total(self) -> int:
        """Sandboxes that exist or are being made here."""
        return self.leased + sum(self.resetting.values()) + self.warming + self.n_idle

    @property
    def free(self) -> int:
        return self.capacity - self.leased

    def can_run(self, image: str, now: float) -> bool:
        """In rotation, and not known to lack ``image`` (unless it is time to look again)."""
        if not self.healthy:
            return False
        missing = self.missing_images.get(image)
        return missing is None or now >= missing[0]

    # -- health ---------------------------------------------------------------
    def mark_down(self, reason: str, now: float, *, first_probe_s: float) -> bool:
        """Takes the host out of rotation; returns True if it was in it."""
        was = self.healthy
        self.healthy = False
        self.down_reason = reason
        if was:
            self.probe_backoff_s = first_probe_s
            self.next_probe = now + first_probe_s
            log.warning("host %s out of rotation: %s", self.name, reason)
        return was

    def mark_up(self) -> None:
        if not self.healthy:
            log.warning("host %s back in rotation", self.name)
        self.healthy = True
        self.answered = True
        self.answered = False  # has its backend ever made a sandbox or passed a probe since the pool began
        self.down_reason = ""
        self.probe_backoff_s = 0.0

    def probe_failed(self, reason: str, now: float, *, max_backoff_s: float) -> None:
        self.down_reason = reason
        self.probe_backoff_s = min(max(self.probe_backoff_s, 0.05) * 2, max_backoff_s)
        self.next_probe = now + self.probe_backoff_s

    def mark_missing(self, image: str, error: SandboxInfraError, now: float, *, first_s: float, max_s: float) -> None:
        previous = self.missing_images.get(image)
        backoff = first_s if previous is None else min(previous[1] * 2, max_s)
        self.missing_images[image] = (now + backoff, backoff, error)

    def probe(self, timeout: float = 5.0) -> None:
        """Raises :class:`SandboxInfraError` unless the backend answers now (no pool lock held)."""
        if self.backend.name != "docker":
            self.backend.check()
            return
        import docker

        url = self.backend.address
        try:
            # A fresh short-timeout client: the backend's own waits up to a minute per call, and a
            # probe of a lost remote daemon must not hold the health checker that long.
            client = docker.APIClient(
                base_url=url, version="auto", timeout=timeout, use_ssh_client=url.startswith("ssh://")
            )
            try:
                client.ping()
            finally:
                client.close()
        except Exception as exc:  # noqa: BLE001 - any way of not answering
            raise DaemonUnreachable(f"{url}: {exc.__class__.__name__}: {exc}", backend="docker") from exc

    def sweep(self, live_ids: Iterable[str]) -> int:
        """Runs the backend's ``gc()`` (what dead processes left), then removes this process's
        containers not in ``live_ids`` (e.g. left by a daemon restart); returns how many it removed."""
        removed = self.backend.gc()
        if self.backend.name != "docker":
            return removed
        live = set(live_ids)
        client = self.backend.client
        for container in labelled_containers(client, [LABEL, f"agentrl.owner={owner_tag()}"]):
            if container["name"] in live:
                continue
            try:
                client.api.remove_container(container["id"], force=True)
                removed += 1
            except Exception as exc:  # noqa: BLE001 - auto_remove may win the race
                log.debug("sweep: %s: %s", container["name"], exc)
        return removed

    def __repr__(self) -> str:
        return f"Host({self.name!r}, capacity={self._capacity}, healthy={self.healthy})"


def as_hosts(hosts: Host | Backend | str | Iterable[Host | Backend | str], capacity: int | None = None) -> list[Host]:
    """Normalises what the pool accepts: one host or several, as Hosts, backends, names or URLs."""
    if isinstance(hosts, (Host, Backend, str)):
        hosts = [hosts]
    out = [h if isinstance(h, Host) else Host(h, capacity=capacity) for h in hosts]
    if not out:
        raise SandboxUsageError("hosts: expected at least one host")
    names = [h.name for h in out]
    if len(set(names)) != len(names):
        raise SandboxUsageError(f"hosts: each host must be given once, got {names}")
    return out


def place(hosts: Iterable[Host], image: str, spec_key: tuple, avoid: Iterable[str], now: float) -> Host | None:
    """The host for the next lease of ``spec_key``, or None if every host that can run it is full.

    Preference: not in ``avoid`` (where the previous attempt failed), then a host
    holding an idle sandbox of this spec (handed out in milliseconds), then the
    largest fraction of free capacity (spreads load over unequal hosts).
    """
    avoid = set(avoid)
    candidates = [h for h in hosts if h.can_run(image, now) and h.free > 0]
    if not candidates:
        return None
    return min(candidates, key=lambda h: (h.name in avoid, not h.idle.get(spec_key), -h.free / h.capacity, h.total))
