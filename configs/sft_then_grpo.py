r"""The Pretrained → SFT → RL pipeline: a supervised warm start on conversations, then GRPO.

    python -m rl.train --config=configs/sft_then_grpo.py --workdir=runs/sft_rl \
        --config.model.path=/models/Qwen2.5-0.5B --config.sft.data=jsonl:/data/sft.jsonl

``sft.data`` is a JSONL of conversations (``{"messages": [...]}`` per line,
assistant turns are what is learned; tool turns are observations, mask 0). The
RL stage starts from the SFT weights with a fresh optimizer and a KL penalty to
the post-SFT policy. Defaults use the shipped arithmetic demonstrations so the
pipeline runs as is; ``get_config("test")`` is a CPU-sized version.
"""

from __future__ import annotations

import ml_collections as mlc

from configs import common


def get_config(arg: str | None = None) -> mlc.ConfigDict:
    arg = common.variant(arg, __file__, "test")
    config = common.base(
        model=common.model("qwen2.5-0.5b", path="/models/Qwen2.5-0.5B", tokenizer="", dtype="bfloat16"),
        tasks={
            "arithmetic": common.pool("arithmetic:train", weight=0.5),
            "math": common.pool("builtin:math", weight=0.5, split="train"),
        },
        algorithm=common.grpo(kl_coef=0.02),
        optimizer=common.optimizer(1e-6, warmup_steps=10, microbatches=4),
        rollout=common.rollout(group_size=8, max_turns=3, max_new_tokens=256, max_context=2048),
        sft=common.sft(
            500,
            data="arithmetic",
            batch_size=32,
            learning_rate=1e-5,
            options={"num_tasks": 4000, "tool_fraction": 0.5},
        ),
        eval=common.evaluation(
            {"arithmetic": common.pool("arithmetic:eval"), "math": common.pool("builtin:math", split="eval")},
            every=10,
            num_tasks=60,
            k=4,
        ),
        loop=common.loop(steps=100, tasks_per_step=16, max_len=2048),
    )
    if arg == "test":
        common.cpu_test(config, steps=1, max_len=1024, num_tasks=2, k=0)
        config.sft.update(
            {"steps": 2, "batch_size": 4, "learning_rate": 1e-3, "warmup_steps": 1, "options": {"num_tasks": 16}}
        )
    return config
