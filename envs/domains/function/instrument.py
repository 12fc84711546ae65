"""Turning a task's ``check(candidate)`` into recordable data: the AST side (host, no task code runs).

HumanEval and MBPP grade a function with ``assert`` statements over calls of
``candidate``. :func:`instrument` rewrites each assert of a recognised shape
into a call of the recorder, ``__agentrl_record__(site, args, *constants)``,
where ``args`` and each constant are thunks (lambdas) of the original
expressions: run with the reference solution (``in_sandbox/recorder.py``, in
a sandbox), every evaluation of the assert, in loops and with random inputs
alike, becomes one recorded call: its arguments and a check over the result
(a tree of :mod:`envs.domains.function.in_sandbox.checks`).

Recognised: any expression with exactly one ``candidate(...)`` call whose path
to the root goes only through comparisons (``==``, ``<``, ``is``, ``in`` ...,
chained too), ``not``, unary ``-``, ``+``/``-``, subscripts and the functions of
:data:`checks.CALLS <envs.domains.function.in_sandbox.checks.CALLS>` (``abs``, ``math.fabs``, ``math.isclose``,
``tuple``, ``sorted``, ``set``, ``len``, ``round`` ...); every part that does
not involve the candidate is a constant taken when the assert runs. So
``candidate(x) == E``, ``E == candidate(x)``, ``candidate(x) is True``,
``candidate(x)``, ``not candidate(x)``, ``abs(candidate(x) - E) < tol`` and
``math.isclose(candidate(x), E, rel_tol=...)`` all record. ``assert A and B``
is split into two asserts. Anything else that touches the candidate (a result
kept in a variable, a nested call, an assert inside ``try``, a use outside an
assert) makes the task :class:`Unconvertible`, with the line that says why.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

from envs.domains.function.in_sandbox.checks import CALLS

RECORD = "__agentrl_record__"
ARGS = "__agentrl_args__"
_COMPARE_OPS = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}
_BINARY_OPS = {ast.Add: "+", ast.Sub: "-"}


class Unconvertible(ValueError):
    """The task's checks cannot be turned into calls with expected results; the message says why."""


@dataclasses.dataclass(frozen=True)
class Instrumented:
    """A rewritten test: its source, and per recording site the check template and the assert's line.

    ``candidate`` is the name the test calls the function under test by; when
    it is not the entry point's own name, that name stands for the reference.
    """

    source: str
    sites: dict[int, dict[str, Any]]
    candidate: str


def _snippet(node: ast.AST) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= 100 else text[:97] + "..."


def _where(node: ast.AST) -> str:
    return f"line {getattr(node, 'lineno', '?')}: `{_snippet(node)}`"


class _Site:
    """Builds the template of one assert: the candidate call's arguments and the constant holes."""

    def __init__(self, names: frozenset[str]):
        self.names = names
        self.call: ast.Call | None = None
        self.holes: list[ast.expr] = []

    def uses_candidate(self, node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id in self.names for n in ast.walk(node))

    def is_candidate_call(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.names

    def convert(self, node: ast.expr) -> list:
        if not self.uses_candidate(node):
            self.holes.append(node)
            return ["h", len(self.holes) - 1]
        if self.is_candidate_call(node):
            if self.call is not None:
                raise Unconvertible(f"{_where(node)} calls the candidate twice in one assert")
            if any(self.uses_candidate(a) for a in [*node.args, *node.keywords]):
                raise Unconvertible(f"{_where(node)} passes a candidate result to the candidate")
            self.call = node
            return ["R"]
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE_OPS for op in node.ops):
            terms = [self.convert(node.left), *(self.convert(c) for c in node.comparators)]
            return ["cmp", terms, [_COMPARE_OPS[type(op)] for op in node.ops]]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            return ["not" if isinstance(node.op, ast.Not) else "neg", self.convert(node.operand)]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
            return ["bin", _BINARY_OPS[type(node.op)], self.convert(node.left), self.convert(node.right)]
        if isinstance(node, ast.Subscript) and not any(isinstance(n, ast.Slice) for n in ast.walk(node.slice)):
            return ["item", self.convert(node.value), self.convert(node.slice)]
        name = _call_name(node)
        if name in CALLS:
            call = node
            assert isinstance(call, ast.Call)
            if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
                raise Unconvertible(f"{_where(node)} uses *args/**kwargs around the candidate")
            return [
                "call",
                name,
                [self.convert(a) for a in call.args],
                {k.arg: self.convert(k.value) for k in call.keywords},
            ]
        raise Unconvertible(f"{_where(node)} uses the candidate in a way that cannot be recorded as data")


def _call_name(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "math":
        return f"math.{func.attr}"
    return None


def _split_and(node: ast.Assert) -> list[ast.Assert]:
    if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And):
        parts = [ast.copy_location(ast.Assert(test=v, msg=None), node) for v in node.test.values]
        return [p for part in parts for p in _split_and(part)]
    return [node]


class _Rewriter(ast.NodeTransformer):
    def __init__(self, names: frozenset[str]):
        self.names = names
        self.sites: dict[int, dict[str, Any]] = {}
        self.in_try = 0

    def _guarded(self, node: ast.AST) -> ast.AST:
        # An assert in a `try` body or a `with` block may have its failure swallowed: not a plain check.
        self.in_try += 1
        node.body = _flat(self.visit(s) for s in node.body)
        self.in_try -= 1
        for field in ("handlers", "orelse", "finalbody"):
            if hasattr(node, field):
                setattr(node, field, _flat(self.visit(s) for s in getattr(node, field)))
        return node

    visit_Try = visit_TryStar = visit_With = visit_AsyncWith = _guarded

    def visit_Assert(self, node: ast.Assert) -> ast.AST | list[ast.AST]:
        out: list[ast.AST] = []
        for part in _split_and(node):
            site = _Site(self.names)
            if not site.uses_candidate(part.test):
                out.append(part)
                continue
            if self.in_try:
                raise Unconvertible(f"{_where(part)} is inside a try/with block (its failure may be swallowed)")
            template = site.convert(part.test)  # a use of the candidate that is not a call raises here
            assert site.call is not None
            site_id = len(self.sites)
            self.sites[site_id] = {"template": template, "line": part.lineno}
            args = ast.Call(ast.Name(ARGS, ast.Load()), site.call.args, site.call.keywords)
            thunks = [ast.Lambda(_no_args(), args), *(ast.Lambda(_no_args(), h) for h in site.holes)]
            call = ast.Call(ast.Name(RECORD, ast.Load()), [ast.Constant(site_id), *thunks], [])
            out.append(ast.copy_location(ast.Expr(call), part))
        return out


def _flat(items) -> list[ast.AST]:
    out: list[ast.AST] = []
    for item in items:
        out.extend(item if isinstance(item, list) else [item])
    return out


def _no_args() -> ast.arguments:
    return ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])


def instrument(test: str, entry_point: str) -> Instrumented:
    """Rewrites ``test`` (defining ``check(candidate)``) for recording; :class:`Unconvertible` says why not."""
    try:
        tree = ast.parse(test)
    except SyntaxError as exc:
        raise Unconvertible(f"the test does not parse: {exc.msg} (line {exc.lineno})") from None
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1 or not checks[0].args.args:
        raise Unconvertible("the test does not define one check(candidate) function")
    param = checks[0].args.args[0].arg
    # HumanEval calls the function `candidate`; MBPP's tests call it by its own name. Where the test
    # uses `candidate`, a mention of the entry point's name is the reference (HumanEval/33 compares
    # `candidate(x)` with `sort_third(x)`: the original harness compared the candidate with itself).
    uses_param = any(isinstance(n, ast.Name) and n.id == param for n in ast.walk(tree))
    names = frozenset({param} if uses_param else {entry_point})
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in (RECORD, ARGS):
            raise Unconvertible(f"{_where(node)} uses a name reserved for the recorder")
    rewriter = _Rewriter(names)
    tree = ast.fix_missing_locations(rewriter.visit(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in names:
            line = test.splitlines()[node.lineno - 1].strip() if 0 < node.lineno <= len(test.splitlines()) else ""
            raise Unconvertible(f"line {node.lineno}: `{line[:100]}` uses the candidate outside a recordable assert")
    if not rewriter.sites:
        raise Unconvertible("the check never calls the candidate in an assert")
    return Instrumented(ast.unparse(tree), rewriter.sites, next(iter(names)))
