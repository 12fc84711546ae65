"""Generated repair tasks: a tiny module with one injected bug, a visible check, hidden tests.

``repair_gen:SPLIT[:N]`` (``repair_gen:train:2000``, ``repair_gen:eval:100``) is the loader. Task
``i`` of a split is generated from the seed ``SPLIT_SEEDS[split] + i`` alone (names, values,
template, bug family, bug site and the correct variant all come from it), and the seed ranges of
the splits are disjoint, so a held-out task is never a training task.

Each task is a workspace of two files: ``<module>.py`` (one or two short functions, one line wrong)
and ``tests/check.py``, a self-contained check that prints only the failing cases and a count
(``run_tests`` runs it: a few dozen bytes of output, the same every time, for a model whose whole
context is a couple of kilobytes). The hidden tests are pytest functions over other inputs, judged
by the repair domain's ``hidden_tests`` verifier (split judge, separate uids). Expected values come
from running the correct module here, at generation; a draw is kept only if the buggy module and
every other plausible fix fail at least one visible *and* one hidden case, so the visible check
tells the fixes apart and the hidden tests agree with it.
"""

from __future__ import annotations

import itertools
import random
import shlex
from collections.abc import Sequence
from typing import Any

from envs.domains.repair_gen.families import FAMILIES, TEMPLATES, Template, draw_names
from envs.tasks import Task, TaskError, register_loader

NAME = "repair_gen"
SPLIT_SEEDS = {"train": 0, "eval": 10_000_000}  # disjoint ranges: a split never reaches the next one's start
SPLIT_SIZE = 10_000_000
DEFAULT_COUNT = {"train": 2000, "eval": 100}
VISIBLE_CASES = 3
HIDDEN_CASES = 5
CHECK_PATH = "tests/check.py"
MAX_DRAWS = 100  # of inputs per bug, and of bugs per seed: a seed that exhausts both is a bug of the generator

# The visible check is data (``tests/check.py``: the import and the cases); the runner is the test
# command, so it is not in the workspace, where every task would share its text. ``report`` below
# prints what it prints without a sandbox (the demonstrations need the tool output): a test
# compares the two on generated tasks.
RUNNER = """import sys
sys.path[:0] = ["/workspace", "/workspace/tests"]
import check
bad = 0
for expr, want in check.CASES:
    try:
        got = repr(eval(expr, vars(check)))
    except Exception as exc:
        got = type(exc).__name__
    if got != repr(want):
        bad += 1
        print(f"FAIL {expr} == {want!r}, got {got}")
print(f"{len(check.CASES) - bad} passed, {bad} failed")
sys.exit(1 if bad else 0)
"""
TEST_COMMAND = f"python3 -B -c {shlex.quote(RUNNER)}"


def evaluate(source: str, calls: Sequence[str]) -> list[str]:
    """``repr`` of each call's value (or the exception's type name), running ``source`` here.

    Only generator-made, trusted code runs here: the sandbox runs what the agent writes."""
    return _values(_namespace(source), calls)


def _namespace(source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, "<generated>", "exec"), namespace)  # noqa: S102 - trusted, generated here
    return namespace


def _values(namespace: dict[str, Any], calls: Sequence[str]) -> list[str]:
    out = []
    for call in calls:
        try:
            out.append(repr(eval(call, namespace)))  # noqa: S307 - trusted, generated here
        except Exception as exc:  # noqa: BLE001 - the check prints the type, so this must see it too
            out.append(type(exc).__name__)
    return out


def report(source: str, cases: Sequence[tuple[str, Any]]) -> tuple[str, int]:
    """What ``run_tests`` (:data:`RUNNER` over ``tests/check.py``) prints on ``source``, and its exit code."""
    got = evaluate(source, [expr for expr, _ in cases])
    lines = [f"FAIL {cases[i][0]} == {cases[i][1]!r}, got {got[i]}" for i in failing(source, cases, got)]
    bad = len(lines)
    lines.append(f"{len(cases) - bad} passed, {bad} failed")
    return "\n".join(lines) + "\n", 1 if bad else 0


def _call(function: str, args: tuple[Any, ...]) -> str:
    return f"{function}({', '.join(repr(a) for a in args)})"


def _draw_cases(r: random.Random, template: Template, names: dict[str, str], count: int, taken: set[str]) -> list[str]:
    calls: list[str] = []
    for _ in range(count * 20):
        call = _call(names["f"], template.inputs(r, names))
        if call not in taken:
            taken.add(call)
            calls.append(call)
            if len(calls) == count:
                return calls
    return calls


def _site_line(buggy: str, fixed: str) -> tuple[str, str]:
    """The one line that differs between two renderings of a template."""
    pairs = [(a, b) for a, b in zip(buggy.splitlines(), fixed.splitlines(), strict=True) if a != b]
    if len(pairs) != 1:
        raise TaskError(f"{NAME}: a bug site must be one line, got {len(pairs)} differing lines")
    return pairs[0]


def generate(seed: int, split: str) -> Task:
    """The task of ``seed`` (deterministic): see the module docstring."""
    r = random.Random(f"{NAME}/{seed}")
    # The family first, uniformly, then a template of it, names and the bug; only the inputs are
    # drawn again until they tell the variants apart, so no family, name or bug is made rarer by
    # how often its inputs fail (a bug no inputs can settle is drawn again).
    family = FAMILIES[r.choice(sorted(FAMILIES))]
    template = r.choice([t for t in TEMPLATES if t.family == family.name])
    for _ in range(MAX_DRAWS):
        names = draw_names(r)
        bug = family.draw(r)
        source = {v: template.source(names, family.render(v)) for v in [bug, *family.fixes(bug)]}
        spaces = {v: _namespace(text) for v, text in source.items()}
        for _ in range(MAX_DRAWS):
            task = _draw(r, template, names, bug, source, spaces, seed, split)
            if task is not None:
                return task
    raise TaskError(f"{NAME}: seed {seed} found no sound task in {MAX_DRAWS} draws")


def _draw(
    r: random.Random,
    template: Template,
    names: dict[str, str],
    bug: Any,
    source: dict[Any, str],
    spaces: dict[Any, dict[str, Any]],
    seed: int,
    split: str,
) -> Task | None:
    """The task with these names and this bug on inputs drawn now, or None if they do not tell the variants apart."""
    family = FAMILIES[template.family]
    function = names["f"]
    fixes = family.fixes(bug)
    variants = [bug, *fixes]
    calls = _draw_cases(r, template, names, VISIBLE_CASES + HIDDEN_CASES, set())
    if len(calls) < VISIBLE_CASES + HIDDEN_CASES:
        return None
    values = {v: _values(spaces[v], calls) for v in variants}
    # Kept or not by a test symmetric in the fixes, and only then the gold drawn: were the test
    # about the gold, the kept draws would favour some fixes, and a policy that never checks
    # could learn the favourite (and_or: 3 in 4 once were the first fix).
    if any(not _is_value(w) for v in fixes for w in values[v]):
        return None  # a fix raises: it could not be the correct code's expected value
    split_at = VISIBLE_CASES
    for u, v in itertools.combinations(variants, 2):
        differ = [a != b for a, b in zip(values[u], values[v], strict=True)]
        if not any(differ[:split_at]) or not any(differ[split_at:]):
            return None  # the check or the hidden tests could not tell u from v
    gold = r.choice(fixes)
    cases = [(c, eval(w)) for c, w in zip(calls, values[gold], strict=True)]  # noqa: S307 - reprs made here
    visible, hidden = cases[:VISIBLE_CASES], cases[VISIBLE_CASES:]
    module = f"{names['module']}.py"
    old, new = _site_line(source[bug], source[gold])
    misses = []
    for v in fixes:
        if v != gold:
            _, line = _site_line(source[bug], source[v])
            why = f"another plausible fix of the {family.name} bug ({line.strip()}): fails the tests"
            misses.append({"name": line.strip(), "why": why, "edit": {"path": module, "old": old, "new": line}})
    return Task(
        id=f"{NAME}/{split}/{seed:08d}",
        domain=NAME,
        prompt=f"The check in {CHECK_PATH} fails. Fix the bug in {module} and submit.",
        files={module: source[bug], CHECK_PATH: check_source(names["module"], function, visible)},
        hidden={
            "tests": {f"test_{names['module']}_hidden.py": hidden_tests(names["module"], function, hidden)},
            "manifest": sorted(_node_ids(names["module"], len(hidden))),
            "fail_to_pass": sorted(_node_ids(names["module"], len(hidden), failing(source[bug], hidden))),
        },
        gold={"edit": {"path": module, "old": old, "new": new}, "near_misses": misses},
        split=split,
        metadata={
            "test_command": TEST_COMMAND,
            "protected": ["tests/*"],
            "family": family.name,
            "fixes": [_site_line(source[bug], source[v])[1] for v in fixes],
            "visible_cases": [list(c) for c in visible],
            "function": function,
            "seed": seed,
        },
    )


def _is_value(text: str) -> bool:
    return text[:1] in "-[0123456789" or text in ("True", "False")


def failing(source: str, cases: Sequence[tuple[str, Any]], got: Sequence[str] | None = None) -> list[int]:
    """Indices of ``cases`` that ``source`` fails (``got``: its :func:`evaluate` values, if known)."""
    got = evaluate(source, [c for c, _ in cases]) if got is None else got
    return [i for i, ((_, want), g) in enumerate(zip(cases, got, strict=True)) if g != repr(want)]


def _node_ids(module: str, count: int, only: Sequence[int] | None = None) -> list[str]:
    indices = range(count) if only is None else only
    return [f"tests/test_{module}_hidden.py::test_{i:02d}" for i in indices]


def check_source(module: str, function: str, cases: Sequence[tuple[str, Any]]) -> str:
    """``tests/check.py`` for ``cases`` (call text, expected value)."""
    lines = "".join(f"    ({expr!r}, {want!r}),\n" for expr, want in cases)
    return f"from {module} import {function}\n\nCASES = [\n{lines}]\n"


def hidden_tests(module: str, function: str, cases: Sequence[tuple[str, Any]]) -> str:
    """The hidden pytest module: one test per case, judged through the repository proxy."""
    tests = "".join(f"\n\ndef test_{i:02d}():\n    assert {expr} == {want!r}\n" for i, (expr, want) in enumerate(cases))
    return f"from {module} import {function}\n{tests}"


def generate_split(split: str, count: int | None = None, *, start: int = 0) -> list[Task]:
    """Tasks ``start .. start + count`` of ``split`` (``train`` or ``eval``)."""
    if split not in SPLIT_SEEDS:
        raise TaskError(f"{NAME}: unknown split {split!r}; expected one of {sorted(SPLIT_SEEDS)}")
    count = DEFAULT_COUNT[split] if count is None else count
    if count < 0 or start < 0 or start + count > SPLIT_SIZE:
        raise TaskError(f"{NAME}: tasks {start}..{start + count} are outside the split's {SPLIT_SIZE} seeds")
    base = SPLIT_SEEDS[split]
    return [generate(base + i, split) for i in range(start, start + count)]


@register_loader(NAME)
def load(arg: str) -> list[Task]:
    """``repair_gen:SPLIT[:N]``: the first ``N`` tasks of the split (defaults: train 2000, eval 100)."""
    split, _, count = (arg or "train").partition(":")
    if count and not count.isdigit():
        raise TaskError(f"{NAME}:{arg}: expected {NAME}:SPLIT[:N] with N a non-negative integer")
    return generate_split(split or "train", int(count) if count else None)
