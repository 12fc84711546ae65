r"""GRPO on coding in Docker sandboxes: HumanEval-format completion and multi-turn repository repair.

    python -m rl.train --config=configs/grpo_coding.py --workdir=runs/coding \
        --config.model.path=/models/Qwen2.5-1.5B-Instruct

Domains with weights: repository repair (the agent edits files and runs the
visible tests; hidden tests decide, copied in only after it finishes) and
function completion. Reward: outcome (test pass rate) plus a small efficiency
term paid only on success. Sandboxes: the Docker backend (one host here; list
more daemons in ``sandbox.hosts`` to spread them, e.g. ``tcp://10.0.0.2:2375``).
``get_config("test")`` shrinks it to the tiny model on CPU (still in Docker).
"""

from __future__ import annotations

import ml_collections as mlc

from configs import common


def get_config(arg: str | None = None) -> mlc.ConfigDict:
    arg = common.variant(arg, __file__, "test")
    config = common.base(
        model=common.model("qwen2.5-1.5b", path="/models/Qwen2.5-1.5B-Instruct", tokenizer="", dtype="bfloat16"),
        mesh=common.mesh(data=1, fsdp=-1, tensor=1),
        tasks={
            "repair": common.pool("builtin:repair", weight=0.7, split="train"),
            "function": common.pool("humaneval", weight=0.3),
        },
        sandbox=common.sandbox("docker", hosts=("unix:///var/run/docker.sock",)),
        algorithm=common.grpo(clip_low=0.2, clip_high=0.28, dynamic_sampling=True),
        optimizer=common.optimizer(1e-6, warmup_steps=10, microbatches=8),
        rollout=common.rollout(group_size=8, max_turns=12, max_new_tokens=768, max_context=8192, env_workers=16),
        eval=common.evaluation({"repair": common.pool("builtin:repair", split="eval")}, every=10, num_tasks=7, k=4),
        loop=common.loop(steps=300, tasks_per_step=8, checkpoint_every=10, max_len=8192),
    )
    config.rollout.env_kwargs = {"repair": {"verifier": {"outcome": 1.0, "efficiency": 0.1}}}
    if arg == "test":
        common.cpu_test(config, steps=1, max_len=2048, num_tasks=1, k=0, max_turns=2)
    return config
