"""Plain data across the trust boundary: tagged JSON of exact builtin values, and checks evaluated on them.

Function tests compare what a candidate returned with what the reference
returned. The candidate runs in a process the judge does not trust, so its
results cross to the judge as *data*, never as objects: every value is encoded
as tagged JSON (``["int", "0x2a"]``, ``["tuple", [...]]``, ...) built with
``type(x) is`` checks only, so a ``float`` subclass with an ``__eq__`` that
always says yes, or a class that claims ``__module__ = "fractions"``, is
simply not encodable. The judge decodes the JSON (size- and depth-capped)
into fresh builtin values and evaluates the recorded check on them with
builtin operators: no code the candidate wrote runs on the judge's side.

A *check* is the recorded form of one ``assert`` of a task's tests, as a small
expression tree over the candidate's result ``["R"]`` and recorded constants
``["v", ENCODED]`` (see :data:`CALLS`). Floats travel as ``float.hex`` (exact,
and ``nan``/``inf`` included) and ints as hex (no 4300-digit limit, linear).

This module is the standard library only: the recorder ships it into the
sandbox that records a task's checks, so both sides evaluate a check with the
very same code.
"""

import json
import math
import sys
from typing import Any

MAX_DEPTH = 64
MAX_NODES = 200_000
SCALARS = ("none", "bool", "int", "float", "complex", "str", "bytes")
CONTAINERS = ("list", "tuple", "set", "frozenset", "dict")
# Functions a check may apply to the candidate's result: builtin, cheap on capped data, no callbacks.
CALLS = {
    "abs": abs,
    "bool": bool,
    "float": float,
    "frozenset": frozenset,
    "int": int,
    "len": len,
    "list": list,
    "max": max,
    "min": min,
    "round": round,
    "set": set,
    "sorted": sorted,
    "str": str,
    "tuple": tuple,
    "math.ceil": math.ceil,
    "math.fabs": math.fabs,
    "math.floor": math.floor,
    "math.isclose": math.isclose,
}
COMPARE = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b,
    "is": lambda a, b: _identity(a, b),
    "is not": lambda a, b: not _identity(a, b),
}
BINARY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}


class EncodeError(ValueError):
    """A value that is not plain builtin data (or is too large or deep to send)."""


class DecodeError(ValueError):
    """Tagged JSON that is malformed, of an unknown tag, or over the size/depth caps."""


class CheckError(ValueError):
    """A check tree that is malformed (a recorder bug or a corrupted record, never the candidate's doing)."""


def encode(value: Any, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> list:
    """``value`` as tagged JSON-able lists; :class:`EncodeError` for anything but exact builtin types."""
    budget = [max_nodes]
    return _encode(value, max_depth, budget)


def _encode(value, depth, budget):
    budget[0] -= 1
    if budget[0] < 0:
        raise EncodeError(f"more than {MAX_NODES} values")
    kind = type(value)
    if value is None:
        return ["none"]
    if kind is bool:
        return ["bool", value]
    if kind is int:
        return ["int", hex(value)]
    if kind is float:
        return ["float", value.hex()]
    if kind is complex:
        return ["complex", value.real.hex(), value.imag.hex()]
    if kind is str:
        return ["str", value]
    if kind is bytes:
        return ["bytes", value.hex()]
    tag = container_tag(kind)
    if tag is None:
        raise EncodeError(f"a {_type_name(kind)!r} object, whose type is not exactly a builtin type")
    if depth <= 0:
        raise EncodeError(f"nested deeper than {MAX_DEPTH}")
    if tag == "dict":  # dict.items: the stored pairs, whatever a Counter or OrderedDict overrides
        pairs = dict.items(value)
        return ["dict", [[_encode(k, depth - 1, budget), _encode(v, depth - 1, budget)] for k, v in pairs]]
    items = [_encode(v, depth - 1, budget) for v in value]
    if tag in ("set", "frozenset"):  # a canonical order, so recordings are byte-for-byte reproducible
        items.sort(key=lambda item: json.dumps(item, sort_keys=True))
    return [tag, items]


def container_tag(kind: type) -> str | None:
    """The tag of an exact builtin container type (by identity: a metaclass ``__eq__`` proves nothing), else None.

    The standard library's dicts (``Counter``, ``OrderedDict``, ``defaultdict``)
    travel as plain dicts: their stored pairs are data, and a correct solution
    may well return a ``Counter``. Anything else, subclasses included, is not data.
    """
    for builtin, tag in ((list, "list"), (tuple, "tuple"), (set, "set"), (frozenset, "frozenset"), (dict, "dict")):
        if kind is builtin:
            return tag
    collections = sys.modules.get("collections")
    stdlib_dicts = (collections.Counter, collections.OrderedDict, collections.defaultdict) if collections else ()
    return "dict" if any(kind is t for t in stdlib_dicts) else None


def _type_name(kind):
    try:
        return f"{type.__getattribute__(kind, '__module__')}.{type.__getattribute__(kind, '__qualname__')}"
    except Exception:  # noqa: BLE001 - a hostile metaclass: the name is only for the message
        return "non-builtin type"


def decode(tree: Any, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> Any:
    """Fresh builtin values from tagged JSON (as :func:`json.loads` returns it); :class:`DecodeError` if malformed."""
    budget = [max_nodes]
    try:
        return _decode(tree, max_depth, budget)
    except DecodeError:
        raise
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:  # unhashable set items, bad hex, ...
        raise DecodeError(f"malformed value: {type(exc).__name__}: {str(exc)[:200]}") from None


def _decode(tree, depth, budget):
    budget[0] -= 1
    if budget[0] < 0:
        raise DecodeError(f"more than {MAX_NODES} values")
    if type(tree) is not list or not tree or type(tree[0]) is not str:
        raise DecodeError(f"expected a tagged list, got {type(tree).__name__}")
    tag, payload = tree[0], tree[1:]
    if tag == "none" and not payload:
        return None
    if tag in CONTAINERS:
        if len(payload) != 1 or type(payload[0]) is not list:
            raise DecodeError(f"{tag}: expected one list of items")
        if depth <= 0:
            raise DecodeError(f"nested deeper than {MAX_DEPTH}")
        if tag == "dict":
            pairs = payload[0]
            if any(type(p) is not list or len(p) != 2 for p in pairs):
                raise DecodeError("dict: expected [key, value] pairs")
            return {_decode(k, depth - 1, budget): _decode(v, depth - 1, budget) for k, v in pairs}
        items = [_decode(v, depth - 1, budget) for v in payload[0]]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "bool" and len(payload) == 1 and type(payload[0]) is bool:
        return payload[0]
    if tag == "complex" and len(payload) == 2 and all(type(p) is str for p in payload):
        return complex(float.fromhex(payload[0]), float.fromhex(payload[1]))
    if len(payload) != 1 or type(payload[0]) is not str:
        raise DecodeError(f"{tag[:20]!r}: malformed payload")
    text = payload[0]
    if tag == "int":
        return int(text, 16)
    if tag == "float":
        return float.fromhex(text)
    if tag == "str":
        return text
    if tag == "bytes":
        return bytes.fromhex(text)
    raise DecodeError(f"unknown tag {tag[:20]!r}")


def loads(text: str | bytes, max_bytes: int = 1 << 20) -> Any:
    """Decodes one JSON document of tagged data, refusing more than ``max_bytes``."""
    if len(text) > max_bytes:
        raise DecodeError(f"more than {max_bytes} bytes")
    try:
        tree = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise DecodeError(f"not JSON: {str(exc)[:200]}") from None
    return decode(tree)


def _identity(a, b):
    # `is` means something only for the singletons; decoded True/False/None are the singletons.
    if not (type(a) in (bool, type(None)) or type(b) in (bool, type(None))):
        raise CheckError("`is` compares with True, False or None only")
    return a is b


def evaluate(check: list, result: Any) -> bool:
    """Whether ``check`` holds for the (decoded, plain) ``result``: ``bool`` of the recorded expression.

    An operation that fails on the result (``sorted`` of mixed types, ``<``
    between a str and an int, ...) means the check does not hold, exactly as
    the original ``assert`` would have failed.
    """
    try:
        return bool(_term(check, result, 0))
    except CheckError:
        raise
    except Exception:  # noqa: BLE001 - any error evaluating on the candidate's value is a failed check
        return False


def _term(node, result, depth):
    if type(node) is not list or not node or depth > 32:
        raise CheckError(f"malformed check node {node!r:.200}")
    op = node[0]
    if op == "R":
        return result
    if op == "v":
        try:
            return decode(node[1])
        except DecodeError as exc:
            raise CheckError(f"a recorded constant is malformed: {exc}") from None
    if op == "cmp":
        terms, ops = node[1], node[2]
        if len(terms) != len(ops) + 1 or not ops or any(o not in COMPARE for o in ops):
            raise CheckError(f"malformed comparison {node!r:.200}")
        left = _term(terms[0], result, depth + 1)
        for o, t in zip(ops, terms[1:], strict=True):
            right = _term(t, result, depth + 1)
            if not COMPARE[o](left, right):
                return False
            left = right
        return True
    if op == "not":
        return not _term(node[1], result, depth + 1)
    if op == "neg":
        return -_term(node[1], result, depth + 1)
    if op == "bin" and node[1] in BINARY:
        return BINARY[node[1]](_term(node[2], result, depth + 1), _term(node[3], result, depth + 1))
    if op == "item":
        return _term(node[1], result, depth + 1)[_term(node[2], result, depth + 1)]
    if op == "call" and node[1] in CALLS:
        args = [_term(a, result, depth + 1) for a in node[2]]
        kwargs = {k: _term(v, result, depth + 1) for k, v in node[3].items()}
        return CALLS[node[1]](*args, **kwargs)
    raise CheckError(f"unknown check node {op!r:.50}")


def fill(template: Any, constants: list) -> Any:
    """A check from a recorder template: each hole ``["h", i]`` replaced by ``["v", constants[i]]``."""
    if type(template) is list and template and template[0] == "h":
        return ["v", constants[template[1]]]
    if type(template) is list:
        return [fill(t, constants) for t in template]
    if type(template) is dict:
        return {k: fill(v, constants) for k, v in template.items()}
    return template


def describe(check: list) -> str:
    """A short human-readable form of a check, for verdict details (``R == [1, 2]``)."""
    try:
        return _show(check)[:300]
    except Exception:  # noqa: BLE001 - details only
        return "<check>"


def _show(node):
    op = node[0]
    if op == "R":
        return "R"
    if op == "v":
        return repr(decode(node[1]))[:120]
    if op == "cmp":
        parts = [_show(node[1][0])]
        for o, t in zip(node[2], node[1][1:], strict=True):
            parts += [o, _show(t)]
        return " ".join(parts)
    if op == "not":
        return "not " + _show(node[1])
    if op == "neg":
        return "-" + _show(node[1])
    if op == "bin":
        return f"({_show(node[2])} {node[1]} {_show(node[3])})"
    if op == "item":
        return f"{_show(node[1])}[{_show(node[2])}]"
    args = [_show(a) for a in node[2]] + [f"{k}={_show(v)}" for k, v in node[3].items()]
    return f"{node[1]}({', '.join(args)})"
