"""Reads a sandbox's diagnostic stream for as long as it runs, keeping only its tail.

A pipe nobody reads is a lever for whoever writes into it: once its 64 KiB are
full, the writer blocks. The sandbox's stderr carries bwrap's errors and the
agent's own diagnostics, and the agent is PID 1, so a stderr the host never
read let a model wedge the agent by making it print (issue 23, class 3). A
daemon thread per sandbox reads it as it comes, keeps the last
:data:`TAIL_BYTES` for error messages and drops the rest, so the host's memory
is bounded whatever the sandbox writes.
"""

from __future__ import annotations

import threading
from typing import BinaryIO

TAIL_BYTES = 8192


class StderrDrain:
    """Drains ``stream`` on a daemon thread until EOF, then closes it; :meth:`tail` is what it said last."""

    def __init__(self, stream: BinaryIO, *, name: str, cap: int = TAIL_BYTES):
        self._stream = stream
        self._cap = cap
        self._tail = bytearray()
        self._total = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"stderr-drain-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._pump()
        finally:
            try:
                self._stream.close()  # the drain owns the stream: closing it from another thread could block
            except OSError:
                pass

    def _pump(self) -> None:
        read = getattr(self._stream, "read1", self._stream.read)
        while True:
            try:
                chunk = read(65536)
            except (OSError, ValueError):
                return
            if not chunk:
                return
            with self._lock:
                self._total += len(chunk)
                self._tail += chunk
                if len(self._tail) > self._cap:
                    del self._tail[: len(self._tail) - self._cap]

    @property
    def total_bytes(self) -> int:
        """How many bytes the stream carried in all (the tail keeps at most ``cap`` of them)."""
        with self._lock:
            return self._total

    def tail(self, wait_s: float = 0.0) -> str:
        """The last bytes read, decoded; waits up to ``wait_s`` for EOF first (a process that just exited)."""
        if wait_s > 0:
            self._thread.join(wait_s)
        with self._lock:
            return self._tail.decode("utf-8", "replace").strip()
