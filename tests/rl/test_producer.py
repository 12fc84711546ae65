"""RolloutProducer: with max_staleness=1 step u+1 starts while step u is still in flight (the overlap that
lets slots freed by u's finished episodes serve u+1 at once), steps are handed over in order, each with
its policy version, and a failure reaches the learner."""

from __future__ import annotations

import threading

import pytest
from flax import nnx

from rl.rollout.episode_driver import RolloutHandle, RolloutResult
from rl.rollout.producer import Produced, RolloutProducer


class ManualRollout:
    """Rollouts that finish only when the test says so."""

    def __init__(self):
        self.started: list[tuple[int, int, object]] = []  # (step, version, weights)
        self.handles: dict[int, RolloutHandle] = {}
        self.release: set[int] = set()
        self.lock = threading.Lock()

    def start(self, tasks, *, step, weights=None, policy_version=None, **_):
        with self.lock:
            self.started.append((step, policy_version, weights))
            self.handles[step] = RolloutHandle()
        return self.handles[step]

    def advance(self, timeout=None):
        with self.lock:
            for step in list(self.release):
                self.handles[step].result = RolloutResult([], [], {"step": step})
                self.release.discard(step)
        threading.Event().wait(0.01)

    def finish(self, step: int) -> None:
        with self.lock:
            self.release.add(step)


def _wait(predicate, what: str) -> None:
    for _ in range(500):
        if predicate():
            return
        threading.Event().wait(0.01)
    pytest.fail(f"timed out waiting for {what}")


def _producer(rollout, staleness, finish=None):
    model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    finish = finish or (lambda step, tasks, result: Produced(step, tasks, result))
    return RolloutProducer(
        rollout, lambda step: [f"task-{step}"], finish, model, staleness=staleness, rl_start=0, first=1, last=4
    )


def test_staleness_one_starts_the_next_step_while_this_one_is_in_flight():
    rollout = ManualRollout()
    producer = _producer(rollout, staleness=1)
    producer.start()
    try:
        producer.publish(0)
        # version(1) = version(2) = 0: both start at once, step 1 not finished.
        _wait(lambda: [s for s, _, _ in rollout.started] == [1, 2], "steps 1 and 2 to start")
        assert [v for _, v, _ in rollout.started] == [0, 0]
        rollout.finish(2)  # a younger step finishing first is held back: steps are handed over in order
        threading.Event().wait(0.1)
        assert 2 not in producer._ready
        rollout.finish(1)
        assert producer.take(1).tasks == ["task-1"] and producer.take(2).tasks == ["task-2"]
        producer.publish(1)  # learner updated on step 1: step 3 (version 1) starts with step 2's weights gone
        _wait(lambda: len(rollout.started) == 3, "step 3 to start")
        assert rollout.started[2][:2] == (3, 1) and rollout.started[2][2] is not None
        producer.publish(2)
        _wait(lambda: len(rollout.started) == 4, "step 4 to start while step 3 is in flight")
        assert rollout.started[3][:2] == (4, 2) and not rollout.handles[3].done
    finally:
        producer.stop()


def test_staleness_zero_waits_for_each_update():
    rollout = ManualRollout()
    producer = _producer(rollout, staleness=0)
    producer.start()
    try:
        producer.publish(0)
        _wait(lambda: len(rollout.started) == 1, "step 1 to start")
        rollout.finish(1)
        producer.take(1)
        threading.Event().wait(0.1)
        assert len(rollout.started) == 1  # step 2 needs update 1
        assert rollout.started[0][2] is None  # on-policy: the live model, no copy
        producer.publish(1)
        _wait(lambda: len(rollout.started) == 2, "step 2 to start")
    finally:
        producer.stop()


def test_a_failure_reaches_the_learner():
    rollout = ManualRollout()

    def broken(step, tasks, result):
        raise RuntimeError("finish failed")

    producer = _producer(rollout, staleness=1, finish=broken)
    producer.start()
    try:
        producer.publish(0)
        _wait(lambda: len(rollout.started) == 2, "steps to start")
        rollout.finish(1)
        with pytest.raises(RuntimeError, match="finish failed"):
            producer.take(1)
    finally:
        producer.stop()
