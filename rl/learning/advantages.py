"""Advantage estimators: a registry from names to functions of a ``[G, K]`` reward table.

A rollout gives ``G`` groups of ``K`` episodes (one group per task); ``valid`` marks
the episodes whose environment worked (an anomaly is not a sample of the policy).
An estimator turns the table into one advantage per episode. Each entry of
:data:`ESTIMATORS` also says how many valid episodes a group needs before it can
train (``min_valid``): a group baseline (GRPO, Dr. GRPO, RLOO) needs two, the
batch baseline (critic-free PPO) one. The config names an estimator with
``algorithm.advantage``; the loop calls :func:`group_advantages`, so a new
estimator is one decorated function, with no special case anywhere else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class Estimator:
    """``fn(rewards [G, K], valid [G, K]) -> advantages [G, K]``; groups with < ``min_valid`` valid episodes drop."""

    fn: Callable[[Array, Array], Array]
    min_valid: int


ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str, *, min_valid: int = 2) -> Callable[[Callable], Callable]:
    """Makes an estimator selectable by ``algorithm.advantage``."""

    def wrap(fn: Callable[[Array, Array], Array]) -> Callable[[Array, Array], Array]:
        if name in ESTIMATORS:
            raise ValueError(f"register_estimator: {name!r} is already registered")
        ESTIMATORS[name] = Estimator(fn, min_valid)
        return fn

    return wrap


def _group_stats(rewards: Array, valid: Array) -> tuple[Array, Array, Array]:
    """Mean / std over the *valid* episodes of each group (anomalies are not samples)."""
    w = valid.astype(rewards.dtype)
    n = w.sum(axis=-1, keepdims=True)
    mean = (rewards * w).sum(axis=-1, keepdims=True) / jnp.maximum(n, 1.0)
    var = (((rewards - mean) ** 2) * w).sum(axis=-1, keepdims=True) / jnp.maximum(n - 1.0, 1.0)
    return mean, jnp.sqrt(var), n


@register_estimator("grpo")
def grpo_advantages(rewards: Array, valid: Array) -> Array:
    """GRPO (Shao et al., 2024): ``(r - mean_group) / std_group`` (unbiased std)."""
    mean, std, n = _group_stats(rewards, valid)
    adv = (rewards - mean) / (std + _EPS)
    return jnp.where(valid & (n >= 2), adv, 0.0)


@register_estimator("dr_grpo")
def dr_grpo_advantages(rewards: Array, valid: Array) -> Array:
    """Dr. GRPO (Liu et al., 2025): ``r - mean_group``; no std division, which biases toward easy/hard groups."""
    mean, _, n = _group_stats(rewards, valid)
    return jnp.where(valid & (n >= 2), rewards - mean, 0.0)


@register_estimator("rloo")
def rloo_advantages(rewards: Array, valid: Array) -> Array:
    """RLOO (Ahmadian et al., 2024): reward minus the mean of the *other* valid episodes."""
    w = valid.astype(rewards.dtype)
    n = w.sum(axis=-1, keepdims=True)
    total = (rewards * w).sum(axis=-1, keepdims=True)
    baseline = (total - rewards) / jnp.maximum(n - 1.0, 1.0)
    return jnp.where(valid & (n >= 2), rewards - baseline, 0.0)


@register_estimator("batch", min_valid=1)
def batch_advantages(rewards: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Reward minus the mean over every valid episode of the batch, over its std (critic-free PPO; ignores groups)."""
    rewards, valid = np.asarray(rewards), np.asarray(valid)
    flat = rewards[valid]
    mean, std = (flat.mean(), flat.std()) if flat.size else (0.0, 1.0)
    return np.where(valid, (rewards - mean) / (std + _EPS), 0.0)


def informative_groups(rewards: Array, valid: Array) -> Array:
    """Groups with >= 2 valid episodes whose rewards are not all equal (dynamic sampling, DAPO)."""
    w = valid.astype(rewards.dtype)
    big = jnp.finfo(rewards.dtype).max
    hi = jnp.where(valid, rewards, -big).max(axis=-1)
    lo = jnp.where(valid, rewards, big).min(axis=-1)
    return (w.sum(axis=-1) >= 2) & (hi - lo > _EPS)


@dataclasses.dataclass(frozen=True)
class GroupAdvantages:
    """Per episode ``advantages`` ``[G, K]``; per group whether it has ``enough`` valid episodes, is
    ``informative`` (rewards differ) and is ``kept`` for training."""

    advantages: np.ndarray
    enough: np.ndarray
    informative: np.ndarray
    kept: np.ndarray


def group_advantages(
    rewards: np.ndarray, valid: np.ndarray, *, estimator: str = "grpo", dynamic_sampling: bool = False
) -> GroupAdvantages:
    """Advantages by the named estimator, and which groups train (with ``dynamic_sampling``, informative ones only)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"algorithm.advantage: expected one of {sorted(ESTIMATORS)}, got {estimator!r}")
    chosen = ESTIMATORS[estimator]
    adv = np.asarray(chosen.fn(rewards, valid))
    enough = valid.sum(-1) >= chosen.min_valid
    informative = np.asarray(informative_groups(rewards, valid))
    kept = enough & (informative if dynamic_sampling else True)
    return GroupAdvantages(adv, enough, informative, kept)
