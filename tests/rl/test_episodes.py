"""A rollout's episodes into advantages, a training batch and metrics: failure attribution (fast, in-process)."""

from __future__ import annotations

import numpy as np
import pytest

from rl.rollout.episodes import assign_advantages, pass_at_k, rollout_metrics, train_batch
from rl.rollout.trajectory import EpisodeRecord


def _episode(group: int, index: int, reward: float, anomaly: str | None = None, tokens: int = 3) -> EpisodeRecord:
    e = EpisodeRecord(step=1, task_id=f"t{group}", domain="arithmetic", group=group, index=index, seed=0)
    e.append([1, 2], sampled=False)
    e.append(list(range(3, 3 + tokens)), sampled=True, logprobs=[-0.5] * tokens)
    e.verification = {"reward": reward, "passed": reward > 0.5, "anomaly": anomaly}
    return e


def test_anomalies_are_excluded_and_small_groups_dropped():
    episodes = [
        _episode(0, 0, 1.0),
        _episode(0, 1, 0.0),
        _episode(0, 2, 0.0, anomaly="sandbox_vanished"),
        _episode(1, 0, 1.0),
        _episode(1, 1, 0.0, anomaly="reset_failed:daemon_unreachable"),
    ]
    metrics = assign_advantages(episodes, estimator="grpo")
    assert [e.trained for e in episodes] == [True, True, False, False, False]
    # group 0's statistics use only its two valid episodes: mean 0.5, std sqrt(0.5)
    np.testing.assert_allclose(
        [episodes[0].advantage, episodes[1].advantage], [0.5 / np.sqrt(0.5), -0.5 / np.sqrt(0.5)], rtol=1e-5
    )
    assert metrics["rollout/groups_dropped_few_valid"] == 1.0
    m = rollout_metrics(episodes)
    assert m["rollout/anomaly_rate"] == pytest.approx(2 / 5)
    assert m["rollout/anomalies/sandbox_vanished"] == 1.0 and m["rollout/anomalies/reset_failed"] == 1.0
    assert m["rollout/reward_mean"] == pytest.approx(2 / 3)  # anomalies are not scored as 0


def test_dynamic_sampling_drops_groups_with_equal_rewards():
    episodes = [_episode(0, i, 1.0) for i in range(3)] + [_episode(1, 0, 1.0), _episode(1, 1, 0.0)]
    assign_advantages(episodes, estimator="grpo", dynamic_sampling=True)
    assert [e.trained for e in episodes] == [False, False, False, True, True]


def test_train_batch_packs_only_trained_episodes():
    episodes = [_episode(0, 0, 1.0, tokens=5), _episode(0, 1, 0.0, tokens=2), _episode(1, 0, 1.0, anomaly="x")]
    assign_advantages(episodes)
    batch = train_batch(episodes, pad_id=0, batch_multiple=4, max_len=64)
    assert batch.tokens.shape[0] == 4 and batch.weights.tolist() == [1, 1, 0, 0]
    assert batch.loss_mask[0].sum() == 5 and batch.loss_mask[1].sum() == 2


def test_pass_at_k_unbiased_estimator():
    eps = [_episode(0, i, r) for i, r in enumerate([1.0, 0.0, 0.0, 0.0])]
    out = pass_at_k(eps)
    assert out["pass@1"] == pytest.approx(0.25) and out["pass@4"] == pytest.approx(1.0)


def test_batch_estimator_trains_groups_of_one():
    episodes = [_episode(0, 0, 1.0), _episode(1, 0, 0.0), _episode(2, 0, 1.0, anomaly="x")]
    metrics = assign_advantages(episodes, estimator="batch")
    assert [e.trained for e in episodes] == [True, True, False]
    assert episodes[0].advantage > 0 > episodes[1].advantage and metrics["rollout/groups_dropped_few_valid"] == 1.0
