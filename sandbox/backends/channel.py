"""Host side of the agent protocol: transports and a request/response channel.

A backend's only job is to start ``python3 -c BOOTSTRAP`` as PID 1 of an
isolated namespace and hand over a :class:`Transport` to its stdin/stdout:
pipes for bwrap, the Engine API's attach socket for Docker. Everything else —
exec, files, snapshots — is this one channel, so both backends behave the same.
"""

from __future__ import annotations

import collections
import json
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO, Protocol

from sandbox import agent
from sandbox.agent.protocol import STREAM_CHUNK_BYTES
from sandbox.errors import (
    AgentUnresponsive,
    SandboxClosed,
    SandboxFileError,
    SandboxInfraError,
    SandboxStartError,
    SandboxUsageError,
)


class Transport(Protocol):
    """A byte pipe to the agent's stdin and from its stdout."""

    def send(self, data: bytes) -> None: ...

    def recv_exact(self, n: int, deadline: float) -> bytes:
        """Exactly ``n`` bytes; ``TimeoutError`` past ``deadline``, ``EOFError`` if closed."""
        ...

    def close(self) -> None: ...


class _Buffered:
    """Shared buffering for transports that read chunks of unknown size."""

    def __init__(self):
        self._buf = bytearray()

    def _read_chunk(self, timeout: float) -> bytes | None:
        raise NotImplementedError

    def recv_exact(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"agent did not answer in time ({len(self._buf)}/{n} bytes)")
            chunk = self._read_chunk(remaining)
            if chunk is None:
                continue
            if not chunk:
                raise EOFError("agent stream closed")
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out


class PipeTransport(_Buffered):
    """The stdin/stdout pipes of a local child process (the bwrap backend).

    Holds the pipes' file objects rather than bare descriptor numbers: closing a file object twice is
    a no-op, whereas ``os.close(n)`` twice can close a descriptor another thread has just been given
    the same number for (sandboxes are created and closed concurrently under the warm pool).
    """

    def __init__(self, stdin: BinaryIO, stdout: BinaryIO):
        super().__init__()
        self._in_file = stdin
        self._out_file = stdout
        self._in = stdin.fileno()
        self._out = stdout.fileno()

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                if self._in_file.closed:
                    raise EOFError("agent stdin closed")
                view = view[os.write(self._in, view) :]
        except (BrokenPipeError, OSError) as exc:
            raise EOFError(f"agent stdin closed: {exc}") from exc

    def _read_chunk(self, timeout: float) -> bytes | None:
        if self._out_file.closed:
            raise EOFError("agent stdout closed")
        poller = select.poll()  # not select(): descriptors pass 1024 with hundreds of sandboxes
        poller.register(self._out, select.POLLIN)
        if not poller.poll(max(0, int(timeout * 1000))):
            return None
        return os.read(self._out, 1 << 20)

    def close(self) -> None:
        for stream in (self._in_file, self._out_file):
            try:
                stream.close()
            except OSError:
                pass


class MultiplexedSocketTransport(_Buffered):
    """Docker's attach socket: stdout/stderr arrive in 8-byte-header frames.

    The agent's stdout is the protocol; its stderr (tracebacks, if ever) is kept
    in a short ring buffer for error messages.
    """

    def __init__(self, sock: socket.socket):
        super().__init__()
        self._sock = sock
        self._raw = bytearray()
        self.stderr_tail: collections.deque[bytes] = collections.deque(maxlen=32)

    def send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise EOFError(f"attach socket closed: {exc}") from exc

    def _read_chunk(self, timeout: float) -> bytes | None:
        while True:
            if len(self._raw) >= 8:
                kind, size = self._raw[0], struct.unpack(">I", self._raw[4:8])[0]
                if len(self._raw) >= 8 + size:
                    payload = bytes(self._raw[8 : 8 + size])
                    del self._raw[: 8 + size]
                    if kind == 2:
                        self.stderr_tail.append(payload)
                        continue
                    return payload if payload else None
            self._sock.settimeout(max(timeout, 1e-3))
            try:
                data = self._sock.recv(1 << 20)
            except TimeoutError:
                return None
            except OSError as exc:
                raise EOFError(f"attach socket error: {exc}") from exc
            if not data:
                return b""
            self._raw += data

    def interrupt(self) -> None:
        """Wakes a reader blocked on the socket (it sees EOF) without freeing the descriptor; any thread."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.interrupt()
        self._sock.close()


class AgentChannel:
    """One request at a time to the in-sandbox agent, with a host-side deadline.

    Args:
      transport: the byte pipe.
      backend: backend name, for error messages.
      diagnose: called when the pipe breaks or the agent stops answering; returns
        the infrastructure error that explains it (e.g. "container was killed").
    """

    def __init__(self, transport: Transport, backend: str, diagnose: Callable[[str], SandboxInfraError]):
        self._transport = transport
        self._backend = backend
        self._diagnose = diagnose
        self._lock = threading.Lock()
        self._broken: SandboxInfraError | None = None
        self._next_id = 0

    def boot(self, config: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Sends the agent's source and config; returns its hello."""
        deadline = time.monotonic() + timeout
        with self._lock:
            try:
                self._transport.send(agent.bundle())
                self._transport.send(agent.encode_message(config))
                header, _ = self._read(deadline)
            except (EOFError, TimeoutError, OSError) as exc:
                raise self._break(f"agent did not start: {exc}") from exc
            if header.get("error"):  # it booted but refused to serve: it could not be confined as asked
                self._broken = SandboxStartError(
                    f"sandbox refused to start: {header.get('message')}", backend=self._backend
                )
                raise self._broken
        return header

    def call(
        self, op: str, header: dict[str, Any], blobs: Sequence[bytes] = (), *, timeout: float
    ) -> tuple[dict[str, Any], list[bytes]]:
        """Sends one request and waits for its response (``timeout`` is the host's limit)."""
        with self._lock:
            if self._broken is not None:
                raise self._broken
            self._next_id += 1
            request_id = self._next_id
            deadline = time.monotonic() + timeout
            try:
                self._transport.send(agent.encode_message(dict(header, op=op, id=request_id), blobs))
                response, rblobs = self._read_streamed(request_id, header.get("max_bytes"), deadline)
            except TimeoutError as exc:
                raise self._break(f"agent gave no answer to {op!r} within {timeout:.1f}s", AgentUnresponsive) from exc
            except (EOFError, OSError) as exc:
                raise self._break(f"lost the agent during {op!r}: {exc}") from exc
        if response.get("id") != request_id:
            raise self._break(f"agent answered request {response.get('id')} to request {request_id}")
        error = response.get("error")
        if error == "usage":
            raise SandboxUsageError(f"{op}: {response.get('message')}")
        if error == "file":
            raise SandboxFileError(response.get("message"))
        if error:
            raise SandboxInfraError(
                f"agent failed on {op!r}: {response.get('message')}", backend=self._backend, cause="agent_error"
            )
        return response, rblobs

    def _read_streamed(
        self, request_id: int, max_bytes: int | None, deadline: float
    ) -> tuple[dict[str, Any], list[bytes]]:
        """The final reply, its blobs preceded by those of any chunk messages the agent streamed first.

        Chunks past the request's ``max_bytes`` (the agent's own cap, plus one chunk) mean an agent that
        does not keep the protocol: the channel breaks rather than buffer without bound.
        """
        chunks: list[bytes] = []
        received = 0
        while True:
            response, rblobs = self._read(deadline)
            if not response.get("chunk") or response.get("id") != request_id:
                return response, chunks + rblobs
            received += sum(len(b) for b in rblobs)
            if max_bytes is None or received > max_bytes + STREAM_CHUNK_BYTES:
                raise EOFError(f"agent streamed {received} bytes, past max_bytes={max_bytes}")
            chunks.extend(rblobs)

    def _read(self, deadline: float) -> tuple[dict[str, Any], list[bytes]]:
        t = self._transport
        (size,) = struct.unpack(">I", t.recv_exact(4, deadline))
        header = json.loads(t.recv_exact(size, deadline))
        blobs = [t.recv_exact(int(n), deadline) for n in header.get("blobs", ())]
        return header, blobs

    def _break(self, reason: str, kind: type[SandboxInfraError] | None = None) -> SandboxInfraError:
        err = self._diagnose(reason)
        if kind is not None and type(err) is SandboxInfraError:
            err = kind(str(err), backend=self._backend)
        self._broken = err
        return err

    def close(self) -> None:
        self._broken = self._broken or SandboxInfraError("channel closed", backend=self._backend)
        self._transport.close()

    @property
    def broken(self) -> bool:
        return self._broken is not None


def closed_error(backend: str) -> SandboxClosed:
    return SandboxClosed(f"[{backend}] sandbox is closed")
