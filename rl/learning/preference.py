"""Preference optimisation: DPO and SimPO losses, preference pairs, and pairs mined from trajectories.

The middle stage of Pretrained → SFT → preferences → RL. A *pair* is two token-exact sequences over
the same prompt, ``chosen`` and ``rejected``, each with a loss mask on the policy's own tokens
(assistant completions; prompt and tool output never count).

- **DPO** (Rafailov et al. 2023): with ``r = sum_mask(logp - ref_logp)`` per sequence and
  ``z = beta * (r_chosen - r_rejected)``, ``loss = -(1 - eps) log sigmoid(z) - eps log sigmoid(-z)``
  (``eps``: label smoothing, the conservative DPO of Mitchell 2023). The reference is frozen at
  the phase's start.
- **SimPO** (Meng et al. 2024), reference-free: ``r`` is the *mean* log-prob over the mask and
  ``z = beta * (r_chosen - r_rejected) - gamma``, same loss.

Metrics (mean over the pairs): ``loss``, ``reward_margin`` (beta times the chosen-minus-rejected
reward), ``accuracy`` (share of pairs whose chosen sequence is rewarded more), ``chosen_reward``,
``rejected_reward``.

Layout in a :class:`~rl.learning.batch.TrainBatch` (:func:`pair_batch`): ``2P`` unpacked rows, the
``P`` chosen sequences first and then the ``P`` rejected ones in the same order, so the learner's
interleaved micro-batch split (row ``b`` to micro-batch ``b % M``) keeps every pair together
whenever ``M`` divides ``P``; padding pairs have weight 0.

Mined pairs (:func:`mine_pairs`): for each task, an episode that passed against one that failed,
anomalies excluded (an environment failure says nothing about the policy).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl.config.schema import setting, validate
from rl.generation.tokenizer import Tokenizer
from rl.learning.batch import DEFAULT_BATCH_BUCKETS, DEFAULT_LENGTH_BUCKETS, TrainBatch, round_up

PREFERENCE_LOSSES = ("dpo", "simpo")
PREFERENCE_METRICS = ("loss", "reward_margin", "accuracy", "chosen_reward", "rejected_reward")  # pair means


@dataclasses.dataclass(frozen=True)
class PreferenceConfig:
    """Settings of a preference phase's loss.

    Attributes:
      loss: ``"dpo"`` (needs the frozen reference) or ``"simpo"`` (reference-free).
      beta: inverse temperature of the implicit reward (DPO ~0.1; SimPO ~2).
      label_smoothing: eps, the assumed share of flipped labels (0: plain DPO).
      gamma: SimPO's target margin (ignored by DPO).
    """

    loss: str = setting("dpo", choices=PREFERENCE_LOSSES)
    beta: float = setting(0.1, check=lambda v: v > 0, expected="a number > 0")
    label_smoothing: float = setting(0.0, check=lambda v: 0 <= v < 0.5, expected="a number in [0, 0.5)")
    gamma: float = 0.5

    def __post_init__(self) -> None:
        validate(self)

    @property
    def uses_reference(self) -> bool:
        return self.loss == "dpo"


# -- the losses (pure, per pair) -----------------------------------------------------------------
def preference_loss(
    logp: jax.Array, ref_logp: jax.Array | None, mask: jax.Array, weights: jax.Array, config: PreferenceConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The weighted mean loss over pairs of a :func:`pair_batch` layout, and its metrics.

    ``logp``, ``ref_logp``, ``mask``: ``[2P, T]`` per-token log-probs of the policy and the
    reference (None for SimPO) and the loss mask; ``weights``: ``[2P]`` (a pair's weight is its
    chosen row's). Sums run in float32.
    """
    p = logp.shape[0] // 2
    mask = mask.astype(jnp.float32)
    if config.loss == "dpo":
        if ref_logp is None:
            raise ValueError("preference_loss: DPO needs the reference log-probs (ref_logp)")
        score = ((logp - ref_logp) * mask).sum(-1)
    else:
        score = (logp * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0)
    chosen, rejected = score[:p], score[p:]
    margin = config.beta * (chosen - rejected)
    if config.loss == "simpo":
        margin = margin - config.gamma
    eps = config.label_smoothing
    per_pair = -(1.0 - eps) * jax.nn.log_sigmoid(margin) - eps * jax.nn.log_sigmoid(-margin)
    w = weights[:p].astype(jnp.float32)
    total = jnp.maximum(w.sum(), 1e-9)
    mean = lambda x: (x * w).sum() / total  # noqa: E731
    metrics = {
        "loss": mean(per_pair),
        "reward_margin": mean(config.beta * (chosen - rejected)),
        "accuracy": mean((chosen > rejected).astype(jnp.float32)),
        "chosen_reward": mean(config.beta * chosen),
        "rejected_reward": mean(config.beta * rejected),
    }
    return metrics["loss"], metrics


# -- pairs ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Pair:
    """Two token-exact sequences over one prompt, each with its loss mask (1 on the policy's tokens)."""

    chosen: tuple[list[int], list[int]]
    rejected: tuple[list[int], list[int]]
    source: str = ""  # a task id, or a file and line

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": list(self.chosen), "rejected": list(self.rejected), "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Pair:
        return cls(tuple(data["chosen"]), tuple(data["rejected"]), data.get("source", ""))


def pair_batch(pairs: Sequence[Pair], *, pad_id: int, pair_multiple: int = 1, max_len: int | None = None) -> TrainBatch:
    """``2P`` rows, chosen first then rejected (see the module docstring); ``P`` is bucketed and padded
    with weight-0 pairs to a multiple of ``pair_multiple`` (the learner's batch multiple)."""
    if not pairs:
        raise ValueError("pair_batch(pairs=): expected at least one pair")
    seqs = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    if max_len is not None:
        seqs = [(ids[:max_len], mask[:max_len]) for ids, mask in seqs]
    n = len(pairs)
    p = -(-round_up(n, DEFAULT_BATCH_BUCKETS) // pair_multiple) * pair_multiple
    t = round_up(max(len(ids) for ids, _ in seqs), DEFAULT_LENGTH_BUCKETS)
    tokens = np.full((2 * p, t), pad_id, np.int32)
    input_mask = np.zeros((2 * p, t), bool)
    loss_mask = np.zeros((2 * p, t), np.float32)
    weights = np.zeros(2 * p, np.float32)
    for k, (ids, mask) in enumerate(seqs):
        row = k if k < n else p + (k - n)
        tokens[row, : len(ids)] = ids
        input_mask[row, : len(ids)] = True
        loss_mask[row, : len(mask)] = mask
        weights[row] = 1.0
    zeros = np.zeros((2 * p, t), np.float32)
    return TrainBatch(tokens, input_mask, loss_mask, zeros, np.zeros(2 * p, np.float32), weights)


def load_pairs(path: str | Path, tok: Tokenizer) -> list[Pair]:
    """Pairs from JSONL: ``{"prompt": [...], "chosen": [...], "rejected": [...]}`` (message lists; the
    prompt is prepended to both) or ``{"chosen": [...], "rejected": [...]}`` (whole conversations)."""
    from rl.learning.sft import encode_conversation

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"preference data: {path} does not exist")
    pairs = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        if not isinstance(record, dict) or not {"chosen", "rejected"} <= set(record):
            raise ValueError(f"{path}:{n}: expected an object with 'chosen' and 'rejected' message lists")
        prompt = list(record.get("prompt", []))
        chosen = encode_conversation(tok, prompt + list(record["chosen"]))
        rejected = encode_conversation(tok, prompt + list(record["rejected"]))
        if prompt:
            shared = len(tok.encode_messages(prompt, add_generation_prompt=True))
            if chosen[0][:shared] != rejected[0][:shared]:
                raise ValueError(f"{path}:{n}: chosen and rejected do not share the prompt's tokens")
        pairs.append(Pair(chosen, rejected, f"{path.name}:{n}"))
    return pairs


def mine_pairs(episodes: Sequence[Any], *, max_pairs_per_task: int = 4) -> list[Pair]:
    """Pairs from trajectories: per task, a passing episode against a failing one.

    ``episodes``: :class:`rl.rollout.trajectory.EpisodeRecord` (or anything with ``task_id``,
    ``token_ids``, ``loss_mask``, ``passed``, ``anomaly``, ``index``). Anomalies are left out: an
    environment failure is not the policy's. Deterministic: episodes pair up in index order, at
    most ``max_pairs_per_task`` per task, tasks in order of first appearance.
    """
    by_task: dict[str, tuple[list[Any], list[Any]]] = {}
    for e in episodes:
        if e.anomaly or not e.token_ids or not any(e.loss_mask):
            continue
        passed, failed = by_task.setdefault(e.task_id, ([], []))
        (passed if e.passed else failed).append(e)
    pairs = []
    for task_id, (passed, failed) in by_task.items():
        passed.sort(key=lambda e: (e.group, e.index))
        failed.sort(key=lambda e: (e.group, e.index))
        for good, bad in list(zip(passed, failed, strict=False))[:max_pairs_per_task]:
            pairs.append(
                Pair((list(good.token_ids), list(good.loss_mask)), (list(bad.token_ids), list(bad.loss_mask)), task_id)
            )
    return pairs


class PairData:
    """Pairs served in seeded shuffled batches, epoch after epoch, with a resumable state."""

    def __init__(self, pairs: Sequence[Pair], *, seed: int = 0):
        if not pairs:
            raise ValueError("PairData(pairs=): no preference pairs (did mining find passing and failing episodes?)")
        self.pairs = list(pairs)
        self._rng = np.random.default_rng(seed)
        self._order: list[int] = []

    def __len__(self) -> int:
        return len(self.pairs)

    def batch(self, size: int) -> list[Pair]:
        out = []
        while len(out) < size:
            if not self._order:
                self._order = [int(i) for i in self._rng.permutation(len(self.pairs))][::-1]
            out.append(self.pairs[self._order.pop()])
        return out

    def state(self) -> dict[str, Any]:
        return {"order": list(self._order), "rng": self._rng.bit_generator.state}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self._order = [int(i) for i in state["order"]]
        self._rng.bit_generator.state = state["rng"]
