"""The agent's wire format: ``u32 header length | JSON header | binary blobs``.

Runs on both sides of the channel (the host and the in-sandbox agent), so it is
standard library only and Python >= 3.8.
"""

import json
import struct

HEADER = struct.Struct(">I")
MAX_HEADER = 64 << 20
# A snapshot leaves the agent as messages ``{"id": <request>, "chunk": true}`` of at most this many
# bytes each, then one final reply: the agent never holds more than one chunk of the tar.
STREAM_CHUNK_BYTES = 1 << 20


def read_exact(stream, n):
    data = stream.read(n)
    if data is None or len(data) != n:
        raise EOFError("stream closed after %d of %d bytes" % (0 if data is None else len(data), n))
    return data


def read_message(stream):
    """Reads one framed message: returns (header dict, list of blobs)."""
    (size,) = HEADER.unpack(read_exact(stream, 4))
    if size > MAX_HEADER:
        raise ValueError("message header of %d bytes is too large" % size)
    header = json.loads(read_exact(stream, size).decode("utf-8"))
    blobs = [read_exact(stream, int(n)) for n in header.get("blobs", ())]
    return header, blobs


def encode_message(header, blobs=()):
    """Frames a message; the inverse of :func:`read_message`."""
    header = dict(header, blobs=[len(b) for b in blobs])
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return b"".join([HEADER.pack(len(raw)), raw, *blobs])
