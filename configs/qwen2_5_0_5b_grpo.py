r"""Qwen2.5-0.5B-Instruct on GPU/TPU: GRPO over a mix of math, coding repair and shell tasks.

On a machine with the weights on local disk (download them elsewhere, e.g.
``huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --local-dir /models/Qwen2.5-0.5B-Instruct``):

    python -m rl.train --config=configs/qwen2_5_0_5b_grpo.py --workdir=runs/qwen05 \
        --config.model.path=/models/Qwen2.5-0.5B-Instruct

One GPU: the default mesh puts everything on ``fsdp=-1`` (all local devices).
A TPU v5e-8 or 8 GPUs: ``--config.mesh.shape.fsdp=4 --config.mesh.shape.tensor=2``.
Multi-host: launch the same command on every host with ``JAX_COORDINATOR_ADDRESS``,
``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` set (``rl.run.distributed`` calls
``jax.distributed.initialize()``): each process samples its share of the episodes, only
process 0 writes run files, and a failure or SIGTERM in one process stops them all.
Sandboxes go to Docker; add more daemons to ``sandbox.hosts``.
``get_config("test")`` shrinks it to the tiny model on CPU (still in Docker).
"""

from __future__ import annotations

import ml_collections as mlc

from configs import common


def get_config(arg: str | None = None) -> mlc.ConfigDict:
    arg = common.variant(arg, __file__, "test")
    config = common.base(
        model=common.model("qwen2.5-0.5b", path="/models/Qwen2.5-0.5B-Instruct", tokenizer="", dtype="bfloat16"),
        mesh=common.mesh(data=1, fsdp=-1, tensor=1),
        tasks={
            "math": common.pool("builtin:math", weight=0.4, split="train"),
            "repair": common.pool("builtin:repair", weight=0.3, split="train"),
            "shell": common.pool("builtin:shell", weight=0.3, split="train"),
        },
        sandbox=common.sandbox("docker"),
        algorithm=common.grpo(advantage="dr_grpo", aggregation="constant", clip_high=0.28, dynamic_sampling=True),
        optimizer=common.optimizer(1e-6, warmup_steps=10, microbatches=4),
        rollout=common.rollout(group_size=8, max_turns=8, max_new_tokens=512, max_context=4096, env_workers=32),
        eval=common.evaluation(
            {"math": common.pool("builtin:math", split="eval"), "repair": common.pool("builtin:repair", split="eval")},
            every=20,
            num_tasks=17,
            k=8,
        ),
        loop=common.loop(steps=500, tasks_per_step=32, checkpoint_every=20, max_len=4096, pack_sequences=False),
    )
    if arg == "test":
        common.cpu_test(config, steps=1, max_len=1024, num_tasks=2, k=0, max_turns=2)
    return config
