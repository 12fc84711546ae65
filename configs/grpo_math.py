r"""GRPO on final-answer math with a Python tool, from an instruction-tuned model on local disk.

    python -m rl.train --config=configs/grpo_math.py --workdir=runs/math \
        --config.model.path=/models/Qwen2.5-0.5B-Instruct

Tasks: the shipped ``builtin:math`` set (train split), evaluated on its eval
split; swap in GSM8K with ``--config.tasks.math.source=gsm8k:/data/gsm8k/train.jsonl``.
Verifier: ``math_answer`` (value equivalence via math-verify). Sandboxes: bwrap.
Runs on a GPU/TPU host; ``get_config("test")`` shrinks it to the tiny model on CPU.
"""

from __future__ import annotations

import ml_collections as mlc

from configs import common


def get_config(arg: str | None = None) -> mlc.ConfigDict:
    arg = common.variant(arg, __file__, "test")
    config = common.base(
        model=common.model("qwen2.5-0.5b", path="/models/Qwen2.5-0.5B-Instruct", tokenizer="", dtype="bfloat16"),
        tasks={"math": common.pool("builtin:math", split="train")},
        sandbox=common.sandbox("bwrap"),
        algorithm=common.grpo(clip_low=0.2, clip_high=0.28, aggregation="token", dynamic_sampling=True),
        optimizer=common.optimizer(1e-6, warmup_steps=10, weight_decay=0.0, microbatches=4),
        rollout=common.rollout(group_size=8, max_turns=4, max_new_tokens=512, max_context=3072, temperature=1.0),
        eval=common.evaluation({"math": common.pool("builtin:math", split="eval")}, every=10, num_tasks=10, k=8),
        loop=common.loop(steps=200, tasks_per_step=16, checkpoint_every=10, max_len=3072),
    )
    if arg == "test":
        common.cpu_test(config, steps=2, max_len=1024, num_tasks=2, k=2, max_turns=2)
    return config
