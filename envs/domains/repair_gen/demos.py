"""SFT demonstrations for the generated repair domain, registered as ``repair_gen``: right only by luck.

Each demonstration does what a hurried engineer does: run the check, read the module, apply the
first plausible fix that comes to mind for the line at fault (one of the bug family's plausible
fixes, drawn without looking at what the check printed), and submit *without* checking again.
Every task has three plausible fixes (:mod:`.families`), so about a third of the demonstrations
are right, and imitation tops out there: what reinforcement learning can add is the habit of
running the check after the edit and trying another fix when it still fails.

Tool messages are exactly what the tools print (``run_tests`` via :func:`.tasks.report`, the
file as ``read_file`` returns it, ``replace``'s line), so the warm start sees what rollouts show.

    from envs.demonstrations import demonstrations
    conversations = demonstrations("repair_gen", {"num_tasks": 2000, "seed": 0})
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from envs.demonstrations import Conversation, register_demonstrations
from envs.domains.repair_gen.env import RepairGenEnv, replaced_message
from envs.domains.repair_gen.tasks import NAME, generate_split, report
from envs.parsing import format_tool_call
from envs.tasks import Task
from envs.tools import DEFAULT_MAX_OUTPUT_CHARS, format_process, truncate_middle
from sandbox import ExecResult

OPTIONS = {"num_tasks": 2000, "seed": 0}


def run_tests_output(task: Task, source: str) -> str:
    """What ``run_tests`` prints for the module ``source`` of ``task`` (no sandbox needed)."""
    stdout, code = report(source, [tuple(c) for c in task.metadata["visible_cases"]])
    return format_process(ExecResult(code, stdout.encode(), b""), DEFAULT_MAX_OUTPUT_CHARS, 0.0)


def demonstration(task: Task, rng: random.Random) -> tuple[Conversation, bool]:
    """One blind-fix conversation for ``task``, and whether its fix is the right one."""
    path, old = task.gold["edit"]["path"], task.gold["edit"]["old"]
    source = task.files[path]
    new = rng.choice(task.metadata["fixes"])
    line = source[: source.index(old)].count("\n") + 1
    env = RepairGenEnv
    conversation = [
        {"role": "system", "content": env.system_prompt},
        {"role": "user", "content": task.prompt},
        {"role": "assistant", "content": format_tool_call("run_tests")},
        {"role": "tool", "name": "run_tests", "content": run_tests_output(task, source)},
        {"role": "assistant", "content": format_tool_call("read_file", {"path": path})},
        {"role": "tool", "name": "read_file", "content": truncate_middle(source, DEFAULT_MAX_OUTPUT_CHARS)},
        {"role": "assistant", "content": format_tool_call("replace", {"path": path, "old": old, "new": new})},
        {"role": "tool", "name": "replace", "content": replaced_message(path, line)},
        {"role": "assistant", "content": format_tool_call("submit")},
    ]
    return conversation, new == task.gold["edit"]["new"]


def demonstrations(tasks: list[Task], *, seed: int = 0) -> list[Conversation]:
    """A blind-fix conversation per task (:func:`demonstration`), the fix drawn from ``seed``."""
    rng = random.Random(f"{NAME}/demos/{seed}")
    return [demonstration(task, rng)[0] for task in tasks]


@register_demonstrations(NAME, OPTIONS)
def repair_gen_demonstrations(opts: Mapping[str, Any]) -> list[Conversation]:
    """``num_tasks`` training tasks (default 2000) as :func:`demonstrations` (``seed``)."""
    return demonstrations(generate_split("train", int(opts["num_tasks"])), seed=int(opts["seed"]))
