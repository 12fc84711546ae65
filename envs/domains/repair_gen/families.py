"""The bug families of the generated repair domain, and the function templates each one breaks.

A family is a set of interchangeable *variants* of one bug site (the comparison ``<`` / ``<=`` /
``>`` / ``>=``, the four ``range`` bounds, a signed constant, a ``min``/``max`` or ``and``/``or``
pair, an argument order) and the *plausible fixes* of each variant: what an engineer who sees the
buggy line, but not the tests, would try. The generator draws the buggy variant first and then the
correct one uniformly among its plausible fixes, so the line alone never says which fix is right:
only running the tests (or reasoning about what they print) does. The other plausible fixes are the
task's near misses, and the demonstrations pick among all of them blindly (:mod:`.demos`).

A template is a tiny module with one ``{site}`` line, neutral names, and a generator of test
inputs that puts values on the boundaries the family moves.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable
from typing import Any

FUNCTION_NAMES = ("calc", "score", "tally", "weigh", "fold", "shape", "rate", "step", "mix", "pick", "gauge", "blend")
HELPER_NAMES = ("part", "core", "base", "unit", "piece", "inner")
MODULE_NAMES = (
    "util",
    "calc",
    "stats",
    "core",
    "tools",
    "figures",
    "logic",
    "ops",
    "metrics",
    "rules",
)  # none in the stdlib
SCALAR_NAMES = ("a", "b", "c", "x", "y", "z", "m", "n", "p", "q", "u", "v", "w")
LIST_NAMES = ("xs", "ys", "vals", "nums", "items", "data")
ACC_NAMES = ("acc", "out", "res", "total", "cnt")


@dataclasses.dataclass(frozen=True)
class Family:
    """A bug family: its variants, how a variant renders into the site, and its plausible fixes."""

    name: str
    draw: Callable[[random.Random], Any]  # a buggy variant
    fixes: Callable[[Any], list[Any]]  # the plausible fixes of a variant (the gold is one of them)
    render: Callable[[Any], str]


def _others(values: tuple[Any, ...]) -> Callable[[Any], list[Any]]:
    return lambda v: [w for w in values if w != v]


CMP_OPS = ("<", "<=", ">", ">=")
RANGES = ("range({n})", "range({n} + 1)", "range(1, {n})", "range(1, {n} + 1)")
PAIRS_MINMAX = tuple(itertools.product(("min", "max"), repeat=2))
PAIRS_ANDOR = tuple(itertools.product(("and", "or"), repeat=2))
ORDERS = tuple(itertools.permutations(range(3)))


def _signed_fixes(s: int) -> list[int]:
    """A constant's plausible fixes: the sign flipped, or one more or less in size."""
    step = 1 if s > 0 else -1
    return [-s, s + step, s - step]


def _transpositions(order: tuple[int, ...]) -> list[tuple[int, ...]]:
    """An argument order's plausible fixes: each pair of arguments swapped back."""
    out = []
    for i, j in ((0, 1), (0, 2), (1, 2)):
        swapped = list(order)
        swapped[i], swapped[j] = swapped[j], swapped[i]
        out.append(tuple(swapped))
    return out


FAMILIES = {
    f.name: f
    for f in (
        Family("comparison", lambda r: r.choice(CMP_OPS), _others(CMP_OPS), str),
        Family("range_bound", lambda r: r.choice(RANGES), _others(RANGES), str),
        Family(
            "constant_sign",
            lambda r: r.choice((1, -1)) * r.randint(2, 9),
            _signed_fixes,
            lambda s: f"{s:+d}"[0] + f" {abs(s)}",
        ),
        Family("min_max", lambda r: r.choice(PAIRS_MINMAX), _others(PAIRS_MINMAX), lambda v: v),
        Family("and_or", lambda r: r.choice(PAIRS_ANDOR), _others(PAIRS_ANDOR), lambda v: v),
        Family("swapped_args", lambda r: r.choice(ORDERS), _transpositions, lambda v: v),
    )
}


@dataclasses.dataclass(frozen=True)
class Template:
    """A module with one bug site: ``source(names, variant)``, and ``inputs(rng, names)`` for its entry point."""

    family: str
    source: Callable[[dict[str, str], Any], str]
    inputs: Callable[[random.Random, dict[str, str]], tuple[Any, ...]]


def _small_list(r: random.Random, lo: int = 0, hi: int = 6) -> list[int]:
    return [r.randint(lo, hi) for _ in range(r.randint(1, 5))]


def _count_cmp(nm: dict[str, str], op: str) -> str:
    f, xs, t, v, acc = nm["f"], nm["xs"], nm["a"], nm["b"], nm["acc"]
    return (
        f"def {f}({xs}, {t}):\n    {acc} = 0\n    for {v} in {xs}:\n"
        f"        if {v} {op} {t}:\n            {acc} += 1\n    return {acc}\n"
    )


def _branch_cmp(nm: dict[str, str], op: str) -> str:
    f, a, b, k = nm["f"], nm["a"], nm["b"], nm["k"]
    return f"def {f}({a}, {b}):\n    if {a} {op} {b}:\n        return {a} - {b}\n    return {b} * {k}\n"


def _sum_range(nm: dict[str, str], rng: str) -> str:
    f, n, i, acc, k, c = nm["f"], nm["a"], nm["b"], nm["acc"], nm["k"], nm["c"]
    bound = rng.format(n=n)
    return (
        f"def {f}({n}):\n    {acc} = 0\n    for {i} in {bound}:\n        {acc} += {i} * {k} + {c}\n    return {acc}\n"
    )


def _list_range(nm: dict[str, str], rng: str) -> str:
    # Over a number, not a list's indices: a bound past the end would raise, and a fix that
    # always raises is not a plausible one.
    f, n, i, acc, k, c = nm["f"], nm["a"], nm["b"], nm["acc"], nm["k"], nm["c"]
    bound = rng.format(n=n)
    return f"def {f}({n}):\n    {acc} = []\n    for {i} in {bound}:\n        {acc}.append({i} * {k} - {c})\n    return {acc}\n"


def _linear_const(nm: dict[str, str], s: str) -> str:
    f, a, b, k = nm["f"], nm["a"], nm["b"], nm["k"]
    return f"def {f}({a}, {b}):\n    return {a} * {k} + {b} {s}\n"


def _two_step_const(nm: dict[str, str], s: str) -> str:
    f, a, b, k = nm["f"], nm["a"], nm["b"], nm["k"]
    return f"def {f}({a}):\n    {b} = {a} * {k}\n    return {b} {s}\n"


def _minmax(nm: dict[str, str], pair: tuple[str, str]) -> str:
    f, x, lo, hi = nm["f"], nm["a"], nm["b"], nm["c_name"]
    return f"def {f}({x}, {lo}, {hi}):\n    return {pair[0]}({lo}, {pair[1]}({x}, {hi}))\n"


def _andor(nm: dict[str, str], pair: tuple[str, str]) -> str:
    f, x, y, z, lo, hi = nm["f"], nm["a"], nm["b"], nm["c_name"], nm["k"], nm["k2"]
    return f"def {f}({x}, {y}, {z}):\n    return {x} > {lo} {pair[0]} {y} < {hi} {pair[1]} {z} % 2 == 0\n"


def _swapped(nm: dict[str, str], order: tuple[int, ...]) -> str:
    f, g, x, y, k = nm["f"], nm["g"], nm["a"], nm["b"], nm["k"]
    p = ("p", "q", "r")
    args = ", ".join((x, y, k)[i] for i in order)
    return (
        f"def {g}({p[0]}, {p[1]}, {p[2]}):\n    return ({p[0]} - {p[1]}) * {p[2]}\n\n\n"
        f"def {f}({x}, {y}):\n    return {g}({args})\n"
    )


def _pair_often_equal(r: random.Random, nm: dict[str, str], hi: int = 9) -> tuple[int, int]:
    """Two ints in ``0..hi``, equal four times in ten: ``<`` and ``<=`` (or ``x == y``) differ only there."""
    a = r.randint(0, hi)
    return a, a if r.random() < 0.4 else r.randint(0, hi)


def _andor_inputs(r: random.Random, nm: dict[str, str]) -> tuple[int, int, int]:
    """``(x, y, z)`` for :func:`_andor`, each of its three conditions true or false by a coin.

    Two of the four ``and``/``or`` pairs differ on only two of the eight truth patterns, so the
    patterns are drawn uniformly rather than left to where random integers fall."""
    lo, hi = int(nm["k"]), int(nm["k2"])
    x = r.randint(lo + 1, lo + 6) if r.random() < 0.5 else r.randint(lo - 5, lo)
    y = r.randint(hi - 6, hi - 1) if r.random() < 0.5 else r.randint(hi, hi + 5)
    return x, y, r.randint(0, 9)


def _ints(count: int, lo: int = -3, hi: int = 9) -> Callable[[random.Random, dict[str, str]], tuple[int, ...]]:
    return lambda r, nm: tuple(r.randint(lo, hi) for _ in range(count))


TEMPLATES = (
    Template("comparison", _count_cmp, lambda r, nm: (_small_list(r), r.randint(0, 6))),
    Template("comparison", _branch_cmp, _pair_often_equal),
    Template("range_bound", _sum_range, _ints(1, 0, 15)),
    Template("range_bound", _list_range, _ints(1, 0, 9)),
    Template("constant_sign", _linear_const, _ints(2)),
    Template("constant_sign", _two_step_const, _ints(1)),
    Template("min_max", _minmax, lambda r, nm: (r.randint(-5, 15), r.randint(-5, 4), r.randint(5, 12))),
    Template("and_or", _andor, _andor_inputs),
    Template("swapped_args", _swapped, _ints(2, -4, 9)),
)


def draw_names(r: random.Random) -> dict[str, str]:
    """Names and constants of one task: every identifier in a template is drawn here."""
    f, g = r.sample(FUNCTION_NAMES, 1)[0], r.choice(HELPER_NAMES)
    a, b, c_name = r.sample(SCALAR_NAMES, 3)
    return {
        "module": r.choice(MODULE_NAMES),
        "f": f,
        "g": g,
        "a": a,
        "b": b,
        "c_name": c_name,
        "xs": r.choice(LIST_NAMES),
        "acc": r.choice(ACC_NAMES),
        "k": str(r.randint(2, 5)),
        "k2": str(r.randint(6, 11)),
        "c": str(r.randint(1, 7)),
    }
