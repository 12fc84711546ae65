"""Pass-rate tracking and difficulty-weighted sampling."""

from __future__ import annotations

import json

import pytest

from envs.quality.difficulty import DifficultySampler, PassRateTracker
from envs.tasks import Task

TASKS = [Task(id=f"d/{name}", domain="math", prompt=name) for name in ("easy", "hard", "middle", "unseen")]


def trained_tracker() -> PassRateTracker:
    tracker = PassRateTracker(decay=0.5)
    for _ in range(10):
        tracker.update("d/easy", True)
        tracker.update("d/hard", False)
    for passed in (True, False, True, False, True, False):
        tracker.update("d/middle", passed)
    return tracker


def test_running_rates():
    tracker = trained_tracker()
    assert tracker.rate("d/easy") == pytest.approx(1.0) and tracker.rate("d/hard") == 0.0
    assert 0.3 < tracker.rate("d/middle") < 0.7 and tracker.rate("d/unseen") == 0.5
    assert tracker.attempts("d/middle") == 6 and tracker.attempts("d/unseen") == 0
    assert tracker.summary() == {"tracked": 3, "never": 1, "always": 1, "informative": 1}
    assert not tracker.observe("d/easy", {"passed": False, "anomaly": "sandbox_vanished: x"})
    assert tracker.attempts("d/easy") == 10  # an anomaly says nothing about the task
    assert tracker.observe("d/easy", {"passed": False, "anomaly": None}) and tracker.rate("d/easy") == 0.5
    with pytest.raises(ValueError, match="passed="):
        tracker.update("d/easy", 1.5)
    with pytest.raises(ValueError, match="decay="):
        PassRateTracker(decay=1.0)


def test_sampler_prefers_the_informative_middle():
    sampler = DifficultySampler(TASKS, trained_tracker(), floor=0.05, seed=0)
    weights = dict(zip([t.id for t in TASKS], sampler.weights(), strict=True))
    assert weights["d/unseen"] > weights["d/easy"] and weights["d/middle"] > 10 * weights["d/hard"]
    assert weights["d/easy"] == pytest.approx(weights["d/hard"]) and sum(weights.values()) == pytest.approx(1.0)
    drawn = [t.id for t in sampler.sample(2000)]
    assert drawn.count("d/middle") > 10 * drawn.count("d/easy") > 0  # saturated tasks are still revisited


def test_sampler_state_round_trips_through_json():
    sampler = DifficultySampler(TASKS, trained_tracker(), seed=1)
    sampler.sample(3)
    state = json.loads(json.dumps(sampler.state_dict()))
    upcoming = [t.id for t in sampler.sample(20)]
    restored = DifficultySampler(TASKS, PassRateTracker(), seed=99)
    restored.load_state_dict(state)
    assert [t.id for t in restored.sample(20)] == upcoming
    with pytest.raises(ValueError, match="floor="):
        DifficultySampler(TASKS, PassRateTracker(), floor=0)
    with pytest.raises(ValueError, match="the pool is empty"):
        DifficultySampler([], PassRateTracker())
