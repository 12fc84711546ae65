"""Generic near-miss mutators: plausible wrong end states derived from any task's gold solution.

Each is registered with :func:`envs.quality.hooks.register_mutator` and applies to every
domain whose gold is written as ``files`` (path -> content) or a ``patch`` (a unified diff);
it yields nothing for other golds. A domain adds mutators of its own the same way. Every
mutant must score 0: ``python -m envs.quality.validate`` plays them through the task's
environment and fails a task that pays one, naming the mutant.

* ``empty_files``: the files the gold writes, with the right names and no content
  (a checker that looks at names, or at a file's existence, pays it);
* ``comment_out_added``: the gold with every line it adds commented out (a checker that
  matches text, comments included, pays it).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from typing import Any

from envs.quality.hooks import Mutant, register_mutator
from envs.tasks import Task

# Files whose comments start with "#": the ones a line can be commented out in without changing the language.
HASH_COMMENTS = (".py", ".sh", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".conf", ".txt")
PATCHED = re.compile(r"^\+\+\+ (?:b/)?(\S+)", re.MULTILINE)


def gold_paths(task: Task) -> list[str]:
    """The paths the gold solution writes: its ``files``, or the targets of its ``patch``."""
    gold = task.gold or {}
    if isinstance(gold.get("files"), dict):
        return sorted(gold["files"])
    if isinstance(gold.get("patch"), str):
        return sorted({p for p in PATCHED.findall(gold["patch"]) if p != "/dev/null"})
    return []


@register_mutator("empty_files")
def empty_files(env: Any, task: Task) -> Iterator[Mutant]:
    paths = gold_paths(task)
    if paths:
        solution = {"files": {path: "" for path in paths}}
        yield Mutant(
            "empty_files", "the gold's files with their names and no content", tuple(_actions(env, task, solution))
        )


@register_mutator("comment_out_added")
def comment_out_added(env: Any, task: Task) -> Iterator[Mutant]:
    gold = task.gold or {}
    if isinstance(gold.get("patch"), str):
        lines = [_comment_patch_line(line) for line in gold["patch"].splitlines(keepends=True)]
        solution: dict[str, Any] = {"patch": "".join(lines)}
    elif isinstance(gold.get("files"), dict):
        start = dict(task.files or {})
        files = {p: _comment_added(start.get(p, ""), c) for p, c in gold["files"].items() if p.endswith(HASH_COMMENTS)}
        if not files or files == {p: gold["files"][p] for p in files}:  # nothing added that a comment could hide
            return
        solution = {"files": files}
    else:
        return
    yield Mutant(
        "comment_out_added", "the gold with every line it adds commented out", tuple(_actions(env, task, solution))
    )


def _actions(env: Any, task: Task, solution: dict[str, Any]) -> list[str]:
    return env.solution_actions(task, solution)


def _comment(line: str) -> str:
    body = line.lstrip(" \t")
    return line if not body.strip() or body.startswith("#") else f"{line[: len(line) - len(body)]}# {body}"


def _comment_patch_line(line: str) -> str:
    return "+" + _comment(line[1:]) if line.startswith("+") and not line.startswith("+++") else line


def _comment_added(start: str, gold: str) -> str:
    """``gold`` with the lines it inserts or replaces (in order: a moved line counts as added) commented out."""
    before, after = start.splitlines(keepends=True), gold.splitlines(keepends=True)
    out = []
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes():
        out += after[j1:j2] if tag == "equal" else [_comment(line) for line in after[j1:j2]]
    return "".join(out)
