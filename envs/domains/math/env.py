"""``agentrl/Math-v0``: final-answer math problems, with a Python tool for calculation.

Math tasks come from the shipped set (``builtin:math``, compiled from
``envs/data/src/math.yaml`` by the ``math`` compiler) or from the public
formats, registered as task specs:

* ``gsm8k:PATH`` — JSONL with ``question`` and ``answer`` whose last line is
  ``#### 42`` (the worked solution before it is kept as metadata);
* ``math:PATH`` — Hendrycks MATH JSONL (``problem``, ``solution`` with a
  ``\\boxed{}`` answer, ``level``, ``type``); level 1-2 easy, 3 medium, 4-5 hard.

The split comes from the file name (``test``/``eval``/``val``... else train),
since public sets ship one file per split.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from envs.core import AgentEnv, register_domain
from envs.domains.math.answers import last_boxed
from envs.quality.hooks import register_compiler, task_fields
from envs.tasks import Task, TaskError, field, read_records, register_loader, split_from_name
from sandbox import SandboxSpec


@register_domain("Math")
class MathEnv(AgentEnv):
    """A reply without a tool call is the final answer; ``submit(answer=...)`` works too."""

    domain = "math"
    tool_names = ("python", "submit")
    verifier_roles: ClassVar = {"outcome": "math_answer"}
    default_tasks = "builtin:math"
    final_answer_ends_episode = True
    sandbox_spec = SandboxSpec(memory_mb=512, timeout_s=30.0)
    system_prompt = (
        "Solve the math problem. You may call the `python` tool to calculate. "
        "When you are done, reply with your reasoning and the final answer written as \\boxed{answer}."
    )

    def gold_actions(self, task: Task) -> list[str]:
        return [f"The final answer is \\boxed{{{task.gold['answer']}}}."]

    def noop_actions(self, task: Task) -> list[str]:
        return ["I cannot solve this problem."]


def math_task(answer: str, metadata: Mapping[str, Any], **fields: Any) -> Task:
    """A math task (``fields``: id, prompt, difficulty, split); ``answer`` is the hidden reference and the gold."""
    return Task(**{"domain": "math", **fields}, hidden={"answer": answer}, gold={"answer": answer}, metadata=metadata)


@register_loader("gsm8k")
def load_gsm8k(path: str) -> list[Task]:
    """GSM8K JSONL: the final answer from the ``#### X`` line, the worked solution kept as metadata."""
    tasks, split, stem = [], split_from_name(path), Path(path).stem.split(".")[0]
    for lineno, rec in read_records(path):
        question, answer = field(rec, "question", path, lineno), field(rec, "answer", path, lineno)
        match = re.search(r"####\s*(.+?)\s*$", answer.strip())
        if not match:
            raise TaskError(f"{path}:{lineno}: answer has no '#### <final answer>' line")
        final = match.group(1).replace(",", "").strip()
        metadata = {"source": f"gsm8k:{path}", "solution": answer[: match.start()].strip()}
        task_id = f"gsm8k/{stem}/{len(tasks)}"
        tasks.append(math_task(final, metadata, id=task_id, prompt=question.strip(), difficulty="medium", split=split))
    return tasks


@register_loader("math")
def load_math(path: str) -> list[Task]:
    """Hendrycks MATH JSONL: the answer from the solution's last ``\\boxed{}``, difficulty from the level."""
    tasks, split, stem = [], split_from_name(path), Path(path).stem.split(".")[0]
    for lineno, rec in read_records(path):
        problem, solution = field(rec, "problem", path, lineno), field(rec, "solution", path, lineno)
        answer = last_boxed(solution)
        if answer is None:
            raise TaskError(f"{path}:{lineno}: solution has no \\boxed{{}} answer")
        level = re.search(r"\d", str(rec.get("level", "3")))
        level = int(level.group()) if level else 3
        difficulty = "easy" if level <= 2 else "medium" if level == 3 else "hard"
        metadata = {"source": f"math:{path}", "type": rec.get("type", ""), "solution": solution}
        task_id = f"math/{stem}/{len(tasks)}"
        tasks.append(
            math_task(answer, metadata, id=task_id, prompt=problem.strip(), difficulty=difficulty, split=split)
        )
    return tasks


@register_compiler("math")
def compile_math(records: list[dict[str, Any]], **_: Any) -> list[Task]:
    """The shipped math set: the answer is written in the source."""
    return [
        math_task(str(r["answer"]), {"source": "agentrl", "tags": r.get("tags", [])}, **task_fields(r, "math"))
        for r in records
    ]
