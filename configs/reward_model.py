r"""A learned reward model for the quickstart's task: a Bradley-Terry judge on the policy's backbone.

    python -m rl.train --config=configs/reward_model.py --workdir=runs/reward_model

The quickstart's architecture (``configs/quickstart.py``: the 0.46M-parameter byte-level
transformer) with a scalar head, trained from scratch on ``configs/data/arithmetic_pairs.jsonl``
(32 training problems; chosen = the Python tool demonstration with the right answer, rejected = a
direct, wrong answer). A seeded quarter of the pairs is held out: the held-out pair accuracy and
the score mean / std it measures are saved with the judge in ``<workdir>/reward_model``. An RL run
then weighs it against the outcome verdict (figures in docs/preference.md)::

    config.learned_reward = common.learned_reward("runs/reward_model", min_accuracy=0.75)
    config.rollout.env_kwargs = {"arithmetic": {"verifier": {"outcome": 1.0, "learned": 0.2}}}

``get_config("test")`` trains a few steps for the test suite (tests/rl/test_reward_model.py).
"""

from __future__ import annotations

from pathlib import Path

import ml_collections as mlc

from configs import common

PAIRS = Path(__file__).resolve().parent / "data" / "arithmetic_pairs.jsonl"


def get_config(arg: str | None = None) -> mlc.ConfigDict:
    arg = common.variant(arg, __file__, "test")
    config = common.base(
        seed=0,
        model=common.model("tiny", num_kv_heads=4),  # the quickstart policy's architecture
        optimizer=common.optimizer(1e-3, warmup_steps=0, grad_clip_norm=1.0),
        # No rollouts in a reward-model run: the rollout section is only validated.
        rollout=common.rollout(group_size=2, max_new_tokens=32, max_context=384, engine=False, env_workers=1),
        eval=common.evaluation({}),
        loop=common.loop(steps=0, tasks_per_step=1, checkpoint_every=20, max_len=384),
    )
    config.reward_model = common.reward_model(
        60, data=f"jsonl:{PAIRS}", batch_size=8, learning_rate=1e-3, warmup_steps=5, heldout_fraction=0.25,
        eval_every=10,
    )  # fmt: skip
    if arg == "test":  # a few steps end to end, for tests/rl/test_reward_model.py
        config.reward_model.update({"steps": 4, "batch_size": 4, "warmup_steps": 1, "eval_every": 2})
        config.loop.checkpoint_every = 2
    return config
