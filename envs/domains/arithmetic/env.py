"""``agentrl/Arithmetic-v0``: multi-digit arithmetic that needs the ``python`` tool.

The quickstart's domain. A tiny model cannot multiply 3-digit numbers in its
head, but it can learn to *use a tool*: emit a ``python`` call, read the printed
result, and answer with it. Episodes are multi-turn::

    user       347*29
    assistant  <tool_call>{"name": "python", "arguments": {"code": "print(347*29)"}}</tool_call>
    tool       10063 / [exit code: 0]
    assistant  Python printed it, the answer is 10063.   <- the final answer ends the episode

Tasks are generated, not shipped: ``arithmetic:train`` / ``arithmetic:eval``
(optionally ``arithmetic:eval:200``). A problem's split is a hash of the problem
itself, so the eval split can never contain a training problem.

:mod:`envs.domains.arithmetic.demos` registers the SFT warm-start set the
quickstart uses (``demonstrations("arithmetic", options)``).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, ClassVar

from envs.core import AgentEnv, register_domain
from envs.domains.math import answers  # noqa: F401 - registers math_answer, this domain's outcome verifier
from envs.parsing import format_tool_call
from envs.tasks import Task, TaskError, register_loader
from sandbox import SandboxSpec

# name -> (operator, digits of a, digits of b, digits of the result, difficulty). Every problem
# of a form has the same width, so where the digits to copy sit never moves: a tiny model can
# learn to copy them by relative position instead of needing an induction circuit.
FORMS = {
    "sum4": ("+", 4, 4, 5, "easy"),
    "product3x2": ("*", 3, 2, 5, "medium"),
    "product3x3": ("*", 3, 3, 6, "hard"),
}
DEFAULT_FORMS = ("product3x3",)
# How a tool demonstration states its answer. Its length is chosen so that the answer's digits sit
# exactly as many tokens after their copy in the tool output as the tool call's expression sits after
# the prompt's (70 byte tokens in the ChatML rendering): one relative-position attention head then
# serves both copies, and a tiny model learns them together instead of one after the other
# (docs/benchmarks.md, "Figures behind design choices").
ANSWER_PHRASE = "Python printed it, the answer is {answer}."
_DEFAULT_SIZES = {"train": 5000, "eval": 200, "test": 200}
_EVAL_EVERY = 10  # one problem in ten belongs to the held-out splits


def _split_of(expression: str) -> str:
    bucket = int(hashlib.sha256(expression.encode()).hexdigest(), 16) % _EVAL_EVERY
    return "train" if bucket else ("eval" if int(hashlib.md5(expression.encode()).hexdigest(), 16) % 2 else "test")


def arithmetic_tasks(
    split: str = "train", n: int | None = None, *, seed: int = 0, forms: tuple[str, ...] = DEFAULT_FORMS
) -> list[Task]:
    """``n`` distinct problems of ``split`` cycling through ``forms``; the same for the same arguments."""
    if split not in _DEFAULT_SIZES:
        raise TaskError(f"arithmetic tasks: split must be one of {sorted(_DEFAULT_SIZES)}, got {split!r}")
    n = _DEFAULT_SIZES[split] if n is None else n
    if not isinstance(n, int) or n < 1:
        raise TaskError(f"arithmetic tasks: n must be a positive int, got {n!r}")
    unknown = [f for f in forms if f not in FORMS]
    if unknown or not forms:
        raise TaskError(f"arithmetic tasks: forms must be a non-empty subset of {sorted(FORMS)}, got {forms!r}")
    rng = random.Random(f"arithmetic/{seed}/{','.join(forms)}")
    tasks: list[Task] = []
    seen: set[str] = set()
    while len(tasks) < n:
        op, da, db, dr, difficulty = FORMS[forms[len(tasks) % len(forms)]]
        a = rng.randrange(10 ** (da - 1), 10**da)
        b = rng.randrange(10 ** (db - 1), 10**db)
        expression = f"{a}{op}{b}"
        answer = a + b if op == "+" else a * b
        if len(str(answer)) != dr or expression in seen or _split_of(expression) != split:
            continue
        seen.add(expression)
        tasks.append(
            Task(
                id=f"arithmetic/{split}/{len(tasks):05d}",
                domain="arithmetic",
                prompt=expression,
                hidden={"answer": str(answer)},
                gold={"answer": str(answer), "code": f"print({expression})"},
                difficulty=difficulty,
                split=split,
                metadata={"a": a, "b": b, "op": op},
            )
        )
    return tasks


@register_loader("arithmetic")
def load_arithmetic(arg: str) -> list[Task]:
    """``arithmetic:SPLIT[:N][:FORM+FORM...]``, e.g. ``arithmetic:eval:200:sum4+product3x3``."""
    split, _, rest = (arg or "train").partition(":")
    count, _, forms = rest.partition(":")
    if count and not count.isdigit():
        raise TaskError(f"arithmetic:{arg}: expected arithmetic:SPLIT[:N][:FORMS] with N a positive integer")
    chosen = tuple(forms.split("+")) if forms else DEFAULT_FORMS
    return arithmetic_tasks(split or "train", int(count) if count else None, forms=chosen)


@register_domain("Arithmetic")
class ArithmeticEnv(AgentEnv):
    """A reply with a ``python`` call runs it; a reply without one is the final answer."""

    domain = "arithmetic"
    tool_names = ("python",)
    verifier_roles: ClassVar = {"outcome": "math_answer"}
    default_tasks = "arithmetic:train"
    final_answer_ends_episode = True
    hold_sandbox = False  # stateless: a pooled sandbox per tool call, not per episode
    sandbox_spec = SandboxSpec(memory_mb=256, workspace_mb=16, tmp_mb=16, timeout_s=10.0, pids=64)
    system_prompt = ""

    def build_messages(self, task: Task) -> list[dict[str, Any]]:
        # No system turn: the tiny quickstart model reads only the problem.
        return [{"role": "user", "content": task.prompt}]

    def gold_actions(self, task: Task) -> list[str]:
        return [tool_call_reply(task.prompt), ANSWER_PHRASE.format(answer=task.gold["answer"])]

    def noop_actions(self, task: Task) -> list[str]:
        return ["0"]


def tool_call_reply(expression: str) -> str:
    """The assistant reply that asks the ``python`` tool to evaluate ``expression``."""
    return format_tool_call("python", {"code": f"print({expression})"})
