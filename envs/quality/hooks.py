"""What a domain plugs into the task-quality tools: its self-check samples and its task compiler.

A domain package registers, next to its environment and verifiers:

* self-check samples, with :func:`register_selfcheck`: a function returning
  :class:`Case` s (scripted agents played through the domain's environment,
  reward hacks among them) and :class:`Sample` s (a verifier judged directly on
  a task and an episode). ``python -m envs.quality.selfcheck`` runs them all.
  The function raises :class:`Unavailable` when its samples cannot run here
  (a missing optional package), and is then skipped with that reason.
* a task compiler, with :func:`register_compiler`: it turns the records of
  ``envs/data/src/<name>.yaml`` into tasks, written to ``envs/data/<name>.jsonl``
  by ``python -m envs.quality.authoring build``.

The registries live here, in a module no command-line tool runs as
``__main__``, so every process sees one registry whichever tool it started.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from envs.episode import Episode
from envs.parsing import format_tool_call
from envs.tasks import Task, TaskError

SUBMIT = format_tool_call("submit")
Replies = tuple[str, ...] | Callable[[Any, Task], Sequence[str]]


@dataclasses.dataclass(frozen=True)
class Case:
    """A scripted agent: ``actions`` played on ``task_id`` in ``env_id`` must end with ``passed == expect``.

    ``actions`` are the replies, or a function of the environment and the task
    that returns them (the gold and no-op cases of :func:`gold_and_noop`).
    """

    verifier: str
    name: str
    env_id: str
    task_id: str
    actions: Replies
    expect: bool
    hack: bool = False

    def replies(self, env: Any, task: Task) -> list[str]:
        return list(self.actions(env, task) if callable(self.actions) else self.actions)


@dataclasses.dataclass(frozen=True)
class Sample:
    """A verifier judged directly: on ``task`` and ``episode``, with ``files`` in a fresh sandbox if given.

    ``expect`` is the verdict's ``passed`` (a bool) or its exact reward (a float).
    """

    verifier: str
    name: str
    task: Task
    episode: Episode | None = None
    expect: bool | float = True
    max_turns: int = 1
    files: Mapping[str, str] | None = None


class Unavailable(Exception):
    """A domain's self-check cannot run in this installation; the message says why (and how to fix it)."""


@dataclasses.dataclass(frozen=True)
class Mutant:
    """A plausible wrong end state: played through the task's environment it must score 0.

    ``actions`` are the agent's replies that reach it from the task's start state (the
    validator submits if they leave the episode open). Authored near misses live in the
    task data, in ``gold[NEAR_MISSES]``, as ``{"name", "why"}`` plus a solution of the
    gold's own kind (a ``script``, a ``patch``, ``files``) that the environment turns into
    actions as it does the gold; generated ones come from registered mutators, usually the
    gold's actions and then one wrong step more.
    """

    name: str
    why: str
    actions: tuple[str, ...]


NEAR_MISSES = "near_misses"
Mutator = Callable[[Any, Task], Iterable[Mutant]]
MUTATORS: dict[str, tuple[Mutator, tuple[str, ...] | None]] = {}

SelfCheck = Callable[[], Iterable[Case | Sample]]
SELF_CHECKS: dict[str, SelfCheck] = {}
Compiler = Callable[..., list[Task]]
COMPILERS: dict[str, Compiler] = {}


def _registrar(table: dict[str, Any], what: str, name: str) -> Callable[[Any], Any]:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register_{what}(name=): expected an identifier, got {name!r}")

    def wrap(fn: Any) -> Any:
        if not callable(fn):
            raise TypeError(f"register_{what}({name!r}): expected a function, got {fn!r}")
        known = table.get(name)
        if known is not None and _where(known) != _where(fn):  # the same function again (a reload) replaces it
            raise ValueError(f"register_{what}: {name!r} is already registered to {_where(known)}")
        table[name] = fn
        return fn

    return wrap


def _where(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"


def register_selfcheck(name: str) -> Callable[[SelfCheck], SelfCheck]:
    """Decorator: ``fn() -> [Case | Sample, ...]`` becomes the self-check set ``name`` (a domain's name)."""
    return _registrar(SELF_CHECKS, "selfcheck", name)


def register_compiler(name: str) -> Callable[[Compiler], Compiler]:
    """Decorator: ``fn(records, *, backend) -> [Task, ...]`` compiles ``envs/data/src/<name>.yaml``."""
    return _registrar(COMPILERS, "compiler", name)


def register_mutator(name: str, *, domains: Sequence[str] | None = None) -> Callable[[Mutator], Mutator]:
    """Decorator: ``fn(env, task) -> [Mutant, ...]`` generates wrong end states for tasks of ``domains`` (all if None).

    A mutator yields nothing for a task it does not apply to. Every mutant of every task
    must score 0 (``python -m envs.quality.validate`` rejects a task that pays one).
    """
    if domains is not None and (isinstance(domains, str) or not all(isinstance(d, str) and d for d in domains)):
        raise ValueError(f"register_mutator({name!r}, domains=): expected a list of domain names, got {domains!r}")
    scope = None if domains is None else tuple(domains)

    def wrap(fn: Mutator) -> Mutator:
        table: dict[str, Any] = {k: v[0] for k, v in MUTATORS.items()}
        _registrar(table, "mutator", name)(fn)
        MUTATORS[name] = (fn, scope)
        return fn

    return wrap


def mutators_for(domain: str) -> list[tuple[str, Mutator]]:
    """The registered mutators that apply to ``domain``'s tasks, by name."""
    return [(name, fn) for name, (fn, scope) in sorted(MUTATORS.items()) if scope is None or domain in scope]


def task_fields(record: Mapping[str, Any], domain: str) -> dict[str, Any]:
    """The fields every compiled task takes from its source record as written (id, prompt, difficulty, split)."""
    missing = [k for k in ("id", "prompt", "difficulty", "split") if k not in record]
    if missing:
        raise TaskError(f"{domain} source {record.get('id')!r}: missing {missing}")
    return {
        "id": record["id"],
        "domain": domain,
        "prompt": record["prompt"],
        "difficulty": record["difficulty"],
        "split": record["split"],
    }


# -- the actions scripted agents send --------------------------------------------------------------------
def write(path: str, content: str) -> str:
    return format_tool_call("write_file", {"path": path, "content": content})


def bash(command: str) -> str:
    return format_tool_call("bash", {"command": command})


def leave_running(name: str, source: str) -> list[str]:
    """Actions that write ``source`` to /tmp and start it in the background, detached, as the agent would."""
    path = f"/tmp/.{name}.py"
    return [write(path, source), bash(f"nohup python3 {path} >/dev/null 2>&1 &\nsleep 0.3")]


def gold_and_noop(verifier: str, env_id: str, task_ids: Iterable[str]) -> list[Case]:
    """Per task: its gold solution must pass and a no-op must fail, played through ``env_id``."""
    cases = []
    for task_id in task_ids:
        cases.append(Case(verifier, f"gold {task_id}", env_id, task_id, lambda env, task: env.gold_actions(task), True))
        cases.append(
            Case(verifier, f"no-op {task_id}", env_id, task_id, lambda env, task: env.noop_actions(task), False)
        )
    return cases
