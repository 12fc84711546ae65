"""From scored episodes to a training batch: group advantages, failure attribution, packing.

An anomalous episode (the environment failed, not the policy) is excluded from
its group's statistics and from the loss; a group left with fewer than two
valid episodes is dropped; with dynamic sampling, groups whose valid rewards
are all equal (no learning signal) are dropped too. Everything that is dropped
is counted, per cause, in the metrics.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np

from rl import losses
from rl.batch import DEFAULT_LENGTH_BUCKETS, TrainBatch, pack
from rl.trajectory import EpisodeRecord

ESTIMATORS = (*losses.ADVANTAGE_ESTIMATORS, "batch")


def assign_advantages(
    episodes: Sequence[EpisodeRecord], *, estimator: str = "grpo", dynamic_sampling: bool = False
) -> dict[str, float]:
    """Sets ``advantage`` and ``trained`` on every episode; returns counting metrics.

    ``estimator`` is a group estimator of :data:`rl.losses.ADVANTAGE_ESTIMATORS`
    or ``"batch"`` (reward minus the batch mean over its std: a critic-free PPO
    baseline that ignores groups).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"algorithm.advantage: expected one of {ESTIMATORS}, got {estimator!r}")
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
    if estimator == "batch":
        flat = rewards[valid]
        mean, std = (flat.mean(), flat.std()) if flat.size else (0.0, 1.0)
        adv = np.where(valid, (rewards - mean) / (std + 1e-6), 0.0)
        enough = valid.sum(-1) >= 1
    else:
        adv = np.asarray(losses.ADVANTAGE_ESTIMATORS[estimator](rewards, valid))
        enough = valid.sum(-1) >= 2
    informative = np.asarray(losses.informative_groups(rewards, valid))
    keep = enough & (informative if dynamic_sampling else True)
    for row, g in enumerate(order):
        for col, e in enumerate(groups[g]):
            e.advantage = float(adv[row, col])
            e.trained = bool(keep[row] and valid[row, col] and e.sampled_tokens > 0)
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
    """Packs the ``trained`` episodes (None if there are none); see :func:`rl.batch.pack`."""
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


def describe_groups(episodes: Sequence[EpisodeRecord]) -> list[dict[str, Any]]:
    """Per task: rewards of its episodes (for logs and the notebook's hardest/easiest table)."""
    groups: dict[tuple[str, int], list[EpisodeRecord]] = collections.defaultdict(list)
    for e in episodes:
        groups[(e.task_id, e.group)].append(e)
    return [
        {
            "task_id": t,
            "group": g,
            "rewards": [e.reward for e in es],
            "anomalies": sum(e.anomaly is not None for e in es),
        }
        for (t, g), es in sorted(groups.items(), key=lambda kv: kv[0][1])
    ]
