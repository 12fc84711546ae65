"""The wire between the repository under test and the judge that runs its hidden tests: plain data only.

Used on both sides of the split (``repo_server.py``, which runs the code under
test as the sandbox user, and ``repo_judge.py``, which runs the hidden tests as
the judge user), and by agentrl's host-side tests. Messages are JSON objects,
4-byte big-endian length first, at most ``MAX_MESSAGE`` bytes.

Values are *tagged JSON*. ``None``, ``bool``, ``int``, ``float``, ``str`` and
``list`` are JSON's own; ``tuple``, ``dict``, ``set``, ``frozenset``, ``bytes``,
``bytearray``, ``complex``, ``decimal.Decimal`` and ``fractions.Fraction`` are
``{"$": tag, "v": ...}``. Encoding dispatches on ``type(x) is``, never
``isinstance``, and calls no method a value could override (``__eq__``,
``__repr__``, ``__iter__`` of a subclass, ``__reduce__``): a subclass of a plain
type, or any other object, is not data and goes through the caller's ``ref``
hook instead (the server hands out a handle, ``{"$": "remote", ...}``; the
judge passes a callable of its own, ``{"$": "local", ...}``). Decoding builds
fresh values of exactly those types, so whatever the other side sent, ``==`` on
the result is Python's own. Depth and size are capped; violations are
:class:`WireError`. Standard library only; Python >= 3.8.
"""

import decimal
import fractions
import json
import struct

MAX_MESSAGE = 16 << 20
MAX_DEPTH = 64
MAX_NODES = 500_000
MAX_INT_BITS = 13_000  # ~3900 digits: under the int-parsing limit of json.loads

# Captured at import, before any code under test runs in this process.
_NONE, _BOOL, _INT, _FLOAT, _COMPLEX, _STR = type(None), bool, int, float, complex, str
_LIST, _TUPLE, _DICT, _SET, _FROZENSET, _BYTES, _BYTEARRAY = list, tuple, dict, set, frozenset, bytes, bytearray
_DECIMAL, _FRACTION = decimal.Decimal, fractions.Fraction
_TYPE = type
_DUMPS, _LOADS = json.dumps, json.loads
_PACK, _UNPACK = struct.pack, struct.unpack
MUTABLE = (_LIST, _DICT, _SET, _BYTEARRAY)


class WireError(Exception):
    """A message or value that is not what the protocol allows (too big, too deep, malformed, not data)."""


def encode(value, ref=None):
    """Tagged JSON of ``value``; non-plain objects go to ``ref(obj)`` (WireError if there is none)."""
    return _encode(value, ref, 0, [MAX_NODES])


def _encode(value, ref, depth, budget):
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise WireError("value too large or too deeply nested")
    t = _TYPE(value)
    if t is _NONE or t is _BOOL or t is _STR or t is _FLOAT:  # identity: a metaclass may define __eq__
        return value
    if t is _INT:
        if _INT.bit_length(value) > MAX_INT_BITS:
            raise WireError("int too large")
        return value
    if t is _LIST:
        return [_encode(x, ref, depth + 1, budget) for x in _LIST.__iter__(value)]
    if t is _TUPLE:
        return {"$": "tuple", "v": [_encode(x, ref, depth + 1, budget) for x in _TUPLE.__iter__(value)]}
    if t is _DICT:
        items = _DICT.items(value)
        pairs = [[_encode(k, ref, depth + 1, budget), _encode(v, ref, depth + 1, budget)] for k, v in items]
        return {"$": "dict", "v": pairs}
    if t is _SET or t is _FROZENSET:
        members = [_encode(x, ref, depth + 1, budget) for x in t.__iter__(value)]
        return {"$": "set" if t is _SET else "frozenset", "v": members}
    if t is _BYTES or t is _BYTEARRAY:
        return {"$": "bytes" if t is _BYTES else "bytearray", "v": t.hex(value)}
    if t is _COMPLEX:
        return {"$": "complex", "v": [_COMPLEX.real.__get__(value), _COMPLEX.imag.__get__(value)]}
    if t is _DECIMAL:
        return {"$": "decimal", "v": _DECIMAL.__str__(value)}
    if t is _FRACTION:
        parts = (_FRACTION.numerator.__get__(value), _FRACTION.denominator.__get__(value))
        return {"$": "fraction", "v": [_encode(p, ref, depth + 1, budget) for p in parts]}
    if ref is None:
        raise WireError("not plain data")
    return ref(value)


def decode(data, ref=None):
    """Fresh plain values from tagged JSON; ``{"$": "remote"|"local", ...}`` go to ``ref(tag, data)``."""
    return _decode(data, ref, 0)


def _decode(data, ref, depth):
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    t = _TYPE(data)
    if t is _NONE or t is _BOOL or t is _STR or t is _FLOAT or t is _INT:
        return data
    if t is _LIST:
        return [_decode(x, ref, depth + 1) for x in data]
    if t is not _DICT or _TYPE(data.get("$")) is not _STR:
        raise WireError("not a tagged value")
    tag, v = data["$"], data.get("v")
    try:
        if tag == "tuple":
            return _TUPLE(_decode(x, ref, depth + 1) for x in _items(v))
        if tag == "dict":
            return {_decode(k, ref, depth + 1): _decode(x, ref, depth + 1) for k, x in (_pair(p) for p in _items(v))}
        if tag in ("set", "frozenset"):
            items = [_decode(x, ref, depth + 1) for x in _items(v)]
            return _SET(items) if tag == "set" else _FROZENSET(items)
        if tag in ("bytes", "bytearray"):
            raw = _BYTES.fromhex(_string(v))
            return raw if tag == "bytes" else _BYTEARRAY(raw)
        if tag == "complex":
            re_, im = _pair(v)
            return _COMPLEX(_number(re_), _number(im))
        if tag == "decimal":
            return _DECIMAL(_string(v))
        if tag == "fraction":
            num, den = _pair(v)
            if _TYPE(num) is not _INT or _TYPE(den) is not _INT or den <= 0:
                raise WireError("a fraction needs an int numerator and a positive int denominator")
            return _FRACTION(num, den)
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise WireError(f"bad {tag} value: {exc}") from None
    if tag in ("remote", "local") and ref is not None:
        return ref(tag, data)
    raise WireError(f"unknown tag {tag!r}"[:100])


def _items(v):
    if _TYPE(v) is not _LIST:
        raise WireError("expected a list")
    return v


def _pair(v):
    if _TYPE(v) is not _LIST or len(v) != 2:
        raise WireError("expected a pair")
    return v


def _string(v):
    if _TYPE(v) is not _STR:
        raise WireError("expected a string")
    return v


def _number(v):
    if _TYPE(v) not in (_INT, _FLOAT):
        raise WireError("expected a number")
    return v


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
    try:
        message = _LOADS(_read(sock, size).decode("ascii"))
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
