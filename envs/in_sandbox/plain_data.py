"""Plain data across a trust boundary: tagged JSON of exact builtin values, agentrl's one codec for them.

Wherever a reward depends on a value computed by code it does not trust, the
value crosses to the judging side as *data*, never as an object: function tests
(the driver that runs a candidate reports its results; the recorder records
arguments and expected values; the host decodes and compares) and repository
repair (the server running the repository and the judge running the hidden
tests exchange values). The same source runs on the host (imported as
``envs.in_sandbox.plain_data``) and in sandboxes (shipped as ``plain_data``),
so both sides encode and decode with the very same code.

A value is a JSON list whose first item is its tag::

    ["none"]  ["bool", true]  ["int", "0x2a"]  ["float", "0x1.8p+0"]  ["complex", RE, IM]
    ["str", "text"]  ["bytes", "00ff"]  ["bytearray", "00ff"]  ["decimal", "1.010"]  ["fraction", NUM, DEN]
    ["list" | "tuple" | "set" | "frozenset", [ITEM, ...]]  ["dict", [[KEY, VALUE], ...]]

Floats travel as ``float.hex`` (exact, ``nan`` and ``inf`` included), ints as
hex (no 4300-digit limit, linear, at most :data:`MAX_INT_BITS` bits). Set
members are sorted by their encoding, so equal sets give equal bytes
(recordings reproduce byte for byte).

What makes it safe to decode what the other side sent, and to encode in a
process whose other code is hostile:

* encoding dispatches on ``type(x) is T``, against types captured when this
  module is imported (before any untrusted code runs in the process), never on
  ``isinstance`` or ``==`` (a metaclass may define ``__eq__``);
* it calls no method a value could override (``__eq__``, ``__iter__``,
  ``__repr__``, ``__reduce__``, ``items``): only the builtin types' own
  functions, on exact instances;
* a subclass of a plain type, or any other object, is not data: it raises
  :class:`EncodeError`, or goes to the caller's ``ref`` hook (a handle);
  ``stdlib_dicts=True`` lets ``Counter``, ``OrderedDict`` and ``defaultdict``
  travel as plain dicts (their stored pairs);
* decoding builds fresh values of exactly these types, so ``==`` on the result
  is Python's own; depth (:data:`MAX_DEPTH`), size (:data:`MAX_NODES`), int
  size (:data:`MAX_INT_BITS`) and a Decimal's magnitude
  (:data:`MAX_DECIMAL_EXPONENT`, so that ``int(x)`` of a decoded value cannot
  take the judge forever) are capped both ways.

Standard library only; Python >= 3.8.
"""

from __future__ import annotations

import collections
import decimal
import fractions
import json

MAX_DEPTH = 64
MAX_NODES = 500_000
MAX_INT_BITS = 1 << 16
MAX_INT_HEX = MAX_INT_BITS // 4 + 3  # "-0x" and the digits
# A Decimal's order of magnitude: int() of it (a check may take one) stays about as large as MAX_INT_BITS allows.
MAX_DECIMAL_EXPONENT = 20_000

# Captured at import, before any code under test runs in this process.
_NONE, _BOOL, _INT, _FLOAT, _COMPLEX, _STR = type(None), bool, int, float, complex, str
_LIST, _TUPLE, _DICT, _SET, _FROZENSET, _BYTES, _BYTEARRAY = list, tuple, dict, set, frozenset, bytes, bytearray
_DECIMAL, _FRACTION = decimal.Decimal, fractions.Fraction
_STDLIB_DICTS = (collections.Counter, collections.OrderedDict, collections.defaultdict)
_TYPE, _LEN, _HEX = type, len, hex
_DUMPS, _LOADS = json.dumps, json.loads
_SEQUENCES = ((_LIST, "list"), (_TUPLE, "tuple"), (_SET, "set"), (_FROZENSET, "frozenset"))
_BUILD = {"list": _LIST, "tuple": _TUPLE, "set": _SET, "frozenset": _FROZENSET}
TAGS = frozenset(
    ("none", "bool", "int", "float", "complex", "str", "bytes", "bytearray", "decimal", "fraction", "dict", *_BUILD)
)


class PlainDataError(ValueError):
    """Something that is not plain data, or is too large or too deep to send."""


class EncodeError(PlainDataError):
    """A value that is not plain builtin data (or is too large or deep to send)."""


class DecodeError(PlainDataError):
    """Tagged JSON that is malformed, of an unknown tag, or over the size, depth or int caps."""


def encode(value, ref=None, *, stdlib_dicts=False):
    """``value`` as tagged JSON-able lists.

    Anything that is not plain data goes to ``ref(obj)``, which returns the
    node to send in its place (a list tagged with a name outside :data:`TAGS`),
    or raises :class:`EncodeError` when there is no ``ref``.
    """
    return _encode(value, ref, stdlib_dicts, MAX_DEPTH, [MAX_NODES])


def _encode(value, ref, stdlib_dicts, depth, budget):
    budget[0] -= 1
    if budget[0] < 0:
        raise EncodeError(f"more than {MAX_NODES} values")
    t = _TYPE(value)
    if t is _NONE:
        return ["none"]
    if t is _BOOL:
        return ["bool", value]
    if t is _INT:
        return ["int", _int_hex(value)]
    if t is _FLOAT:
        return ["float", _FLOAT.hex(value)]
    if t is _COMPLEX:
        return ["complex", _FLOAT.hex(_COMPLEX.real.__get__(value)), _FLOAT.hex(_COMPLEX.imag.__get__(value))]
    if t is _STR:
        return ["str", value]
    if t is _BYTES or t is _BYTEARRAY:
        return ["bytes" if t is _BYTES else "bytearray", t.hex(value)]
    if t is _DECIMAL:
        return ["decimal", _DECIMAL.__str__(_decimal(value, EncodeError))]
    if t is _FRACTION:
        num, den = _FRACTION.numerator.__get__(value), _FRACTION.denominator.__get__(value)
        return ["fraction", _int_hex(num), _int_hex(den)]
    tag = next((name for kind, name in _SEQUENCES if t is kind), None)
    if tag is None and (t is _DICT or (stdlib_dicts and any(t is kind for kind in _STDLIB_DICTS))):
        tag = "dict"
    if tag is None:
        if ref is None:
            raise EncodeError(f"a {_type_name(t)!r} object is not plain data: its type is not exactly a builtin type")
        return ref(value)
    if depth <= 0:
        raise EncodeError(f"nested deeper than {MAX_DEPTH}")
    if tag == "dict":  # dict.items: the stored pairs, whatever a Counter or OrderedDict overrides
        pairs = _DICT.items(value)
        args = (ref, stdlib_dicts, depth - 1, budget)
        return ["dict", [[_encode(k, *args), _encode(v, *args)] for k, v in pairs]]
    items = [_encode(v, ref, stdlib_dicts, depth - 1, budget) for v in t.__iter__(value)]
    if tag in ("set", "frozenset"):  # a canonical order, so recordings are byte-for-byte reproducible
        items.sort(key=_canonical)
    return [tag, items]


def _decimal(value, error):
    if abs(_DECIMAL.adjusted(value)) > MAX_DECIMAL_EXPONENT:
        raise error(f"a Decimal of magnitude beyond 10**{MAX_DECIMAL_EXPONENT}")
    return value


def _int_hex(value):
    if _INT.bit_length(value) > MAX_INT_BITS:
        raise EncodeError(f"an int of more than {MAX_INT_BITS} bits")
    return _HEX(value)


def _canonical(node):
    return _DUMPS(node, sort_keys=True)


def _type_name(kind):
    try:
        return f"{_TYPE.__getattribute__(kind, '__module__')}.{_TYPE.__getattribute__(kind, '__qualname__')}"
    except Exception:  # noqa: BLE001 - a hostile metaclass: the name is only for the message
        return "non-builtin type"


def decode(tree, ref=None):
    """Fresh plain values from tagged JSON (as :func:`json.loads` returns it).

    A node whose tag is not in :data:`TAGS` goes to ``ref(node)`` (a handle the
    caller resolves), or is a :class:`DecodeError` when there is no ``ref``.
    """
    try:
        return _decode(tree, ref, MAX_DEPTH, [MAX_NODES])
    except PlainDataError:
        raise
    except (TypeError, ValueError, ArithmeticError, RecursionError) as exc:  # unhashable keys, bad hex, ...
        raise DecodeError(f"malformed value: {_TYPE(exc).__name__}: {str(exc)[:200]}") from None


def _decode(tree, ref, depth, budget):
    budget[0] -= 1
    if budget[0] < 0:
        raise DecodeError(f"more than {MAX_NODES} values")
    if _TYPE(tree) is not _LIST or not tree or _TYPE(tree[0]) is not _STR:
        raise DecodeError(f"expected a tagged list, got {_TYPE(tree).__name__}")
    tag, payload = tree[0], tree[1:]
    if tag not in TAGS:
        if ref is None:
            raise DecodeError(f"unknown tag {tag[:20]!r}")
        return ref(tree)
    if tag in _BUILD or tag == "dict":
        if _LEN(payload) != 1 or _TYPE(payload[0]) is not _LIST:
            raise DecodeError(f"{tag}: expected one list of items")
        if depth <= 0:
            raise DecodeError(f"nested deeper than {MAX_DEPTH}")
        if tag == "dict":
            pairs = payload[0]
            if any(_TYPE(p) is not _LIST or _LEN(p) != 2 for p in pairs):
                raise DecodeError("dict: expected [key, value] pairs")
            return {_decode(k, ref, depth - 1, budget): _decode(v, ref, depth - 1, budget) for k, v in pairs}
        return _BUILD[tag]([_decode(v, ref, depth - 1, budget) for v in payload[0]])
    if tag == "none" and not payload:
        return None
    if tag == "bool" and _LEN(payload) == 1 and _TYPE(payload[0]) is _BOOL:
        return payload[0]
    strings = [p for p in payload if _TYPE(p) is _STR]
    if tag in _SCALARS and _LEN(payload) == 1 and strings:
        return _SCALARS[tag](strings[0])
    if tag in ("complex", "fraction") and _LEN(payload) == 2 and _LEN(strings) == 2:
        if tag == "complex":
            return _COMPLEX(_FLOAT.fromhex(strings[0]), _FLOAT.fromhex(strings[1]))
        num, den = _int(strings[0]), _int(strings[1])
        if den <= 0:
            raise DecodeError("fraction: the denominator must be positive")
        return _FRACTION(num, den)
    raise DecodeError(f"{tag}: malformed payload")


def _int(text):
    if _LEN(text) > MAX_INT_HEX:
        raise DecodeError(f"an int of more than {MAX_INT_BITS} bits")
    return _INT(text, 16)


_SCALARS = {  # tags whose payload is one string
    "int": _int,
    "float": _FLOAT.fromhex,
    "str": lambda text: text,
    "decimal": lambda text: _decimal(_DECIMAL(text), DecodeError),
    "bytes": _BYTES.fromhex,
    "bytearray": lambda text: _BYTEARRAY(_BYTES.fromhex(text)),
}


def loads(text, max_bytes=1 << 20):
    """Decodes one JSON document of tagged data, refusing more than ``max_bytes``."""
    if _LEN(text) > max_bytes:
        raise DecodeError(f"more than {max_bytes} bytes")
    try:
        tree = _LOADS(text)
    except (ValueError, RecursionError) as exc:
        raise DecodeError(f"not JSON: {str(exc)[:200]}") from None
    return decode(tree)
