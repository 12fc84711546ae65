"""SFT demonstrations for the generated repair domain, registered as ``repair_gen``: right only by luck.

Each demonstration does what a hurried engineer does: run the check, read the module, apply the
first plausible fix that comes to mind for the line at fault (one of the bug family's plausible
fixes, drawn without looking at what the check printed), and submit *without* checking again.
Every task has three plausible fixes (:mod:`.families`), so about a third of the demonstrations
are right, and imitation tops out there: what reinforcement learning can add is the habit of
running the check after the edit and trying another fix when it still fails.

Each ``replace`` names the smallest edit that says it: the whitespace-delimited words of the line
that change, widened word by word until ``old`` occurs once in the file (``<`` -> ``<=``, not the
whole indented line). The tool takes any unique text, and every byte a tiny byte-level model must
copy from the file is one it can get wrong: a whole line is ~30 of them, the edit 1-10.

Tool messages are exactly what the tools print (``run_tests`` via :func:`.tasks.report`, the
file as ``read_file`` returns it, ``replace``'s line), so the warm start sees what rollouts show.

    from envs.demonstrations import demonstrations
    conversations = demonstrations("repair_gen", {"num_tasks": 2000, "seed": 0})

``retry_fraction`` (default 0) makes that share of them check after each edit and retry until the
check passes: the control run that shows the ceiling is the demonstrations', not the model's.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from envs.demonstrations import Conversation, register_demonstrations
from envs.domains.repair_gen.env import initial_messages, replaced_message
from envs.domains.repair_gen.tasks import NAME, generate_split, report
from envs.parsing import format_tool_call
from envs.tasks import Task
from envs.tools import DEFAULT_MAX_OUTPUT_CHARS, format_process, truncate_middle
from sandbox import ExecResult

OPTIONS = {"num_tasks": 2000, "seed": 0, "retry_fraction": 0.0}


def run_tests_output(task: Task, source: str) -> str:
    """What ``run_tests`` prints for the module ``source`` of ``task`` (no sandbox needed)."""
    stdout, code = report(source, [tuple(c) for c in task.metadata["visible_cases"]])
    return format_process(ExecResult(code, stdout.encode(), b""), DEFAULT_MAX_OUTPUT_CHARS, 0.0)


def _words(line: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(r"\S+", line)]


def minimal_edit(source: str, old_line: str, new_line: str) -> tuple[str, str]:
    """The shortest ``(old, new)`` turning ``old_line`` of ``source`` into ``new_line``, ``old`` unique.

    The changed span (the lines' common prefix and suffix trimmed) grows to whole words, then one
    word at a time (to the left first: ``b +`` reads as the site, ``+ 4`` as a constant) until
    ``old`` occurs exactly once in ``source``; at worst it is the whole line without indentation.
    """
    if source.count(old_line) != 1:
        raise ValueError(f"minimal_edit: the line {old_line!r} must occur once in the file")
    prefix = 0
    while prefix < min(len(old_line), len(new_line)) and old_line[prefix] == new_line[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(old_line), len(new_line)) - prefix and old_line[-1 - suffix] == new_line[-1 - suffix]:
        suffix += 1
    words = _words(old_line)
    # The words the change touches (an insertion touches the word it lands in or beside).
    touched = [i for i, (a, b) in enumerate(words) if a <= len(old_line) - suffix and b >= prefix]
    lo, hi = touched[0], touched[-1]
    while True:
        start, end = words[lo][0], words[hi][1]
        old = old_line[start:end]
        if source.count(old) == 1 or (lo == 0 and hi == len(words) - 1):
            new = new_line[start : len(new_line) - (len(old_line) - end)]
            return old, new
        if lo > 0:
            lo -= 1
        else:
            hi += 1


def demonstration(task: Task, rng: random.Random, *, retry: bool = False) -> tuple[Conversation, bool]:
    """One conversation for ``task`` and whether it ends on the right fix.

    Blind (the default): one plausible fix drawn at random, then ``submit`` unchecked. With
    ``retry``: the plausible fixes in a random order, each checked with ``run_tests``, until the
    check passes (the episode reinforcement learning is meant to find; always right).
    """
    edit = task.gold["edit"]
    path, old = edit["path"], edit["old"]
    source = task.files[path]
    line = source[: source.index(old)].count("\n") + 1
    conversation = initial_messages(task)  # what an episode starts from

    def call(name: str, arguments: dict[str, Any], output: str) -> None:
        conversation.append({"role": "assistant", "content": format_tool_call(name, arguments)})
        conversation.append({"role": "tool", "name": name, "content": output})

    call("run_tests", {}, run_tests_output(task, source))
    call("read_file", {"path": path}, truncate_middle(source, DEFAULT_MAX_OUTPUT_CHARS))
    fixes = (
        rng.sample(task.metadata["fixes"], len(task.metadata["fixes"]))
        if retry
        else [rng.choice(task.metadata["fixes"])]
    )
    current = old
    for new in fixes:
        text = source.replace(old, current, 1)
        small_old, small_new = minimal_edit(text, current, new)
        call("replace", {"path": path, "old": small_old, "new": small_new}, replaced_message(path, line))
        current = new
        if retry:
            call("run_tests", {}, run_tests_output(task, source.replace(old, new, 1)))
            if new == edit["new"]:
                break
    conversation.append({"role": "assistant", "content": format_tool_call("submit")})
    return conversation, current == edit["new"]


def demonstrations(tasks: list[Task], *, seed: int = 0, retry_fraction: float = 0.0) -> list[Conversation]:
    """A conversation per task (:func:`demonstration`): ``retry_fraction`` of them check and retry.

    The default (0) is the designed warm start; a higher fraction is the control that shows what
    imitation reaches when the demonstrations do verify."""
    if not 0.0 <= retry_fraction <= 1.0:
        raise ValueError(f"demonstrations(retry_fraction=): expected a fraction in [0, 1], got {retry_fraction!r}")
    rng = random.Random(f"{NAME}/demos/{seed}")
    return [demonstration(task, rng, retry=rng.random() < retry_fraction)[0] for task in tasks]


@register_demonstrations(NAME, OPTIONS)
def repair_gen_demonstrations(opts: Mapping[str, Any]) -> list[Conversation]:
    """``num_tasks`` training tasks (default 2000) as :func:`demonstrations` (``seed``, ``retry_fraction``)."""
    tasks = generate_split("train", int(opts["num_tasks"]))
    return demonstrations(tasks, seed=int(opts["seed"]), retry_fraction=float(opts["retry_fraction"]))
