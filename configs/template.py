r"""The template domain (``envs/domains/template/``): a short SFT on its demonstrations, then GRPO.

    python -m rl.train --config=configs/template.py --workdir=runs/template
    python -m rl.train --config=configs/template.py:test --workdir=/tmp/template   # 2 RL steps

The starting point for a new domain's config (README, "Adding a domain"): a copy changes ``NAME``.
The domain holds a sandbox per episode, so a step needs ``tasks_per_step x group_size`` of them;
``config.sandbox.capacity`` left at 0 sizes the pool to that, a smaller one queues the episodes.
"""

from __future__ import annotations

import ml_collections as mlc

from configs import common

NAME = "template"


def get_config(arg: str | None = None) -> mlc.ConfigDict:
    arg = common.variant(arg, __file__, "test")
    config = common.base(
        model=common.model("tiny"),
        tasks={NAME: common.pool(f"{NAME}:0", split="train")},
        eval=common.evaluation({NAME: common.pool(f"{NAME}:0", split="eval")}, every=10, num_tasks=6, k=2),
        sandbox=common.sandbox("bwrap"),
        sft=common.sft(100, data=NAME, batch_size=8, learning_rate=3e-3, warmup_steps=5),
        rollout=common.rollout(group_size=4, max_turns=3, max_new_tokens=64, max_context=512, render_tools=False),
        loop=common.loop(steps=50, tasks_per_step=4, max_len=576),
    )
    if arg == "test":  # 2 SFT + 2 RL steps on the tiny model, for tests/envs/test_new_domain_twin.py
        config.sft.update({"steps": 2, "warmup_steps": 1})
        common.cpu_test(config, steps=2, max_len=576, num_tasks=2, k=1, render_tools=False, max_context=512)
    return config
