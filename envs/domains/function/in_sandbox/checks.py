"""Checks over plain data: the recorded form of a task's ``assert``, evaluated on a candidate's decoded result.

A *check* is the recorded form of one ``assert`` of a task's tests, as a small
expression tree over the candidate's result ``["R"]`` and recorded constants
``["v", ENCODED]`` (values in the :mod:`plain_data <envs.in_sandbox.plain_data>`
format). The judge evaluates it with builtin operators on fresh builtin values
(:func:`evaluate`): no code the candidate wrote runs on the judge's side.

Shipped beside ``plain_data.py`` into the sandbox that records a task's
checks (``recorder.py``) and imported on the host, so both sides evaluate a
check with the very same code. Standard library only; Python >= 3.8.
"""

from __future__ import annotations

import math

if __package__:  # imported on the host, as part of envs
    from envs.in_sandbox.plain_data import DecodeError, decode
else:  # shipped: plain_data.py sits beside this file
    from plain_data import DecodeError, decode

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


class CheckError(ValueError):
    """A check tree that is malformed (a recorder bug or a corrupted record, never the candidate's doing)."""


def _identity(a, b):
    # `is` means something only for the singletons; decoded True/False/None are the singletons.
    if not (type(a) in (bool, type(None)) or type(b) in (bool, type(None))):
        raise CheckError("`is` compares with True, False or None only")
    return a is b


def evaluate(check, result):
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
        for i, o in enumerate(ops):
            right = _term(terms[i + 1], result, depth + 1)
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


def fill(template, constants):
    """A check from a recorder template: each hole ``["h", i]`` replaced by ``["v", constants[i]]``."""
    if type(template) is list and template and template[0] == "h":
        return ["v", constants[template[1]]]
    if type(template) is list:
        return [fill(t, constants) for t in template]
    if type(template) is dict:
        return {k: fill(v, constants) for k, v in template.items()}
    return template


def describe(check):
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
        for i, o in enumerate(node[2]):
            parts += [o, _show(node[1][i + 1])]
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
