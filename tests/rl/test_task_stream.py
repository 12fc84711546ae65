"""The training task stream: seeded, weighted, endless, and its iterator checkpointable (bit-exact resume)."""

from __future__ import annotations

import collections
import dataclasses

from rl.rollout.task_stream import TaskCatalog, task_stream


@dataclasses.dataclass(frozen=True)
class Pool:
    source: str
    weight: float = 1.0
    split: str | None = None


def test_weighted_mixing_is_seeded_endless_and_checkpointable():
    pools = {"math": Pool("builtin:math", 3.0, "train"), "shell": Pool("builtin:shell", 1.0, "train")}
    catalog = TaskCatalog()
    mix = task_stream(pools, catalog, seed=3)
    first = [mix[i].id for i in range(400)]
    assert first == [t.id for t in (task_stream(pools, TaskCatalog(), seed=3)[i] for i in range(400))]
    counts = collections.Counter(tid.split("/")[0] for tid in first)
    assert counts["math"] == 300 and counts["shell"] == 100
    assert all(mix[i].split == "train" for i in range(50))
    iterator = iter(mix.to_iter_dataset())
    [next(iterator) for _ in range(5)]
    state = iterator.get_state()
    upcoming = [next(iterator).id for _ in range(5)]
    iterator.set_state(state)
    assert [next(iterator).id for _ in range(5)] == upcoming
    assert [t.id for t in (task_stream(pools, catalog, seed=4)[i] for i in range(50))] != first[:50]
