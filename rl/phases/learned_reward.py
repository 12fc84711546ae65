"""A learned reward in an RL run: the saved judge, checked, normalized, clipped and injected as ``learned``.

    config.learned_reward = common.learned_reward("runs/reward_model", min_accuracy=0.75, clip=3.0)
    config.rollout.env_kwargs = {"arithmetic": {"verifier": {"outcome": 1.0, "learned": 0.2}}}

Before step 1 (:func:`install_judge`, called when the run is built) the reward model saved by a
``config.reward_model`` run (:mod:`rl.phases.reward_model`) is loaded and **checked**: its pair
accuracy on its own held-out pairs is measured again, and a judge below
``learned_reward.min_accuracy`` refuses the run (a :class:`~rl.config.settings.ConfigError` naming the
field, the measured accuracy and the threshold). A judge that passes is registered as the scorer of
the ``learned`` verifier (:mod:`envs.verifiers.learned`), which the rollout's verifier configs weigh
against the outcome like any other component.

A score (:class:`Judge`): the raw score ``r`` of the transcript's tokens (encoded as the training
pairs were, cut to the judge's ``max_len``), normalized with the held-out mean and std stored with
the model, ``z = (r - mean) / std``, clipped to ``[-clip, clip]`` and mapped to ``[0, 1]`` by
``(z + clip) / (2 clip)``. A judge can be gamed; bounding its part caps what gaming it pays.

A run whose reward is learned only (a domain's verifier has a ``learned`` part and no ``outcome``
weight > 0) is flagged: a warning when it starts, and ``reward/learned_only = 1.0`` in every RL
step's metrics (0.0 in a run that also pays the outcome), next to ``reward/learned_mean``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from envs.verifiers import VERIFIERS
from envs.verifiers.learned import DEFAULT_SCORER, register_scorer, unregister_scorer
from rl.config.errors import ConfigError
from rl.config.schema import load, setting
from rl.generation.tokenizer import Tokenizer, load_tokenizer
from rl.learning.reward_model import (
    RewardModel,
    RewardModelInfo,
    load_reward_model,
    pair_accuracy,
    read_heldout,
    score_sequences,
)
from rl.learning.sft import encode_conversation

log = logging.getLogger(__name__)
LEARNED = "learned"  # the registered name of the verifier


@dataclasses.dataclass(frozen=True)
class LearnedRewardSettings:
    """``config.learned_reward``: which judge the ``learned`` verifier parts use, and its checks.

    Attributes:
      path: a saved reward model (``<rm workdir>/reward_model``), or the reward-model run's workdir.
      min_accuracy: the judge's held-out pair accuracy must be at least this, or the run refuses to start.
      clip: normalized scores are clipped to ``[-clip, clip]`` before mapping to ``[0, 1]``.
    """

    path: str
    min_accuracy: float = setting(0.75, check=lambda v: 0 < v <= 1, expected="a fraction in (0, 1]")
    clip: float = setting(3.0, check=lambda v: v > 0, expected="a number > 0")

    @property
    def model_dir(self) -> Path:
        path = Path(self.path)
        return path / "reward_model" if (path / "reward_model").is_dir() else path


def verifier_parts(env_kwargs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, tuple[str, float]]]:
    """Per domain with a ``verifier`` config: part key -> (verifier or role name, weight)."""
    out: dict[str, dict[str, tuple[str, float]]] = {}
    for domain, kwargs in env_kwargs.items():
        config = dict(kwargs).get("verifier")
        if config is None:
            continue
        parts = {}
        for key, value in dict(config).items():
            value = dict(value) if isinstance(value, Mapping) else {"weight": value}
            weight = value.get("weight", 1.0)
            parts[key] = (value.get("verifier", key), float(weight) if isinstance(weight, (int, float)) else 0.0)
        out[domain] = parts
    return out


def _is_outcome(key: str, name: str) -> bool:
    """The ``outcome`` role, or a registered verifier of that role named directly."""
    return key == "outcome" or (name in VERIFIERS and VERIFIERS[name].role == "outcome")


def learned_domains(env_kwargs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Domains whose verifier has a ``learned`` part."""
    return sorted(d for d, parts in verifier_parts(env_kwargs).items() if any(n == LEARNED for n, _ in parts.values()))


def learned_only_domains(env_kwargs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Domains rewarded by the judge with no ``outcome`` weight > 0: the judge alone decides."""
    out = []
    for domain, parts in verifier_parts(env_kwargs).items():
        learned = any(n == LEARNED and w > 0 for n, w in parts.values())
        outcome = any(_is_outcome(key, n) and w > 0 for key, (n, w) in parts.items())
        if learned and not outcome:
            out.append(domain)
    return sorted(out)


def parse_learned_reward(node: Mapping[str, Any] | None, env_kwargs: Mapping[str, Any]) -> LearnedRewardSettings | None:
    """``config.learned_reward`` checked against the verifier configs that use it; errors name the field."""

    users = learned_domains(env_kwargs)
    if node is None:
        if users:
            raise ConfigError(
                f"config.rollout.env_kwargs.{users[0]}.verifier: a 'learned' part needs a judge; set "
                "config.learned_reward = configs.common.learned_reward(PATH of a saved reward model)"
            )
        return None
    s = load(LearnedRewardSettings, node, "learned_reward")
    if not isinstance(s.path, str) or not (s.model_dir / "reward_model.json").is_file():
        raise ConfigError(
            f"config.learned_reward.path: expected a reward model saved by a config.reward_model run "
            f"(a directory with reward_model.json, or that run's workdir), got {s.path!r}"
        )
    if not users:
        raise ConfigError(
            "config.learned_reward: no rollout.env_kwargs.<domain>.verifier has a 'learned' part to use it; "
            'add one, e.g. {"arithmetic": {"verifier": {"outcome": 1.0, "learned": 0.2}}}'
        )
    return s


class Judge:
    """The scorer the ``learned`` verifier calls: transcript -> bounded score (see the module docstring)."""

    def __init__(self, model: RewardModel, info: RewardModelInfo, clip: float, tokenizer: Tokenizer | None = None):
        self.info, self.clip = info, float(clip)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(info.tokenizer)
        self.std = max(float(info.score_std), 1e-6)
        self.measured_accuracy: float | None = None  # set by install_judge's check
        graphdef, state = nnx.split(model)
        self._state = state
        self._forward = jax.jit(lambda state, tokens, mask: nnx.merge(graphdef, state)(tokens, mask))

    def raw_scores(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """Raw (unnormalized) scores of token sequences."""
        apply = lambda tokens, mask: self._forward(self._state, tokens, mask)  # noqa: E731
        return score_sequences(apply, seqs, pad_id=self.tokenizer.pad_id, max_len=self.info.max_len)

    def bounded(self, raw: float) -> tuple[float, float]:
        """``(z, score)``: the normalized score and its clipped map to ``[0, 1]``."""
        z = (float(raw) - self.info.score_mean) / self.std
        return z, (min(max(z, -self.clip), self.clip) + self.clip) / (2.0 * self.clip)

    def heldout_accuracy(self, directory: str | Path) -> tuple[float, int]:
        """Pair accuracy on the held-out pairs saved with the model, measured now; and how many."""
        pairs = read_heldout(directory)
        scores = self.raw_scores([p.chosen[0] for p in pairs] + [p.rejected[0] for p in pairs])
        return pair_accuracy(scores[: len(pairs)], scores[len(pairs) :]), len(pairs)

    def __call__(self, messages: Sequence[Mapping[str, str]]) -> dict[str, float]:
        ids, _ = encode_conversation(self.tokenizer, list(messages))
        raw = float(self.raw_scores([ids])[0])
        z, score = self.bounded(raw)
        if not math.isfinite(score):
            raise FloatingPointError(f"reward model score {raw!r} is not finite")
        return {"score": score, "raw": raw, "z": z}


def install_judge(settings: Any, mesh: jax.sharding.Mesh | None = None) -> Judge | None:
    """Loads, checks and registers the run's judge (None without ``config.learned_reward``).

    ``settings``: the run's :class:`~rl.config.settings.Settings`. Raises ``ConfigError`` when the judge's
    measured held-out accuracy is below ``learned_reward.min_accuracy``; warns about a learned-only reward.
    """

    s: LearnedRewardSettings | None = settings.learned_reward
    if s is None:
        return None
    model, info = load_reward_model(s.model_dir, mesh)
    judge = Judge(model, info, s.clip)
    accuracy, n = judge.heldout_accuracy(s.model_dir)
    if accuracy < s.min_accuracy:
        raise ConfigError(
            f"config.learned_reward.min_accuracy: the reward model at {s.model_dir} has held-out pair accuracy "
            f"{accuracy:.3f} (measured now on its {n} held-out pairs; {info.heldout_accuracy:.3f} when saved), "
            f"below the threshold {s.min_accuracy:.3f}. Refusing to train against it: train it longer or on more "
            "pairs (configs/reward_model.py), or lower the threshold"
        )
    log.info("learned reward: judge %s passes its check (held-out pair accuracy %.3f on %d pairs >= %.3f)",
             s.model_dir, accuracy, n, s.min_accuracy)  # fmt: skip
    alone = learned_only_domains(settings.rollout.env_kwargs)
    if alone:
        log.warning(
            "LEARNED-ONLY REWARD for %s: no outcome weight > 0, the reward model alone decides the reward. "
            "A policy can learn to game a judge; metrics carry reward/learned_only = 1.0", alone
        )  # fmt: skip
    register_scorer(DEFAULT_SCORER, judge)
    judge.measured_accuracy = accuracy
    return judge


def uninstall_judge(judge: Judge | None) -> None:
    if judge is not None:
        unregister_scorer(DEFAULT_SCORER, judge)


def judge_metrics(settings: Any, episodes: Sequence[Any]) -> dict[str, float]:
    """``reward/learned_only`` (1.0: the judge alone rewards some domain) and ``reward/learned_mean``."""
    if settings.learned_reward is None:
        return {}
    env_kwargs = settings.rollout.env_kwargs
    keys = {k for parts in verifier_parts(env_kwargs).values() for k, (name, _) in parts.items() if name == LEARNED}
    scores = [
        float(e.verification["components"][k])
        for e in episodes
        if e.anomaly is None
        for k in keys
        if k in e.verification.get("components", {})
    ]
    out = {"reward/learned_only": 1.0 if learned_only_domains(env_kwargs) else 0.0}
    if scores:
        out["reward/learned_mean"] = float(np.mean(scores))
    return out
