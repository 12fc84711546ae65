"""Plain data across the trust boundary: the one codec, its caps, the check evaluator, and the shipped driver.

No sandbox here: these are the pure functions the host uses to decide a
reward (function tests; the repository judge's wire uses the same codec), so
they are tested on hostile inputs directly. The driver runs as a bundled
``python -c`` program in a subprocess, exactly as it is shipped.
"""

from __future__ import annotations

import collections
import json
import math
import subprocess
import sys
from decimal import Decimal
from fractions import Fraction

import pytest

from envs.domains.function.in_sandbox import checks
from envs.domains.function.verifier import MAX_REPORT_BYTES, driver_program, judge_report
from envs.in_sandbox import bundle
from envs.in_sandbox import plain_data as fv

SAMPLES = [
    None,
    True,
    False,
    0,
    -1,
    2**200,
    -(3**1000),
    10**5000,  # beyond int's 4300-digit str limit: ints travel as hex
    0.5,
    -0.0,
    1e308,
    5e-324,
    float("inf"),
    float("-inf"),
    complex(1.5, -2),
    "",
    "héllo\n\x00",
    "\ud800",  # a lone surrogate survives JSON
    b"",
    b"\x00\xff",
    [1, [2, [3]]],
    (1, (2,), ()),
    [(1, 2), [1, 2]],
    {1, 2, 3},
    frozenset({"a", (1, 2)}),
    {"a": [1], (1, 2): {"b": None}, 3: frozenset()},
    {True: 1, 0: "zero"},
    bytearray(b"ab"),
    Decimal("1.010"),
    Decimal("-Infinity"),
    Fraction(-3, 4),
    [1, True, 1.0],
]


def roundtrip(value):
    return fv.loads(json.dumps(fv.encode(value)))


def same(a, b) -> bool:
    """Exactly the same data: type, and value to the bit (-0.0 is not 0.0; nan is nan)."""
    return type(a) is type(b) and json.dumps(fv.encode(a)) == json.dumps(fv.encode(b))


@pytest.mark.parametrize("value", SAMPLES, ids=lambda v: type(v).__name__)
def test_round_trip_is_exact_in_type_and_value(value):
    back = roundtrip(value)
    assert same(back, value)
    if type(value) not in (set, frozenset, dict):  # dicts keep their order, but `==` ignores it
        assert back == value


def test_nan_tuples_lists_and_bools_stay_distinct():
    assert math.isnan(roundtrip(float("nan")))
    assert roundtrip((1, 2)) != [1, 2] and roundtrip([1, 2]) == [1, 2]
    assert type(roundtrip(True)) is bool and type(roundtrip(1)) is int
    assert fv.encode({3, 1, 2}) == fv.encode({2, 3, 1})  # canonical order: reproducible recordings


def _subclasses():
    class Liar(float):
        __module__ = "fractions"
        __qualname__ = "Fraction"
        __class__ = property(lambda self: float)

        def __eq__(self, other):
            return True

        __hash__ = float.__hash__

    class Key(int):
        pass

    class Text(str):
        pass

    class Pair(tuple):
        pass

    class Table(dict):
        pass

    class Meta(type):  # a class that claims, through its metaclass, to be every type it is compared with
        def __eq__(cls, other):
            return True

        __hash__ = type.__hash__

    class Chameleon(list, metaclass=Meta):
        def __eq__(self, other):
            return True

    Chameleon.__name__ = "list"
    return [
        Liar(0.5),
        Key(1),
        Text("a"),
        Pair((1,)),
        Table(),
        Chameleon(),
        [1, Key(2)],
        {"k": Liar(1.0)},
        {Text("k"): 1},
        collections.UserDict(),
    ]


@pytest.mark.parametrize("value", _subclasses(), ids=lambda v: type(v).__name__)
def test_subclasses_and_foreign_types_are_rejected(value):
    with pytest.raises(fv.EncodeError, match="not plain data: its type is not exactly a builtin type"):
        fv.encode(value)


class Tripwire(float):
    """A float subclass whose every hook fails the test if the encoder calls it."""

    __module__ = "fractions"
    __qualname__ = "Fraction"

    def __eq__(self, other):
        raise AssertionError("__eq__ called")

    __hash__ = float.__hash__

    def __repr__(self):
        raise AssertionError("__repr__ called")

    def __reduce__(self):
        raise AssertionError("__reduce__ called")

    def __float__(self):
        raise AssertionError("__float__ called")


class EqualToAnyType(type):
    def __eq__(cls, other):
        return True

    __hash__ = type.__hash__


class Sneaky(float, metaclass=EqualToAnyType):
    """Its *class* claims to equal every type (``type(x) in (float, ...)`` would say yes)."""


class TripList(list):
    def __iter__(self):
        raise AssertionError("__iter__ called")


class TripDict(dict):
    def items(self):
        raise AssertionError("items called")


@pytest.mark.parametrize(
    "make", [lambda: Tripwire(1.0), lambda: Sneaky(1.0), lambda: TripList([1]), lambda: TripDict(a=1), object]
)
def test_none_of_a_non_data_values_methods_run_and_a_ref_hook_gets_it_whole(make):
    value = make()
    with pytest.raises(fv.EncodeError, match="not plain data"):
        fv.encode([1, value])
    seen = []
    encoded = fv.encode({"k": [value]}, lambda obj: seen.append(obj) or ["remote", 1])
    assert seen == [value] and seen[0] is value
    assert encoded == ["dict", [[["str", "k"], ["list", [["remote", 1]]]]]]
    assert fv.decode(encoded, lambda node: ("handle", node[1])) == {"k": [("handle", 1)]}


def test_the_standard_librarys_dicts_travel_as_plain_dicts_where_asked():
    counter = collections.Counter("abca")
    counter.__class__.items = lambda self: [("forged", 1)]  # overridden methods do not matter: the stored pairs do
    try:
        for value in (counter, collections.OrderedDict(a=1), collections.defaultdict(list, {1: [2]})):
            back = fv.decode(json.loads(json.dumps(fv.encode(value, stdlib_dicts=True))))
            assert type(back) is dict and back == dict(dict.items(value))
            with pytest.raises(fv.EncodeError, match="not plain data"):  # the repository judge keeps them as handles
                fv.encode(value)
    finally:
        del counter.__class__.items
    with pytest.raises(fv.EncodeError):
        fv.encode(collections.defaultdict(lambda: 0, {1: object()}), stdlib_dicts=True)  # the values must be data too


@pytest.mark.parametrize("value", [object(), print, iter([1]), range(3), Ellipsis, type, memoryview(b"x")])
def test_non_data_is_rejected(value):
    with pytest.raises(fv.EncodeError):
        fv.encode(value)


def test_depth_and_size_caps():
    deep = []
    for _ in range(fv.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(fv.EncodeError, match="deeper"):
        fv.encode(deep)
    with pytest.raises(fv.EncodeError, match="more than"):
        fv.encode(list(range(fv.MAX_NODES + 1)))
    tree = ["list", []]
    for _ in range(fv.MAX_DEPTH + 1):
        tree = ["list", [tree]]
    with pytest.raises(fv.DecodeError, match="deeper"):
        fv.decode(tree)
    with pytest.raises(fv.DecodeError, match="more than"):
        fv.decode(["list", [["none"]] * (fv.MAX_NODES + 1)])
    with pytest.raises(fv.DecodeError, match="more than 10 bytes"):
        fv.loads(json.dumps(fv.encode("a" * 20)), max_bytes=10)
    with pytest.raises(fv.DecodeError, match="not JSON"):
        fv.loads("[" * 100_000 + "]" * 100_000)  # the JSON parser's own recursion limit
    big = 1 << fv.MAX_INT_BITS
    assert (
        fv.decode(fv.encode(big - 1)) == big - 1 and fv.decode(fv.encode(Fraction(1, big - 1))).denominator == big - 1
    )
    for value in (big, -big, Fraction(big, 3)):
        with pytest.raises(fv.EncodeError, match="bits"):
            fv.encode(value)
    with pytest.raises(fv.DecodeError, match="bits"):
        fv.decode(["int", "0x1" + "0" * (fv.MAX_INT_BITS // 4 + 1)])
    edge = Decimal(f"9e{fv.MAX_DECIMAL_EXPONENT}")
    assert fv.decode(fv.encode(edge)) == edge and fv.decode(fv.encode(-edge.scaleb(-2 * fv.MAX_DECIMAL_EXPONENT)))
    for value in (Decimal(f"1e{fv.MAX_DECIMAL_EXPONENT + 1}"), Decimal(f"1e-{fv.MAX_DECIMAL_EXPONENT + 1}")):
        with pytest.raises(fv.EncodeError, match="magnitude"):  # int() of it would hold the judge for hours
            fv.encode(value)
        with pytest.raises(fv.DecodeError, match="magnitude"):
            fv.decode(["decimal", str(value)])


@pytest.mark.parametrize(
    "tree",
    [
        "x",
        [],
        [1],
        ["object", "builtins.object"],
        ["int", 5],
        ["int", "zz"],
        ["float", 0.5],
        ["bool", 1],
        ["none", None],
        ["list", "abc"],
        ["set", [["list", []]]],  # unhashable item
        ["dict", [[["list", []], ["none"]]]],  # unhashable key
        ["dict", [["none"]]],
        ["complex", "0x1p0"],
        ["bytes", "xyz"],
        ["bytearray", 12],
        ["decimal", "1.2.3"],
        ["fraction", "0x1", "0x0"],  # a zero denominator
        ["fraction", "0x1", "-0x2"],
        ["fraction", 1, 2],
        ["remote", 1],  # a handle, with no ref hook to resolve it
        {"$": "tuple", "v": []},  # not a tagged list
    ],
    ids=repr,
)
def test_malformed_trees_are_decode_errors(tree):
    with pytest.raises(fv.DecodeError):
        fv.decode(tree)


def V(value):
    return ["v", fv.encode(value)]


ev = checks.evaluate


def test_evaluate_comparators():
    eq = ["cmp", [["R"], V(0.5)], ["=="]]
    assert ev(eq, 0.5) and not ev(eq, 0.25)
    assert ev(["cmp", [["R"], V(True)], ["=="]], 1)  # Python's 1 == True holds, as in the original assert
    assert not ev(["cmp", [["R"], V(True)], ["is"]], 1)
    assert ev(["cmp", [["R"], V(None)], ["is"]], None)
    tol = ["cmp", [["call", "abs", [["bin", "-", ["R"], V(0.33)]], {}], V(1e-6)], ["<"]]
    assert ev(tol, 0.33 + 1e-9) and not ev(tol, 0.34) and not ev(tol, float("nan"))
    close = ["call", "math.isclose", [["R"], V(1.0)], {"rel_tol": V(1e-3)}]
    assert ev(close, 1.0005) and not ev(close, 1.1)
    chain = ["cmp", [V(0), ["R"], V(10)], ["<", "<"]]
    assert ev(chain, 5) and not ev(chain, 10)
    assert ev(["not", ["R"]], []) and not ev(["not", ["R"]], [0])
    assert ev(["cmp", [["call", "tuple", [["R"]], {}], V((1, 2))], ["=="]], [1, 2])
    assert not ev(["cmp", [["R"], V((1, 2))], ["=="]], [1, 2])  # a list is not the tuple asked for
    assert ev(["cmp", [["item", ["R"], V(0)], V(3)], ["=="]], [3, 1])
    assert ev(["cmp", [["neg", ["R"]], V(2)], ["=="]], -2)


def test_evaluate_failures_are_false_and_bad_records_are_errors():
    assert not ev(["cmp", [["call", "sorted", [["R"]], {}], V([1, 2])], ["=="]], [1, "a"])  # TypeError
    assert not ev(["cmp", [["R"], V(1)], ["<"]], "a")
    assert not ev(["item", ["R"], V(5)], [])  # IndexError
    with pytest.raises(checks.CheckError, match="True, False or None"):
        ev(["cmp", [["R"], V(5)], ["is"]], 5)
    for bad in (["exec", "print(1)"], ["call", "eval", [V("1")], {}], ["cmp", [["R"]], ["=="]], "R", ["v", ["obj"]]):
        with pytest.raises(checks.CheckError):
            ev(bad, 1)


def test_describe_and_fill():
    template = ["cmp", [["call", "abs", [["bin", "-", ["R"], ["h", 0]]], {}], ["h", 1]], ["<"]]
    check = checks.fill(template, [fv.encode(0.33), fv.encode(1e-6)])
    assert checks.describe(check) == "abs((R - 0.33)) < 1e-06"
    assert ev(check, 0.33)


def run_driver(program: str, entry: str, calls: list) -> bytes:
    """The shipped driver (bundled with the codec, as the sandbox gets it), run in a subprocess here."""
    request = {"program": program, "entry_point": entry, "calls": calls, "call_timeout_s": 5.0}
    argv = [sys.executable, "-I", "-S", "-B", "-c", driver_program()]
    return subprocess.run(argv, input=json.dumps(request).encode(), capture_output=True, timeout=60, check=True).stdout


def test_the_shipped_driver_reports_results_the_host_decodes_exactly():
    program = "import collections\n\ndef echo(x, counter=False):\n    return collections.Counter(x) if counter else x\n"
    calls = [[fv.encode([value]), fv.encode({})] for value in SAMPLES]
    calls.append([fv.encode(["aab"]), fv.encode({"counter": True})])  # a standard-library dict travels as a dict
    lines = run_driver(program, "echo", calls).splitlines()
    events = [json.loads(line) for line in lines]
    assert events[0] == ["loaded"] and [e[:2] for e in events[1:]] == [[i, "ok"] for i in range(len(calls))]
    for event, value in zip(events[1:], [*SAMPLES, {"a": 2, "b": 1}], strict=True):
        assert same(fv.decode(event[2]), value), (event, value)


def test_the_shipped_driver_refuses_subclasses_and_stops_at_the_first_failure():
    program = "class Liar(float):\n    def __eq__(self, other):\n        return True\n\ndef f(x):\n    return Liar(x)\n"
    calls = [[fv.encode([0.5]), fv.encode({})], [fv.encode([1.5]), fv.encode({})]]
    events = [json.loads(line) for line in run_driver(program, "f", calls).splitlines()]
    assert events[0] == ["loaded"] and events[1][:2] == [0, "unencodable"] and len(events) == 2
    assert "not exactly a builtin type" in events[1][2]


def test_bundle_installs_modules_before_the_main_program():
    program = bundle("import helper\nprint(helper.VALUE, __name__)", {"helper": "VALUE = 42"})
    out = subprocess.run([sys.executable, "-I", "-c", program], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["42", "__main__"]
    with pytest.raises(ValueError, match="not a module name"):
        bundle("", {"no-dash": ""})


def _report(*events) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


CALLS = [{"args": [], "kwargs": {}, "check": ["cmp", [["R"], V(1)], ["=="]], "line": 3}] * 2


BAD_REPORTS = [
    (b"", "no load event"),
    (_report(["load_error", "SyntaxError", "bad"]), "did not load: SyntaxError"),
    (_report(["loaded"], [0, "ok", fv.encode(1)]), "no result for call 1"),
    (_report(["loaded"], [0, "ok", fv.encode(1)], [1, "ok", fv.encode(2)]), "is false for R = 2"),
    (_report(["loaded"], [0, "ok", fv.encode(10**5000)]), "is false for R = <int too long to show>"),
    (_report(["loaded"], [0, "ok", fv.encode([[]] * 50_000)]), "is false for R = [[], [], "),
    (_report(["loaded"], [0, "ok", fv.encode([[]] * 100_000)]), "output cap"),
    (b'["loaded"]\n[0, "ok", ["int", "0x1"]]\n\xff\n', "malformed"),
    (b'["loaded"]\n[' + b"1" * 5000 + b', "ok", ["int", "0x1"]]\n', "malformed"),  # past int's digit limit
    (_report(["loaded"], [1, "ok", fv.encode(1)], [0, "ok", fv.encode(1)]), "expected call 0"),
    (_report(["loaded"], [True, "ok", fv.encode(1)]), "expected call 0"),
    (_report(["loaded"], [0, "ok", fv.encode(1)], [1, "ok", fv.encode(1)], [2, "ok", fv.encode(1)]), "more events"),
    (_report(["loaded"], [0, "raise", "ValueError", "no"]), "raised ValueError"),
    (_report(["loaded"], [0, "timeout"]), "timed out"),
    (_report(["loaded"], [0, "ok", ["float-ish", "1"]]), "not plain data"),
    (_report(["loaded"]) + b"passed\n", "malformed"),
    (_report(["loaded"], [0, "ok", fv.encode(1)]) + b'[1, "ok", ["int", "0x1"]', "incomplete"),
]


@pytest.mark.parametrize("stdout,why", BAD_REPORTS, ids=[why for _, why in BAD_REPORTS])
def test_the_judge_accepts_only_a_complete_well_formed_report(stdout, why):
    run = judge_report(CALLS, stdout)
    assert not run.passed and why in run.result


def test_the_judge_passes_a_correct_report_unless_capped_or_late():
    good = _report(["loaded"], [0, "ok", fv.encode(1)], [1, "ok", fv.encode(True)])
    assert judge_report(CALLS, good).passed
    assert "output cap" in judge_report(CALLS, good, truncated=True).result
    assert "output cap" in judge_report(CALLS, good + b" " * MAX_REPORT_BYTES).result
    assert judge_report(CALLS, good, timed_out=True).result == "failed: timed out"
