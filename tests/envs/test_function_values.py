"""Plain data across the trust boundary: the codec, its caps, the check evaluator, and the driver's own encoder.

No sandbox here: these are the pure functions the host uses to decide a
function task's reward, so they are tested on hostile inputs directly.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import math

import pytest

from envs.verifiers import function_values as fv
from envs.verifiers.functions import DRIVER, MAX_REPORT_BYTES, judge_report

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
    with pytest.raises(fv.EncodeError, match="not exactly a builtin type"):
        fv.encode(value)


def test_the_standard_librarys_dicts_travel_as_plain_dicts():
    counter = collections.Counter("abca")
    counter.__class__.items = lambda self: [("forged", 1)]  # overridden methods do not matter: the stored pairs do
    try:
        for value in (counter, collections.OrderedDict(a=1), collections.defaultdict(list, {1: [2]})):
            back = roundtrip(value)
            assert type(back) is dict and back == dict(dict.items(value))
            assert same(_driver_module().decode(_driver_module().encode(value)), back)
    finally:
        del counter.__class__.items
    with pytest.raises(fv.EncodeError):
        fv.encode(collections.defaultdict(lambda: 0, {1: object()}))  # the values must be data too


@pytest.mark.parametrize("value", [object(), print, iter([1]), range(3), bytearray(b"x"), Ellipsis, type])
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
    ],
    ids=repr,
)
def test_malformed_trees_are_decode_errors(tree):
    with pytest.raises(fv.DecodeError):
        fv.decode(tree)


def V(value):
    return ["v", fv.encode(value)]


def test_evaluate_comparators():
    eq = ["cmp", [["R"], V(0.5)], ["=="]]
    assert fv.evaluate(eq, 0.5) and not fv.evaluate(eq, 0.25)
    assert fv.evaluate(["cmp", [["R"], V(True)], ["=="]], 1)  # Python's 1 == True holds, as in the original assert
    assert not fv.evaluate(["cmp", [["R"], V(True)], ["is"]], 1)
    assert fv.evaluate(["cmp", [["R"], V(None)], ["is"]], None)
    tol = ["cmp", [["call", "abs", [["bin", "-", ["R"], V(0.33)]], {}], V(1e-6)], ["<"]]
    assert fv.evaluate(tol, 0.33 + 1e-9) and not fv.evaluate(tol, 0.34) and not fv.evaluate(tol, float("nan"))
    close = ["call", "math.isclose", [["R"], V(1.0)], {"rel_tol": V(1e-3)}]
    assert fv.evaluate(close, 1.0005) and not fv.evaluate(close, 1.1)
    chain = ["cmp", [V(0), ["R"], V(10)], ["<", "<"]]
    assert fv.evaluate(chain, 5) and not fv.evaluate(chain, 10)
    assert fv.evaluate(["not", ["R"]], []) and not fv.evaluate(["not", ["R"]], [0])
    assert fv.evaluate(["cmp", [["call", "tuple", [["R"]], {}], V((1, 2))], ["=="]], [1, 2])
    assert not fv.evaluate(["cmp", [["R"], V((1, 2))], ["=="]], [1, 2])  # a list is not the tuple asked for
    assert fv.evaluate(["cmp", [["item", ["R"], V(0)], V(3)], ["=="]], [3, 1])
    assert fv.evaluate(["cmp", [["neg", ["R"]], V(2)], ["=="]], -2)


def test_evaluate_failures_are_false_and_bad_records_are_errors():
    assert not fv.evaluate(["cmp", [["call", "sorted", [["R"]], {}], V([1, 2])], ["=="]], [1, "a"])  # TypeError
    assert not fv.evaluate(["cmp", [["R"], V(1)], ["<"]], "a")
    assert not fv.evaluate(["item", ["R"], V(5)], [])  # IndexError
    with pytest.raises(fv.CheckError, match="True, False or None"):
        fv.evaluate(["cmp", [["R"], V(5)], ["is"]], 5)
    for bad in (["exec", "print(1)"], ["call", "eval", [V("1")], {}], ["cmp", [["R"]], ["=="]], "R", ["v", ["obj"]]):
        with pytest.raises(fv.CheckError):
            fv.evaluate(bad, 1)


def test_describe_and_fill():
    template = ["cmp", [["call", "abs", [["bin", "-", ["R"], ["h", 0]]], {}], ["h", 1]], ["<"]]
    check = fv.fill(template, [fv.encode(0.33), fv.encode(1e-6)])
    assert fv.describe(check) == "abs((R - 0.33)) < 1e-06"
    assert fv.evaluate(check, 0.33)


def _driver_module():
    spec = importlib.util.spec_from_file_location("function_driver_under_test", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_driver_encodes_and_decodes_like_the_host():
    driver = _driver_module()
    for value in SAMPLES:
        assert same(fv.decode(driver.encode(value)), value)
        assert same(driver.decode(fv.encode(value)), value)
    for value in _subclasses():
        with pytest.raises(driver.Unencodable):
            driver.encode(value)


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
