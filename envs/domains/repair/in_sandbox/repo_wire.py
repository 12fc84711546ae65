"""The wire between the repository under test and the judge that runs its hidden tests: plain data only.

Used on both sides of the split (``repo_server.py``, which runs the code under
test as the sandbox user, and ``repo_proxy.py`` in ``repo_judge.py``, which runs
the hidden tests as the judge user). Messages are JSON objects, 4-byte
big-endian length first, at most :data:`MAX_MESSAGE` bytes. The values inside
them are ``plain_data``'s tagged JSON: exact builtin types only, rebuilt fresh
on the receiving side. What is not plain data travels as a handle, a node the
sending side makes with its ``ref`` hook: ``["remote", id, info]`` for an
object of the repository, ``["local", id]`` for a callable of the judge's.
Standard library only; Python >= 3.8.
"""

import json
import struct

if __package__:  # imported on the host, as part of envs
    from envs.in_sandbox.plain_data import PlainDataError
else:  # shipped: plain_data.py sits beside this file
    from plain_data import PlainDataError

MAX_MESSAGE = 16 << 20

# Captured at import, before any code under test runs in this process.
_DUMPS, _LOADS, _TYPE, _DICT = json.dumps, json.loads, type, dict
_PACK, _UNPACK = struct.pack, struct.unpack
MUTABLE = (list, dict, set, bytearray)


class WireError(PlainDataError):
    """A message that is not what the protocol allows (too big, torn, not a JSON object)."""


def send(sock, message):
    """Writes one message (a JSON-able dict of already-encoded values)."""
    data = _DUMPS(message, ensure_ascii=True).encode("ascii")
    if len(data) > MAX_MESSAGE:
        raise WireError(f"message of {len(data)} bytes is over the {MAX_MESSAGE} byte limit")
    sock.sendall(_PACK(">I", len(data)) + data)


def recv(sock):
    """Reads one message; None when the other side closed the connection cleanly between messages."""
    head = _read(sock, 4, allow_eof=True)
    if head is None:
        return None
    (size,) = _UNPACK(">I", head)
    if size > MAX_MESSAGE:
        raise WireError(f"message of {size} bytes is over the {MAX_MESSAGE} byte limit")
    data = _read(sock, size)
    try:
        message = _LOADS(data.decode("ascii"))
    except (ValueError, RecursionError):
        raise WireError("message is not JSON") from None
    if _TYPE(message) is not _DICT:
        raise WireError("message is not a JSON object")
    return message


def _read(sock, size, allow_eof=False):
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(min(size - got, 1 << 20))
        if not chunk:
            if allow_eof and got == 0:
                return None
            raise WireError("connection closed in the middle of a message")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
