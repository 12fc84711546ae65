"""The template domain's tasks: a log file per task (``Task.files``), a level to count in it.

Registered as the loader ``NAME:SEED`` (``template:0``): the task set is generated, so a copy's
tasks are whatever its :func:`make_tasks` makes. (A fixed, hand-written set instead ships as
``envs/data/<name>.jsonl``, ``builtin:<name>``, compiled from ``envs/data/src/<name>.yaml`` by a
registered compiler, as the math and shell domains do.) The prompts share one
template on purpose: what tells tasks apart is in their files, which the leak check compares too.
"""

from __future__ import annotations

import random

from envs import Task
from envs.domains.template.env import NAME
from envs.tasks import register_loader

LEVELS = ("INFO", "WARN", "ERROR")
EVAL_EVERY = 4  # one task in four is held out


def make_tasks(num_tasks: int = 24, *, seed: int = 0, name: str = NAME) -> list[Task]:
    """``num_tasks`` tasks of domain ``name``: a random log file and the count of one level in it."""
    rng = random.Random(f"{name}/{seed}")
    out = []
    for i in range(num_tasks):
        lines = [f"{rng.choice(LEVELS)} request {rng.randrange(10**6)} took {rng.randrange(900)}ms" for _ in range(12)]
        level = rng.choice(LEVELS)
        out.append(
            Task(
                id=f"{name}/{seed}-{i:03d}",
                domain=name,
                prompt=f"How many lines of app.log have the level {level}?",
                files={"app.log": "\n".join(lines) + "\n"},
                hidden={"count": sum(line.startswith(level + " ") for line in lines)},
                gold={"command": f"grep -c '^{level} ' app.log"},
                metadata={"level": level},
                split="eval" if i % EVAL_EVERY == EVAL_EVERY - 1 else "train",
            )
        )
    return out


@register_loader(NAME)
def load(seed: str) -> list[Task]:
    """``NAME:SEED``: the task set of that seed (``NAME:0`` is the one the config trains on)."""
    if not seed.isdigit():
        raise ValueError(f"task spec {NAME}:{seed!r}: expected {NAME}:SEED with an integer SEED")
    return make_tasks(seed=int(seed))
