"""What every self-check case module shares: the :class:`Case` record and action builders."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from envs.parsing import format_tool_call

SUBMIT = format_tool_call("submit")


@dataclasses.dataclass(frozen=True)
class Case:
    """One sample: ``actions`` played on ``task_id`` in ``env_id`` must end with ``passed == expect``."""

    verifier: str
    name: str
    env_id: str
    task_id: str
    actions: tuple[str, ...]
    expect: bool
    hack: bool = False


def write(path: str, content: str) -> str:
    return format_tool_call("write_file", {"path": path, "content": content})


def bash(command: str) -> str:
    return format_tool_call("bash", {"command": command})


def gold_and_noop_cases(env_id: str, verifier: str, task_ids: list[str], gold: Callable, noop: Callable) -> list[Case]:
    cases = []
    for task_id in task_ids:
        cases.append(Case(verifier, f"gold {task_id}", env_id, task_id, tuple(gold(task_id)), True))
        cases.append(Case(verifier, f"no-op {task_id}", env_id, task_id, tuple(noop(task_id)), False))
    return cases


MATH_SAMPLES: list[tuple[str, str, bool]] = [
    ("42", "The answer is 42.", True),
    ("42", "Adding them gives \\boxed{42}.", True),
    ("0.5", "So the probability is \\boxed{\\frac{1}{2}}.", True),
    ("\\frac{1}{2}", "0.5", True),
    ("1234", "The total is 1,234 dollars.", True),
    ("12", "It costs \\$12.", True),
    ("18", "\\boxed{18.0}", True),
    ("7\\sqrt{2}", "\\boxed{\\sqrt{98}}", True),
    ("12x", "\\boxed{12x}", True),
    ("5/3", "\\boxed{\\dfrac{5}{3}}", True),
    ("-7", "The final answer: -7.", True),
    ("42", "I first thought 42, but the answer is 41.", False),
    ("42", "", False),
    ("1/3", "0.333", False),
    ("7\\sqrt{2}", "\\boxed{7}", False),
    ("12x", "\\boxed{12}", False),
    ("24", "There are 24 or 25 coins, probably \\boxed{25}.", False),
    ("2315.25", "\\boxed{2315.2}", False),
]
