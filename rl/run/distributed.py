"""Multi-process jobs: start-up, and a channel between the processes for what is not an array.

On one host nothing needs initialising, and calling ``jax.distributed.initialize()`` without a
coordinator fails; on a cluster it must run before any other JAX call. The helper decides from
the environment so the same entry point works on a laptop, a GPU node and a TPU slice.

JAX's collectives move arrays between processes inside compiled programs, in an order every
process must repeat. A run also has to share Python data — each process's episodes, a failure —
at moments no program fixes, from whichever thread is driving the rollout. That goes through the
coordination service's key-value store instead (:class:`ProcessGroup`): it needs no matching
call on the other side, so a process that posts early never waits for one that is computing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable

import jax

log = logging.getLogger(__name__)

# A coordinator address means the launcher set the job up explicitly; otherwise JAX can
# auto-detect SLURM, Open MPI and Cloud TPU jobs when initialize() is called bare.
_COORDINATOR_VARS = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS")
# A process that stops sending heartbeats for this long is declared dead, and the job with it.
HEARTBEAT_TIMEOUT_S = 60
# A job that ends normally meets at a shutdown barrier; a failed one never waits there (see JobGuard).
SHUTDOWN_TIMEOUT_S = 30
_PREFIX = "agentrl"
_CHUNK = 1 << 20  # the coordination service's messages stay well under gRPC's limits

_initialized = False


def _more_than_one(value: str | None) -> bool:
    try:
        return value is not None and int(value) > 1
    except ValueError:
        return False


def distributed_requested(environ: dict[str, str] | None = None) -> bool:
    """Whether the environment describes a multi-process job.

    ``AGENTRL_DISTRIBUTED=1`` forces it on (and ``=0`` off); otherwise a coordinator address, a
    SLURM or Open MPI job of more than one task, or a multi-worker TPU slice switch it on.
    """
    env = os.environ if environ is None else environ
    forced = env.get("AGENTRL_DISTRIBUTED")
    if forced is not None:
        if forced not in ("0", "1"):
            raise ValueError(f"AGENTRL_DISTRIBUTED: expected '0' or '1', got {forced!r}")
        return forced == "1"
    if any(env.get(name) for name in _COORDINATOR_VARS):
        return True
    if _more_than_one(env.get("SLURM_NTASKS")) or _more_than_one(env.get("OMPI_COMM_WORLD_SIZE")):
        return True
    return "," in env.get("TPU_WORKER_HOSTNAMES", "")


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        out = int(value)
    except ValueError:
        out = 0
    if out < 1:
        raise ValueError(f"{name}: expected seconds >= 1, got {value!r}")
    return out


def maybe_initialize_distributed() -> bool:
    """Calls ``jax.distributed.initialize()`` once if the environment asks for it.

    With ``JAX_COORDINATOR_ADDRESS`` (plus ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``) the
    values are passed explicitly; otherwise JAX auto-detects the cluster. CPU processes exchange
    arrays with gloo. ``AGENTRL_HEARTBEAT_TIMEOUT_S`` (default 60) is how long a silent process
    may go before the job is ended. Returns True when this process is part of a multi-process
    job. Must run before any other JAX computation.
    """
    global _initialized
    if _initialized:
        return True
    if not distributed_requested():
        return False
    # Without it, a CPU job's programs that span processes fail to compile; GPUs and TPUs ignore it.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # A dead process then no longer aborts the others from inside the coordination client (a C++
    # fatal error and stack trace): they see it as missing (ProcessGroup.lost) and stop with a message.
    with contextlib.suppress(AttributeError, KeyError):
        jax.config.update("jax_enable_recoverability", True)
    timeouts = {
        "heartbeat_timeout_seconds": _env_int("AGENTRL_HEARTBEAT_TIMEOUT_S", HEARTBEAT_TIMEOUT_S),
        "shutdown_timeout_seconds": SHUTDOWN_TIMEOUT_S,
    }
    address = next((os.environ[v] for v in _COORDINATOR_VARS if os.environ.get(v)), None)
    if address is not None:
        jax.distributed.initialize(
            coordinator_address=address,
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]) if "JAX_NUM_PROCESSES" in os.environ else None,
            process_id=int(os.environ["JAX_PROCESS_ID"]) if "JAX_PROCESS_ID" in os.environ else None,
            **timeouts,
        )
    else:
        jax.distributed.initialize(**timeouts)
    _initialized = True
    return True


class PeerFailed(RuntimeError):
    """Another process of the job reported a failure (its message is this error's)."""

    def __init__(self, process: int, message: str):
        super().__init__(f"process {process} of the job failed: {message}")
        self.process, self.message = process, message


class ProcessGroup:
    """This process's place in a job of :attr:`count` processes, and a channel to the others.

    ``post(tag, data)`` leaves this process's bytes under ``tag``; ``collect(tag)`` returns every
    process's bytes once all have posted (None before), without blocking; ``gather`` does both and
    waits. A process that failed leaves its message (:meth:`report_failure`), which every
    waiting call raises as :class:`PeerFailed`. A one-process group needs no service at all.

    Args:
      index, count: ``jax.process_index()`` and ``jax.process_count()``.
      client: the coordination service's client (``None`` for a single process).
    """

    def __init__(self, index: int = 0, count: int = 1, client: object | None = None):
        if count > 1 and client is None:
            raise ValueError("ProcessGroup(client=): a job of several processes needs the coordination client")
        self.index, self.count, self._client = index, count, client
        self._local: dict[str, bytes] = {}  # a one-process group's posts
        self._collected: list[str] = []  # tags this process has read: the main process deletes them once all have

    @classmethod
    def current(cls) -> ProcessGroup:
        """The group of the running job (one process unless ``jax.distributed`` was initialised)."""
        if jax.process_count() == 1:
            return cls()
        from jax._src import distributed  # the client orbax uses too; JAX has no public handle on it

        return cls(jax.process_index(), jax.process_count(), distributed.global_state.client)

    @property
    def is_main(self) -> bool:
        """The one process that writes metrics, trajectories and other run files."""
        return self.index == 0

    # -- data ------------------------------------------------------------------------
    def post(self, tag: str, data: bytes) -> None:
        """Leaves ``data`` for the others under ``tag`` (compressed, in chunks)."""
        if self.count == 1:
            self._local[tag] = data
            return
        packed = zlib.compress(data, 1)
        chunks = [packed[i : i + _CHUNK] for i in range(0, len(packed), _CHUNK)] or [b""]
        for n, chunk in enumerate(chunks):
            self._client.key_value_set_bytes(f"{_PREFIX}/data/{tag}/{self.index}/{n}", chunk)
        self._client.key_value_set(f"{_PREFIX}/data/{tag}/{self.index}/chunks", str(len(chunks)))  # last: complete

    def collect(self, tag: str) -> list[bytes] | None:
        """Every process's data under ``tag`` in process order, or None while one has not posted.

        Raises :class:`PeerFailed` when another process reported a failure."""
        if self.count == 1:
            return [self._local.pop(tag)] if tag in self._local else None
        self.raise_peer_failure()
        counts = []
        for p in range(self.count):
            n = self._try_get(f"{_PREFIX}/data/{tag}/{p}/chunks")
            if n is None:
                return None
            counts.append(int(n))
        out = []
        for p, n in enumerate(counts):
            entries = dict(
                (k.rsplit("/", 1)[1], v) for k, v in self._client.key_value_dir_get_bytes(f"{_PREFIX}/data/{tag}/{p}/")
            )
            out.append(zlib.decompress(b"".join(entries[str(i)] for i in range(n))))
        self._client.key_value_set(f"{_PREFIX}/read/{tag}/{self.index}", "1")
        self._collected.append(tag)
        self._clean_up()
        return out

    def _try_get(self, key: str) -> str | None:
        try:
            return self._client.key_value_try_get(key)
        except Exception as exc:  # JaxRuntimeError; any other status (the service gone) is an error
            if "NOT_FOUND" in str(exc):
                return None
            raise

    def gather(
        self, tag: str, data: bytes, *, poll_s: float = 0.01, waiting: Callable[[], None] | None = None
    ) -> list[bytes]:
        """``post`` then wait for ``collect``; ``waiting()`` is called between polls."""
        self.post(tag, data)
        delay = poll_s
        while (out := self.collect(tag)) is None:
            if waiting is not None:
                waiting()
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        return out

    def _clean_up(self) -> None:
        """The main process deletes a tag's keys once every process has read them."""
        if not self.is_main:
            return
        still = []
        for tag in self._collected:
            if len(self._client.key_value_dir_get(f"{_PREFIX}/read/{tag}/")) == self.count:
                self._client.key_value_delete(f"{_PREFIX}/data/{tag}/")
                self._client.key_value_delete(f"{_PREFIX}/read/{tag}/")
            else:
                still.append(tag)
        self._collected = still

    # -- failures --------------------------------------------------------------------
    def report_failure(self, message: str) -> None:
        """Tells the other processes this one failed (best effort: the service may be gone too)."""
        if self.count == 1:
            return
        try:
            self._client.key_value_set(f"{_PREFIX}/failed/{self.index}", message[:4000])
        except Exception:  # noqa: BLE001 - the coordinator (process 0) may be the one that died
            log.debug("could not report the failure to the coordination service", exc_info=True)

    def peer_failures(self) -> dict[int, str]:
        """Failures other processes reported: ``{process: message}``."""
        if self.count == 1:
            return {}
        entries = self._client.key_value_dir_get(f"{_PREFIX}/failed/")
        out = {int(k.rsplit("/", 1)[1]): v for k, v in entries}
        out.pop(self.index, None)
        return out

    def lost(self) -> list[int]:
        """Processes the coordination service no longer hears from (after the heartbeat timeout)."""
        if self.count == 1:
            return []
        live = self._client.get_live_nodes(list(range(self.count)))
        return [p for p in range(self.count) if p not in live]

    def finish(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Leaves the job after a successful run. Every process meets at a barrier; then the others
        disconnect, and the main process — which hosts the coordination service — goes last, so no
        process finds the service gone while it disconnects."""
        if self.count == 1:
            return
        self._client.wait_at_barrier(f"{_PREFIX}/finished", int(timeout_s * 1000))
        if not self.is_main:
            jax.distributed.shutdown()
            return
        deadline = time.monotonic() + timeout_s
        while len(self.lost()) < self.count - 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        jax.distributed.shutdown()

    def leave(self, timeout_s: float) -> None:
        """Leaves a failed job without the shutdown barrier (peers may never reach it).

        The coordination service lives in the main process, and a process that finds it gone
        aborts from inside the client (a C++ fatal error, exit -6) instead of ending with its own
        message. So another process disconnects first — bounded, since the service may be gone
        already —, and the main process waits up to ``timeout_s`` for the others to disconnect
        or be declared lost before it exits and takes the service with it."""
        if self.count == 1:
            return
        if not self.is_main:
            worker = threading.Thread(target=_disconnect, name="agentrl-leave", daemon=True)
            worker.start()
            worker.join(timeout=min(timeout_s, 10.0))
            return
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(Exception):
            while len(self.lost()) < self.count - 1 and time.monotonic() < deadline:
                time.sleep(0.1)

    def raise_peer_failure(self) -> None:
        failures = self.peer_failures()
        if failures:
            first = min(failures)
            raise PeerFailed(first, failures[first])


def _disconnect() -> None:
    with contextlib.suppress(Exception):  # the service may be gone already: nothing left to tell it
        jax.distributed.shutdown()
