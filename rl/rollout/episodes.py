"""From one rollout's episodes to what the loop records and trains on: advantages, a batch, metrics.

An anomalous episode (the environment failed, not the policy) is excluded from
its group's statistics and from the loss; a group left with too few valid
episodes for its estimator is dropped; with dynamic sampling, groups whose valid
rewards are all equal (no learning signal) are dropped too. Everything that is
dropped is counted, per cause, in the metrics. The estimators themselves are
array functions in :mod:`rl.learning.advantages`; this module only lays the
episodes out as a ``[G, K]`` table and writes the results back.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from rl.learning.advantages import group_advantages
from rl.learning.batch import DEFAULT_LENGTH_BUCKETS, TrainBatch, pack
from rl.rollout.trajectory import EpisodeRecord


def assign_advantages(
    episodes: Sequence[EpisodeRecord], *, estimator: str = "grpo", dynamic_sampling: bool = False
) -> dict[str, float]:
    """Sets ``advantage`` and ``trained`` on every episode; returns counting metrics.

    ``estimator`` names an entry of :data:`rl.learning.advantages.ESTIMATORS`.
    """
    groups: dict[int, list[EpisodeRecord]] = collections.defaultdict(list)
    for e in episodes:
        groups[e.group].append(e)
    k = max(len(g) for g in groups.values())
    order = sorted(groups)
    rewards = np.zeros((len(order), k), np.float32)
    valid = np.zeros((len(order), k), bool)
    for row, g in enumerate(order):
        for col, e in enumerate(groups[g]):
            rewards[row, col] = e.reward
            valid[row, col] = e.anomaly is None
    result = group_advantages(rewards, valid, estimator=estimator, dynamic_sampling=dynamic_sampling)
    enough, informative = result.enough, result.informative
    for row, g in enumerate(order):
        for col, e in enumerate(groups[g]):
            e.advantage = float(result.advantages[row, col])
            e.trained = bool(result.kept[row] and valid[row, col] and e.sampled_tokens > 0)
    return {
        "rollout/groups": float(len(order)),
        "rollout/groups_dropped_few_valid": float((~enough).sum()),
        "rollout/groups_dropped_uninformative": float((enough & ~informative).sum()) if dynamic_sampling else 0.0,
        "rollout/groups_all_equal": float((enough & ~informative).sum()),
        "rollout/episodes_trained": float(sum(e.trained for e in episodes)),
    }


def rollout_metrics(episodes: Sequence[EpisodeRecord], prefix: str = "rollout") -> dict[str, float]:
    """Reward, pass rate, anomaly rate, turns and tokens; overall and per domain."""
    out: dict[str, float] = {}
    valid = [e for e in episodes if e.anomaly is None]
    out[f"{prefix}/episodes"] = float(len(episodes))
    out[f"{prefix}/anomaly_rate"] = 1.0 - len(valid) / max(1, len(episodes))
    causes = collections.Counter(str(e.anomaly).split(":")[0] for e in episodes if e.anomaly is not None)
    for cause, n in causes.items():
        out[f"{prefix}/anomalies/{cause}"] = float(n)
    by_domain: dict[str, list[EpisodeRecord]] = collections.defaultdict(list)
    for e in valid:
        by_domain[e.domain].append(e)
    for name, group in [("", valid), *((f"{d}/", g) for d, g in sorted(by_domain.items()))]:
        if not group:
            continue
        rewards = np.array([e.reward for e in group])
        out[f"{prefix}/{name}reward_mean"] = float(rewards.mean())
        out[f"{prefix}/{name}reward_std"] = float(rewards.std())
        out[f"{prefix}/{name}pass_rate"] = float(np.mean([e.passed for e in group]))
    if valid:
        out[f"{prefix}/turns_mean"] = float(np.mean([len(e.turns) for e in valid]))
        out[f"{prefix}/tool_calls_mean"] = float(np.mean([len(e.tool_calls) for e in valid]))
        out[f"{prefix}/sampled_tokens_mean"] = float(np.mean([e.sampled_tokens for e in valid]))
    out[f"{prefix}/sampled_tokens"] = float(sum(e.sampled_tokens for e in episodes))
    return out


def pass_at_k(episodes: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Unbiased pass@1 and pass@k per task group (Chen et al., 2021), over valid episodes."""
    groups: dict[tuple[str, int], list[bool]] = collections.defaultdict(list)
    for e in episodes:
        if e.anomaly is None:
            groups[(e.task_id, e.group)].append(e.passed)
    if not groups:
        return {}
    k = max(len(v) for v in groups.values())

    def estimate(n: int, c: int, kk: int) -> float:
        if n - c < kk:
            return 1.0
        return 1.0 - float(np.prod(1.0 - kk / np.arange(n - c + 1, n + 1)))

    p1 = np.mean([estimate(len(v), sum(v), 1) for v in groups.values()])
    pk = np.mean([estimate(len(v), sum(v), min(k, len(v))) for v in groups.values()])
    return {"pass@1": float(p1), f"pass@{k}": float(pk)}


def train_batch(
    episodes: Sequence[EpisodeRecord],
    *,
    pad_id: int,
    batch_multiple: int,
    max_len: int,
    length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
    pack_sequences: bool = False,
) -> TrainBatch | None:
    """Packs the ``trained`` episodes (None if there are none); see :func:`rl.learning.batch.pack`."""
    chosen = [e for e in episodes if e.trained]
    if not chosen:
        return None
    return pack(
        [e.token_ids for e in chosen],
        [e.loss_mask for e in chosen],
        [e.logprobs for e in chosen],
        [e.advantage for e in chosen],
        pad_id=pad_id,
        batch_multiple=batch_multiple,
        max_len=max_len,
        length_buckets=length_buckets,
        pack_sequences=pack_sequences,
    )
