"""A run's preference phase (DPO / SimPO) between SFT and RL: its pairs, its batches, one step.

Pairs come from a JSONL file (``preference.data = "jsonl:PATH"``) or are **mined** from the policy's
own rollouts (``preference.data = "mined"``, the one-line option): when the phase starts, the
policy as it stands (after SFT) runs ``mine_group`` episodes on each of ``mine_tasks`` training
tasks, through the run's rollout and sandboxes like any RL step, and each task gives pairs of a
passing episode against a failing one (:func:`rl.learning.preference.mine_pairs`; anomalies are
left out). The pairs are written to ``<workdir>/preference_pairs.jsonl`` (atomically) before the
first preference step, so a run resumed mid-phase trains on the very same pairs; the order they
are served in is part of every checkpoint.

Mining is deterministic: the tasks come from their own seeded stream (the RL stream is not
touched) and every episode's seed names its place, not the batch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl.config.errors import ConfigError, need
from rl.config.schema import setting
from rl.learning.preference import Pair, PairData, PreferenceConfig, load_pairs, mine_pairs, pair_batch
from rl.phases.phase import Phase
from rl.rollout.task_stream import task_stream

log = logging.getLogger(__name__)

MINED = "mined"
PAIRS_FILE = "preference_pairs.jsonl"
_MINING_SEED_OFFSET = 104729  # the mining stream's seed: seed + this (never the RL stream's)


@dataclasses.dataclass(frozen=True)
class PreferenceSettings:
    """``config.preference``: a phase of ``steps`` preference-optimisation steps (0: none).

    Attributes:
      steps: optimizer steps of the phase.
      data: ``"mined"`` (pairs from the policy's own rollouts) or ``"jsonl:PATH"``.
      batch_size: pairs per step.
      learning_rate, warmup_steps: the phase's schedule (AdamW, as the other phases).
      loss, beta, label_smoothing, gamma: :class:`rl.learning.preference.PreferenceConfig`.
      mine_tasks, mine_group: training tasks mined, and episodes per task.
      max_pairs_per_task: at most this many pairs per mined task.
    """

    steps: int = setting(0, low=0)
    data: str = MINED
    batch_size: int = setting(16, low=1)
    learning_rate: float = 1e-4
    warmup_steps: int = setting(0, low=0)
    loss: str = PreferenceConfig.loss
    beta: float = PreferenceConfig.beta
    label_smoothing: float = PreferenceConfig.label_smoothing
    gamma: float = PreferenceConfig.gamma
    mine_tasks: int = setting(64, low=1)
    mine_group: int = setting(8, low=2)
    max_pairs_per_task: int = setting(4, low=1)


def preference_loss_of(p: PreferenceSettings) -> PreferenceConfig | None:
    """The preference phase's loss (None: no phase), its data checked."""
    if not p.steps:
        return None
    known = f"'{MINED}' (pairs from the policy's own rollouts) or 'jsonl:PATH'"
    need(p.data == MINED or p.data.startswith("jsonl:"), "preference.data", known, p.data)
    if p.data.startswith("jsonl:"):
        need(Path(p.data.removeprefix("jsonl:")).is_file(), "preference.data", "a JSONL file that exists", p.data)
    try:
        return PreferenceConfig(p.loss, p.beta, p.label_smoothing, p.gamma)
    except ValueError as exc:
        raise ConfigError(re.sub(r"^PreferenceConfig\.", "config.preference.", str(exc))) from exc


class PreferencePhase(Phase):
    """``preference.steps`` DPO / SimPO steps on pairs loaded or mined when the phase starts (module docstring).

    Args:
      exp: the run's :class:`rl.run.experiment.Experiment` (rollout, tokenizer, task catalog).
      first, last: the phase's first and last step numbers (mined episodes are numbered by ``first``).
    """

    name = "preference"
    eval_label = "after_preference"

    def __init__(self, exp: Any, first: int, last: int):
        super().__init__(exp, first, last)
        self.settings: PreferenceSettings = exp.settings.preference
        self.data: PairData | None = None
        self.mining: dict[str, float] = {}
        # Decided now, before any process could mine: every process of a job must take the same path.
        self._mined_before = self.pairs_path.exists()

    @property
    def pairs_path(self) -> Path:
        return Path(self.exp.workdir) / PAIRS_FILE

    def prepare(self) -> dict[str, float]:
        """Loads the pairs (mining them first when the phase starts fresh); returns mining metrics."""
        s, tok = self.settings, self.exp.tokenizer
        if s.data != MINED:
            pairs = load_pairs(s.data.removeprefix("jsonl:"), tok)
        elif self._mined_before:  # a resumed run: the pairs this phase started with
            pairs = [Pair.from_dict(json.loads(line)) for line in self.pairs_path.read_text().splitlines() if line]
        else:
            pairs = self._mine()
        self.data = PairData(pairs, seed=self.exp.settings.seed)
        return self.mining

    def _mine(self) -> list[Pair]:
        s, exp = self.settings, self.exp
        stream = iter(task_stream(exp.settings.tasks, exp.catalog, seed=exp.settings.seed + _MINING_SEED_OFFSET))
        tasks = [next(stream) for _ in range(s.mine_tasks)]
        log.info("mining preference pairs: %d tasks x %d episodes with the current policy", len(tasks), s.mine_group)
        result = exp.rollout.run(tasks, step=self.first, group_size=s.mine_group, policy_version=self.first - 1)
        pairs = mine_pairs(result.episodes, max_pairs_per_task=s.max_pairs_per_task)
        episodes = result.episodes
        self.mining = {
            "dpo/mined_pairs": float(len(pairs)),
            "dpo/mined_pass_rate": sum(e.passed for e in episodes) / max(len(episodes), 1),
            "dpo/mined_anomalies": float(sum(bool(e.anomaly) for e in episodes)),
            "dpo/mined_tasks_with_pairs": float(len({p.source for p in pairs})),
        }
        if not pairs:
            raise RuntimeError(
                f"preference.data='mined': no pairs from {len(tasks)} tasks x {s.mine_group} episodes (pass rate "
                f"{self.mining['dpo/mined_pass_rate']:.3f}): every task's episodes all passed or all failed. "
                "Raise preference.mine_group or mine_tasks, or train SFT longer or shorter"
            )
        if exp.is_main:
            tmp = self.pairs_path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(p.to_dict()) + "\n" for p in pairs))
            os.replace(tmp, self.pairs_path)
        log.info("mined %d preference pairs (pass rate %.3f)", len(pairs), self.mining["dpo/mined_pass_rate"])
        return pairs

    def step(self, step: int) -> dict[str, float]:
        """One optimizer step on ``batch_size`` pairs (``dpo/*`` metrics); the first loads (or mines) the pairs."""
        metrics: dict[str, float] = {}
        if self.data is None:
            t = time.perf_counter()
            metrics.update(self.prepare())
            metrics["time/mine_s"] = time.perf_counter() - t
        t = time.perf_counter()
        pairs = self.data.batch(self.settings.batch_size)
        batch = pair_batch(
            pairs, pad_id=self.exp.tokenizer.pad_id, pair_multiple=self.learner.batch_multiple,
            max_len=self.exp.settings.loop.max_len,
        )  # fmt: skip
        metrics.update({k.replace("train/", "dpo/"): v for k, v in self.learner.train_step(batch).items()})
        metrics["time/learn_s"] = time.perf_counter() - t
        return metrics

    def state(self, step: int) -> dict[str, Any]:
        del step
        return {"preference_data": self.data.state() if self.data is not None else None}

    def load_state(self, extra: Mapping[str, Any], step: int) -> None:
        state = extra.get("preference_data")
        if state and step < self.last:  # resumed inside the phase: the same pairs, in the same order
            if self.data is None:
                self.prepare()
            self.data.load_state(state)
