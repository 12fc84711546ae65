"""A reward-model run: ``config.reward_model`` trains a Bradley-Terry judge on preference pairs.

    python -m rl.train --config=configs/reward_model.py --workdir=runs/reward_model

The run's model (``config.model``: a preset, or a Hugging Face checkpoint, LoRA adapters included)
is the backbone, with a zero-initialised scalar head (:mod:`rl.learning.reward_model`). Pairs come
from a JSONL file (``data="jsonl:PATH"``, the preference phase's format); a seeded shuffle sets
``heldout_fraction`` of them aside, the rest are served in seeded shuffled batches whose order is
part of every checkpoint, so a resumed run trains on exactly the same batches.

Steps ``1..steps`` write ``rm/loss``, ``rm/accuracy``, ``rm/margin`` (and ``rm/chosen``,
``rm/rejected``, ``rm/grad_norm``, ``rm/learning_rate``). Every ``eval_every`` steps and at the
last step the held-out pairs are scored: ``rm/heldout_accuracy``, ``rm/heldout_margin``,
``rm/score_mean``, ``rm/score_std``. The last step then saves the judge to
``<workdir>/reward_model`` with those figures (:func:`rl.learning.reward_model.save_reward_model`);
an RL run uses it through ``config.learned_reward`` (:mod:`rl.phases.learned_reward`).

A reward-model run trains nothing else: its SFT, preference and RL steps must be 0 (the backbone
is the run's model, trained in place).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rl.config.errors import need
from rl.config.schema import load, setting
from rl.generation.tokenizer import ByteTokenizer
from rl.learning.preference import Pair, PairData, load_pairs, pair_batch
from rl.learning.reward_model import RewardModelInfo, pair_accuracy, save_reward_model
from rl.phases.phase import Phase

log = logging.getLogger(__name__)
OUTPUT_DIR = "reward_model"
_SPLIT_SEED_OFFSET = 7919  # the held-out split's shuffle: seed + this


@dataclasses.dataclass(frozen=True)
class RewardModelSettings:
    """``config.reward_model``: a run of ``steps`` Bradley-Terry steps (0: not a reward-model run).

    Attributes:
      steps: optimizer steps.
      data: ``"jsonl:PATH"``: ``{"prompt", "chosen", "rejected"}`` message lists per line.
      batch_size: pairs per step.
      learning_rate, warmup_steps: the schedule (AdamW, cosine decay as the other phases).
      heldout_fraction: share of the pairs set aside (at least one pair) to measure the judge.
      eval_every: score the held-out pairs every this many steps (0: only at the last step).
    """

    steps: int = setting(0, low=0)
    data: str = ""
    batch_size: int = setting(16, low=1)
    learning_rate: float = setting(1e-3, check=lambda v: v > 0, expected="a number > 0")
    warmup_steps: int = setting(0, low=0)
    heldout_fraction: float = setting(0.25, check=lambda v: 0 < v < 1, expected="a fraction in (0, 1)")
    eval_every: int = setting(0, low=0)


def parse_reward_model(node: Mapping[str, Any] | None) -> RewardModelSettings:
    """``config.reward_model`` checked (absent: no reward model); errors name the field."""
    s = RewardModelSettings() if node is None else load(RewardModelSettings, node, "reward_model")
    if s.steps:
        data = s.data
        ok = data.startswith("jsonl:") and Path(data.removeprefix("jsonl:")).is_file()
        need(ok, "reward_model.data", "'jsonl:PATH' of an existing file of preference pairs", data)
    return s


def split_pairs(pairs: list[Pair], fraction: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """``(train, heldout)``: a seeded shuffle, ``round(fraction * n)`` pairs (at least 1) held out."""
    n = len(pairs)
    held = max(1, round(fraction * n))
    if n - held < 1:
        raise ValueError(
            f"config.reward_model.data: {n} pair(s) leave none to train on with heldout_fraction={fraction}"
        )
    order = np.random.default_rng(seed + _SPLIT_SEED_OFFSET).permutation(n)
    return [pairs[i] for i in order[held:]], [pairs[i] for i in order[:held]]


def tokenizer_spec(exp: Any) -> str:
    """What the judge's tokenizer is: ``"byte"``, or the tokenizer.json (or directory) of the run's model."""
    if isinstance(exp.tokenizer, ByteTokenizer):
        return "byte"
    return str(Path(exp.settings.model.tokenizer_spec).absolute())


class RewardModelPhase(Phase):
    """Pairs, steps, held-out evaluation and the saved judge of a reward-model run (its only phase)."""

    name = "reward_model"
    periodic_eval = True

    def __init__(self, exp: Any, first: int, last: int):
        super().__init__(exp, first, last)
        self.settings: RewardModelSettings = exp.settings.reward_model
        self.data: PairData | None = None
        self.heldout: list[Pair] = []

    @property
    def output(self) -> Path:
        return Path(self.exp.workdir) / OUTPUT_DIR

    def prepare(self) -> None:
        """Loads the pairs and splits off the held-out ones (the same split on every start)."""
        s, seed = self.settings, self.exp.settings.seed
        pairs = load_pairs(s.data.removeprefix("jsonl:"), self.exp.tokenizer)
        train, self.heldout = split_pairs(pairs, s.heldout_fraction, seed)
        self.data = PairData(train, seed=seed)
        log.info("reward model: %d training pairs, %d held out", len(train), len(self.heldout))

    def step(self, step: int) -> dict[str, float]:
        """One Bradley-Terry step (``rm/*`` metrics); held-out figures when due; the judge saved at the last."""
        learner = self.learner
        if self.data is None:
            self.prepare()
        s, max_len = self.settings, self.exp.settings.loop.max_len
        pad = self.exp.tokenizer.pad_id
        batch = pair_batch(self.data.batch(s.batch_size), pad_id=pad, pair_multiple=learner.batch_multiple,
                           max_len=max_len)  # fmt: skip
        metrics = {k.replace("train/", "rm/"): v for k, v in learner.train_step(batch).items()}
        last = step == s.steps
        if last or (s.eval_every and step % s.eval_every == 0):
            metrics.update(self.evaluate(learner))
        if last:
            self.save(learner, metrics)
        return metrics

    def evaluate(self, learner: Any) -> dict[str, float]:
        """Pair accuracy and margin on the held-out pairs, and the mean / std of their scores."""
        n, max_len = len(self.heldout), self.exp.settings.loop.max_len
        seqs = [p.chosen[0] for p in self.heldout] + [p.rejected[0] for p in self.heldout]
        scores = learner.scores(seqs, pad_id=self.exp.tokenizer.pad_id, max_len=max_len)
        chosen, rejected = scores[:n], scores[n:]
        return {
            "rm/heldout_accuracy": pair_accuracy(chosen, rejected),
            "rm/heldout_margin": float(np.mean(chosen - rejected)),
            "rm/heldout_pairs": float(n),
            "rm/score_mean": float(np.mean(scores)),
            "rm/score_std": float(np.std(scores)),
        }

    def save(self, learner: Any, metrics: Mapping[str, float]) -> Path:
        info = RewardModelInfo(
            model_config=dataclasses.asdict(learner.model.backbone.config),
            tokenizer=tokenizer_spec(self.exp),
            max_len=self.exp.settings.loop.max_len,
            heldout_accuracy=metrics["rm/heldout_accuracy"],
            heldout_pairs=len(self.heldout),
            score_mean=metrics["rm/score_mean"],
            score_std=metrics["rm/score_std"],
            train_pairs=len(self.data),
            steps=self.settings.steps,
        )
        path = save_reward_model(learner.model, self.output, info, self.heldout)
        log.info("reward model saved to %s (held-out pair accuracy %.3f on %d pairs)", path,
                 info.heldout_accuracy, info.heldout_pairs)  # fmt: skip
        return path

    def state(self, step: int) -> dict[str, Any]:
        del step
        return {"reward_model_data": self.data.state() if self.data is not None else None}

    def load_state(self, extra: Mapping[str, Any], step: int) -> None:
        del step
        if extra.get("reward_model_data"):
            if self.data is None:
                self.prepare()
            self.data.load_state(extra["reward_model_data"])
