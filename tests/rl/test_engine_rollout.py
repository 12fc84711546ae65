"""rl.rollout.engine_rollout: a failure inside the driver reaches the caller as itself.

Issue 25: when ``engine.add`` raised, failing the rollout released a sequence the engine never held,
and its ``KeyError: unknown sequence`` replaced the real error.
"""

from __future__ import annotations

import itertools

import pytest

from configs import quickstart
from rl.config.settings import load_settings
from rl.rollout.engine_rollout import EngineRollout
from rl.rollout.task_stream import TaskCatalog, task_stream
from rl.run.experiment import build
from tests.sandbox.conftest import backend_or_skip


@pytest.fixture
def experiment(tmp_path):
    backend_or_skip("bwrap")
    catalog = TaskCatalog()
    settings = load_settings(quickstart.get_config("test"), catalog)
    exp = build(settings, tmp_path, catalog, record=False)
    try:
        yield exp
    finally:
        exp.close()


def _tasks(exp, n: int = 2) -> list:
    return list(itertools.islice(iter(task_stream(exp.settings.tasks, exp.catalog, seed=0)), n))


def test_an_engine_add_error_reaches_the_caller_unmasked(experiment, monkeypatch):
    rollout = experiment.rollout
    assert isinstance(rollout, EngineRollout)
    tasks = _tasks(experiment)
    # Control: the same rollout runs to the end when add works.
    assert len(rollout.run(tasks, step=0, group_size=1).episodes) == len(tasks)

    def broken_add(*args, **kwargs):
        raise RuntimeError("engine add exploded on purpose")

    monkeypatch.setattr(rollout.engine, "add", broken_add)
    with pytest.raises(RuntimeError, match="engine add exploded on purpose"):
        rollout.run(tasks, step=1, group_size=1)
    assert rollout.in_flight == 0  # the failed rollout is dropped, not left running
