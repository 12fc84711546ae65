"""The near-miss gate: every authored near miss and generated mutant of a task must score 0.

Authored near misses ship in the task data (``gold["near_misses"]``: a ``name``, a ``why``
and a solution of the gold's kind, which the environment's
:meth:`~envs.core.AgentEnv.solution_actions` turns into actions); generated ones come from
the mutators registered for the task's domain (:func:`envs.quality.hooks.mutators_for`;
the generic ones are in :mod:`envs.quality.mutants`). A mutant that gets any reward, or
whose verification is an anomaly, is a problem of the task, named. A domain's environment
says how many authored near misses each of its tasks must ship (``min_near_misses``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import envs.quality.mutants  # noqa: F401 - registers the generic mutators
from envs.quality.hooks import NEAR_MISSES, SUBMIT, Mutant, mutators_for
from envs.tasks import Task


@dataclasses.dataclass
class MutationResult:
    """One task's mutants: how many scored 0 (killed) of how many, and what went wrong."""

    killed: int = 0
    total: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)


def task_mutants(env: Any, task: Task) -> tuple[list[Mutant], list[str]]:
    """The task's authored near misses and generated mutants, and the problems found building them."""
    mutants, problems = [], []
    authored = (task.gold or {}).get(NEAR_MISSES) or []
    needed = getattr(env, "min_near_misses", 0)
    if len(authored) < needed:
        problems.append(f"near misses: {len(authored)} authored, {task.domain} tasks need at least {needed}")
    for i, record in enumerate(authored):
        name = f"near miss {record.get('name', i)!r}"
        solution = {k: v for k, v in record.items() if k not in ("name", "why")}
        try:
            mutants.append(Mutant(name, str(record.get("why", "")), tuple(env.solution_actions(task, solution))))
        except (ValueError, TypeError) as exc:
            problems.append(f"{name}: cannot be played: {exc}")
    for mutator_name, mutator in mutators_for(task.domain):
        try:
            mutants += [dataclasses.replace(m, name=f"mutant {m.name!r}") for m in mutator(env, task)]
        except Exception as exc:  # noqa: BLE001 - a broken mutator is a finding, not a crash of the run
            problems.append(f"mutator {mutator_name!r} failed: {type(exc).__name__}: {exc}")
    return mutants, problems


def check_mutants(env: Any, task: Task, play: Any) -> MutationResult:
    """Plays every mutant of ``task`` through ``env`` (``play(env, task, actions)``); each must score 0."""
    mutants, problems = task_mutants(env, task)
    result = MutationResult(total=len(mutants), problems=problems)
    for mutant in mutants:
        try:
            actions = list(mutant.actions)
            if not actions or actions[-1] != SUBMIT:  # a mutant may leave the episode open: it is submitted as is
                actions.append(SUBMIT)
            verification = play(env, task, actions)
        except Exception as exc:  # noqa: BLE001
            result.problems.append(f"{mutant.name} crashed: {type(exc).__name__}: {exc}")
            continue
        if verification["anomaly"]:
            result.problems.append(f"{mutant.name} verification is an anomaly: {verification['anomaly']}")
        elif verification["reward"] > 0 or verification["passed"]:
            result.problems.append(f"{mutant.name} survives (reward {verification['reward']}): {mutant.why}"[:400])
        else:
            result.killed += 1
    return result


def mutation_scores(reports: list[Any]) -> dict[str, tuple[int, int]]:
    """Per domain, (killed, total) over the reports' mutants."""
    scores: dict[str, tuple[int, int]] = {}
    for r in reports:
        killed, total = scores.get(r.domain, (0, 0))
        scores[r.domain] = (killed + r.mutants_killed, total + r.mutants_total)
    return scores
