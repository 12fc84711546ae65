"""The SFT warm start as a phase: batches of demonstrations, and the check that may end it early.

Its data come from :mod:`rl.phases.sft_data`; with ``sft.check_every`` > 0 a check
(:mod:`rl.phases.sft_check`) samples the policy every few steps and, once it passes, the
learning rate decays over ``sft.anneal_steps`` and the phase's remaining steps are idle (they
keep their numbers, so a checkpoint says where a resumed run picks up).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from rl.learning.batch import pack
from rl.learning.sft import SFTData
from rl.phases.phase import Phase
from rl.phases.sft_check import SFTCheck, annealing, check_tasks
from rl.phases.sft_data import load_sft_data

log = logging.getLogger(__name__)


class SFTPhase(Phase):
    """``sft.steps`` supervised steps (see the module docstring)."""

    name = "sft"
    eval_label = "after_sft"

    def __init__(self, exp: Any, first: int, last: int):
        super().__init__(exp, first, last)
        s = exp.settings
        convs = load_sft_data(s.sft.data, dict(s.sft.options))
        self.data = SFTData(exp.tokenizer, convs, max_len=s.loop.max_len, seed=s.seed)
        self.check = SFTCheck(exp.rollout, s, check_tasks(s, exp.catalog)) if s.sft.check_every else None
        self.decay_from: int | None = None  # the step whose check passed: the decay starts there

    def end(self) -> int:
        """The last SFT step that trains (``last`` unless a check started the decay early)."""
        return self.check.end(self.decay_from) if self.check is not None else self.last

    def idle(self, step: int) -> bool:
        return self.end() < step < self.last

    def step(self, step: int) -> dict[str, Any]:
        if step > self.end():  # the last SFT step of a warm start that ended early
            return {"sft/ended_at": float(self.end())}
        s = self.exp.settings
        seqs, masks = self.data.batch(s.sft.batch_size)
        batch = pack(
            seqs,
            masks,
            [[0.0] * len(seq) for seq in seqs],
            [0.0] * len(seqs),
            pad_id=self.exp.tokenizer.pad_id,
            batch_multiple=self.learner.batch_multiple,
            max_len=s.loop.max_len,
            pack_sequences=s.loop.pack_sequences,
        )
        t = time.perf_counter()
        metrics = {k.replace("train/", "sft/"): v for k, v in self.learner.train_step(batch).items()}
        metrics["time/learn_s"] = time.perf_counter() - t
        if self.check is not None and self.decay_from is None and self.check.due(step):
            t = time.perf_counter()
            done, checked = self.check.run(step)
            metrics.update(checked, **{"time/check_s": time.perf_counter() - t})
            if done:
                self._start_decay(step)
        return metrics

    def evaluated(self, step: int, result: Mapping[str, float], *, more: bool) -> None:
        warn_if_nothing_to_learn(result, step, more)

    def _start_decay(self, step: int) -> None:
        """A check passed at ``step``: the same weights and optimizer state go on under a schedule
        whose decay starts here (a learner with that schedule; the state carries over exactly)."""
        self.decay_from = step
        old = self.learner
        config = annealing(self.exp.settings.learners["sft"], step, self.exp.settings.sft.anneal_steps)
        self.learner = self.exp.learner("sft", config=config)
        self.learner.load_state(old.state())

    def state(self, step: int) -> dict[str, Any]:
        del step
        return {"sft_data": self.data.state(), "sft_decay_from": self.decay_from}

    def load_state(self, extra: Mapping[str, Any], step: int) -> None:
        if extra.get("sft_data"):
            self.data.load_state(extra["sft_data"])
        if extra.get("sft_decay_from") is not None and self.first <= step <= self.last:
            self._start_decay(int(extra["sft_decay_from"]))  # the learner with the decay that had started


def warn_if_nothing_to_learn(result: Mapping[str, float], step: int, more: bool) -> None:
    """A warm start after which no held-out episode passes, greedy or sampled, leaves RL no reward to
    learn from (every group scores 0): say so at once instead of letting the run finish at 0.000."""
    passing = [v for k, v in result.items() if k == "eval/greedy_pass_rate" or k.startswith("eval/pass@")]
    if more and passing and max(passing) == 0.0:
        log.warning(
            "after SFT (step %d) no held-out episode passed, greedy or sampled: RL gets no reward to learn "
            "from. Check sft/loss (did the demonstrations' skill arrive?); more SFT steps or another seed "
            "may be needed.",
            step,
        )
