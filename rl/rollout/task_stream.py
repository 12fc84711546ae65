"""Where a run's tasks come from: each task source loaded once, and the seeded training stream.

A config names task pools by source spec (``builtin:math``, ``arithmetic:train``,
a JSONL path) and split. Checking the config, choosing held-out tasks, giving
each environment a task to be built with, and the training stream all need
those tasks; a :class:`TaskCatalog` loads each ``(source, split)`` the first
time it is asked and hands the same :class:`envs.TaskSource` to everyone after.

:func:`task_stream` mixes the training pools with their weights into an endless
grain dataset. Its iterator's state is saved in every checkpoint, so the
construction below (pool order, shuffle seeds, weights) is part of the
checkpoint format: changing it breaks bit-exact resume of existing runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from envs import TaskSource, load_tasks

if TYPE_CHECKING:
    import grain


class Pool(Protocol):
    """One weighted task pool (:class:`rl.config.settings.PoolSettings`)."""

    source: str
    weight: float
    split: str | None


class TaskCatalog:
    """Task sources by ``(source, split)``, each loaded once (``loader`` defaults to :func:`envs.load_tasks`)."""

    def __init__(self, loader: Callable[..., TaskSource] = load_tasks):
        self._loader = loader
        self._sources: dict[tuple[str, str | None], TaskSource] = {}

    def get(self, source: str, split: str | None = None) -> TaskSource:
        """The tasks of ``source`` (only ``split``'s, if given); loader errors propagate unchanged."""
        key = (source, split)
        if key not in self._sources:
            self._sources[key] = self._loader(source, split=split)
        return self._sources[key]

    def pool(self, pool: Pool) -> TaskSource:
        return self.get(pool.source, pool.split)


def task_stream(pools: Mapping[str, Pool], catalog: TaskCatalog, *, seed: int) -> grain.MapDataset:
    """An endless, seeded, weighted mix of task pools; checkpoint its iterator with the model.

    Each pool (in name order) is shuffled with its own seed and repeated on its own, then
    pools are interleaved in proportion to their weights, so a small pool is revisited
    rather than starved.
    """
    import grain  # deferred: it imports JAX through orbax

    if not pools:
        raise ValueError("task_stream(pools=): expected at least one task pool (config.tasks)")
    datasets, weights = [], []
    for i, (_, pool) in enumerate(sorted(pools.items())):
        datasets.append(grain.MapDataset.source(catalog.pool(pool)).shuffle(seed=seed + 7919 * i).repeat())
        weights.append(float(pool.weight))
    return grain.MapDataset.mix(datasets, weights)
