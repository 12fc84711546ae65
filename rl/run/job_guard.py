"""One job, one fate: a failure in any process ends every process, and SIGTERM stops them cleanly.

A multi-process job left to itself does neither. A process that raises exits through JAX's
shutdown barrier, where it waits for peers that are themselves stuck in a collective waiting for
it; the coordination service then aborts everyone with a C++ stack trace minutes later, and a
process blocked in a collective never runs a Python signal handler, so SIGTERM does not stop it.

:class:`JobGuard` closes both gaps. The process that fails (or receives SIGTERM) leaves its
message in the job's key-value store (:meth:`ProcessGroup.report_failure`); a watchdog thread in
every process polls for such messages and for the SIGTERM byte that ``signal.set_wakeup_fd``
writes even while the main thread sits in C++. It then interrupts the main thread (which closes
the run's sandboxes and exits with the peer's message), and if the main thread cannot be
interrupted within ``grace_s`` — blocked in a collective whose peer is gone — it closes the
sandboxes itself and exits the process. A failed job never waits at the shutdown barrier, but
its main process, which hosts the coordination service, leaves last (:meth:`ProcessGroup.leave`).
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable

from rl.run.distributed import PeerFailed, ProcessGroup

log = logging.getLogger(__name__)
EXIT_FAILED = 1
EXIT_TERMINATED = 128 + signal.SIGTERM  # what a shell reports for a process that SIGTERM ended
SIGTERM_MESSAGE = "received SIGTERM"
LOST_MESSAGE = "stopped answering (killed, or its machine went down)"
RESUME_HINT = "the last complete checkpoint stands: run the same command to resume"


class Terminated(Exception):
    """SIGTERM (this process's, or a peer's): the run stops where it is; its last checkpoint stands."""


class JobGuard:
    """Watches one process of a job (see the module docstring).

    Args:
      group: the job's processes (a one-process group: SIGTERM handling only).
      grace_s: how long the main thread has to end by itself once the job is failing.
      poll_s: how often the watchdog looks for the others' failures.
    """

    def __init__(self, group: ProcessGroup, *, grace_s: float = 20.0, poll_s: float = 0.5):
        self.group, self.grace_s, self.poll_s = group, grace_s, poll_s
        self._cleanups: list[Callable[[], None]] = []
        self._cause: tuple[str, int] | None = None  # the job's failure: (message, exit code)
        self._reported = False
        self._deadline: float | None = None
        self._wakeup: int | None = None
        self._main_ending = False
        self._previous_wakeup = -1
        self._stop = threading.Event()
        # Held while the watchdog acts on a failure, and by close(): once close() returns, a peer that
        # ends its own successful run (and so leaves the service) is never taken for a lost one.
        self._acting = threading.Lock()
        self._thread: threading.Thread | None = None

    # -- set-up ------------------------------------------------------------------------
    def install(self) -> JobGuard:
        """SIGTERM handler and (for several processes) the watchdog. Call on the main thread."""
        signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.group.count > 1:
            read, write = os.pipe()
            os.set_blocking(read, False)
            os.set_blocking(write, False)
            self._previous_wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
            self._wakeup = read
            self._thread = threading.Thread(target=self._watch, name="agentrl-job-guard", daemon=True)
            self._thread.start()
        return self

    def on_abort(self, cleanup: Callable[[], None]) -> None:
        """``cleanup()`` runs before a forced exit (e.g. closing the sandbox pool)."""
        self._cleanups.append(cleanup)

    def close(self) -> None:
        """Stops watching (the run ended normally)."""
        with self._acting:
            self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.poll_s + 1)
            signal.set_wakeup_fd(self._previous_wakeup)

    # -- the main thread's side ----------------------------------------------------------
    def _on_sigterm(self, signum: int, frame: object) -> None:
        del signum, frame
        self._set_cause(self._own(SIGTERM_MESSAGE), EXIT_TERMINATED)
        raise Terminated(SIGTERM_MESSAGE)

    def _own(self, what: str) -> str:
        return f"process {self.group.index} {what}" if self.group.count > 1 else what

    def failed(self, exc: BaseException) -> tuple[str, int]:
        """The message and exit status for the exception that ended the main thread, told to the peers.

        An interruption the watchdog caused, or a collective that broke because a peer left, is
        reported as the peer's failure, not as this process's own."""
        self._main_ending = True  # the watchdog no longer interrupts it (only a stuck exit is forced)
        if self._cause is None:
            with contextlib.suppress(Exception):  # the coordination service may be gone with process 0
                self._peer_cause(self.group.peer_failures())
        if self._cause is None and self.group.count > 1 and _peer_gone(exc):
            with contextlib.suppress(Exception):  # waits up to the heartbeat timeout for the verdict
                self._peer_cause({p: LOST_MESSAGE for p in self.group.lost()})
        if self._cause is None and isinstance(exc, PeerFailed):  # the peer reported it already
            self._set_cause(str(exc), _code_of(exc.message), report=False)
        if self._cause is None:
            text = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
            message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
            if self.group.count > 1:
                message = f"process {self.group.index}: {message}"
                if _peer_gone(exc):
                    message += " (another process of the job ended: see its log)"
            self._set_cause(message, EXIT_FAILED)
        return self._cause

    def exit_now(self, code: int) -> None:
        """Ends a failed multi-process job's process without JAX's shutdown barrier (peers may never
        reach it); output is flushed first. A one-process job just returns."""
        if self.group.count > 1:
            self.close()
            sys.stdout.flush()
            sys.stderr.flush()
            self.group.leave(self.grace_s + 10)  # the main process, hosting the service, goes last
            logging.shutdown()
            os._exit(code)

    # -- the watchdog --------------------------------------------------------------------
    def _set_cause(self, message: str, code: int, *, report: bool = True) -> None:
        """The job's failure, told to the peers once (not when it is a peer's: they have it)."""
        if self._cause is None:
            self._cause = (message, code)
        if not self._reported:
            self._reported = True
            if report:
                self.group.report_failure(self._cause[0])

    def _watch(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._wakeup], [], [], self.poll_s)
            if ready and signal.SIGTERM in os.read(self._wakeup, 64):
                self._set_cause(self._own(SIGTERM_MESSAGE), EXIT_TERMINATED)
                self._begin_stop()
            try:
                failures = self.group.peer_failures()
                if not failures:
                    failures = {p: LOST_MESSAGE for p in self.group.lost()}
            except Exception as exc:  # noqa: BLE001 - the coordination service (in process 0) is gone
                failures = {0: f"the job's coordination service stopped answering ({type(exc).__name__})"}
            with self._acting:
                if self._stop.is_set():  # closed while this look was under way: the run ended normally
                    return
                if failures and self._deadline is None:
                    self._peer_cause(failures)
                    self._begin_stop()
            if self._deadline is not None and time.monotonic() > self._deadline:
                self._force_exit()

    def _peer_cause(self, failures: dict[int, str]) -> None:
        """The job's failure is the first reporting peer's."""
        if failures:
            first = min(failures)
            message = failures[first]
            prefix = "" if message.startswith(f"process {first}") else f"process {first}: "
            self._set_cause(f"the job stopped: {prefix}{message}", _code_of(message), report=False)

    def _begin_stop(self) -> None:
        if self._deadline is None:
            self._deadline = time.monotonic() + self.grace_s
            log.error("%s; stopping this process (%d)", self._cause[0], self.group.index)
            if not self._main_ending:
                _thread.interrupt_main()  # a KeyboardInterrupt once the main thread runs Python again

    def _force_exit(self) -> None:
        message, code = self._cause
        hint = f"; {RESUME_HINT}" if code == EXIT_TERMINATED else ""
        main = sys._current_frames().get(threading.main_thread().ident)
        if main is not None:  # where it was stuck: for whoever reads the log
            log.error("the main thread did not stop; it is at:\n%s", "".join(traceback.format_stack(main)))
        # A new line first: the progress bar may have the current one, and the error must start its own.
        print(f"\nerror: {message}{hint} (process {self.group.index} did not stop in {self.grace_s:.0f} s: "
              "forced exit)", file=sys.stderr, flush=True)  # fmt: skip
        for cleanup in self._cleanups:
            worker = threading.Thread(target=cleanup, daemon=True)
            worker.start()
            worker.join(timeout=15)
        sys.stdout.flush()
        self.group.leave(10)
        os._exit(code)


def _peer_gone(exc: BaseException) -> bool:
    """A collective that broke because the process at its other end went away."""
    text = str(exc)
    return "Gloo" in text or "Connection closed" in text or "Connection reset" in text


def _code_of(message: str) -> int:
    return EXIT_TERMINATED if SIGTERM_MESSAGE in message else EXIT_FAILED
