"""Shutting pools and schedulers down when the host process exits or is interrupted.

Sandboxes already die with their owner (bwrap's ``--die-with-parent``, Docker's
``stdin_once`` + ``auto_remove``), so a SIGKILLed trainer leaks nothing for
long. This module makes the *orderly* paths clean too: at interpreter exit and
on SIGINT / SIGTERM, every registered scheduler cancels its jobs (so each gets
exactly one final result) and every pool destroys its sandboxes and sweeps its
hosts, before the previous handler runs.

Signal handlers are process-global, so they are installed carefully: only from
the main thread (Python refuses elsewhere), once, and chained — the handler
that was there before (``KeyboardInterrupt`` for SIGINT, a framework's own,
or the default action) still runs afterwards. If someone installs another
handler after ours, we leave it alone.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
SHUTDOWN_TIMEOUT_S = 20.0

_lock = threading.Lock()
# Objects with a ``shutdown(reason: str)`` method, most recently registered last; schedulers are
# registered after the pools they use, so shutting down in reverse order cancels jobs first.
_registry: list[weakref.ref] = []
_previous: dict[int, Any] = {}
_installed: dict[int, Callable] = {}


def register(obj: Any) -> None:
    """Shuts ``obj`` down (``obj.shutdown(reason)``) at exit and on SIGINT/SIGTERM; held weakly."""
    with _lock:
        _registry.append(weakref.ref(obj))


def unregister(obj: Any) -> None:
    with _lock:
        _registry[:] = [r for r in _registry if r() is not None and r() is not obj]


def shutdown_all(reason: str) -> None:
    """Shuts every registered object down, newest first; errors are logged, never raised."""
    with _lock:
        objs = [o for o in (r() for r in reversed(_registry)) if o is not None]
    for obj in objs:
        try:
            obj.shutdown(reason)
        except Exception:  # noqa: BLE001 - one failure must not stop the others' cleanup
            log.exception("cleanup: shutdown of %r failed", obj)


def _shutdown_in_thread(reason: str) -> None:
    # The handler runs in the main thread, which may hold a lock that shutdown needs (it was
    # interrupted mid-call). A helper thread with a bounded join cannot deadlock the process.
    worker = threading.Thread(target=shutdown_all, args=(reason,), name="agentrl-cleanup", daemon=True)
    worker.start()
    worker.join(SHUTDOWN_TIMEOUT_S)
    if worker.is_alive():
        log.warning("cleanup: shutdown still running after %.0fs; continuing with the signal", SHUTDOWN_TIMEOUT_S)


def _handler(signum: int, frame: Any) -> None:
    name = signal.Signals(signum).name
    log.warning("received %s: shutting sandbox schedulers and pools down", name)
    _shutdown_in_thread(f"signal {name}")
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)  # e.g. default_int_handler -> KeyboardInterrupt in the main thread
    elif previous == signal.SIG_DFL:
        # Let the default action happen (terminate), now that our sandboxes are gone.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    # SIG_IGN: the process chose to ignore it; so do we, after cleaning up.


def install_signal_handlers() -> bool:
    """Installs the chaining SIGINT/SIGTERM handlers once; False (and nothing done) off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        log.debug("not in the main thread: SIGINT/SIGTERM cleanup handlers not installed")
        return False
    with _lock:
        for sig in SIGNALS:
            current = signal.getsignal(sig)
            if current is _handler:
                continue
            if current is None:  # installed from C: we cannot chain to it, so leave it alone
                continue
            _previous[sig] = current
            signal.signal(sig, _handler)
            _installed[sig] = _handler
    return True


def uninstall_signal_handlers() -> None:
    """Restores the previous handlers where ours is still the one installed (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        for sig in list(_installed):
            if signal.getsignal(sig) is _handler:
                signal.signal(sig, _previous.get(sig, signal.SIG_DFL))
            _installed.pop(sig, None)
            _previous.pop(sig, None)


def live_count() -> int:
    with _lock:
        return sum(r() is not None for r in _registry)


atexit.register(shutdown_all, "interpreter exit")
