r"""The whole post-training pipeline on the quickstart's task: SFT, then DPO on mined pairs, then GRPO.

    python -m rl.train --config=configs/sft_dpo_grpo.py --workdir=runs/sft_dpo_grpo

The quickstart (``configs/quickstart.py``: a 0.46M-parameter byte-level model learning to call a
Python tool for 3-digit products) with a preference phase between its SFT warm start and GRPO:
when SFT ends, the policy runs 8 episodes on each of 64 training tasks, every task with both a
right and a wrong episode gives pairs (right = chosen, wrong = rejected; sandbox anomalies left
out), and DPO trains on them against the post-SFT policy as its frozen reference. Held-out
evaluations after SFT, after DPO and during RL show what each stage adds (figures in docs/preference.md).

``get_config("test")`` shrinks every phase to a few steps for the test suite. Its SFT is far too
short for the policy to ever pass, so nothing could be mined: it trains DPO on
``configs/data/arithmetic_pairs.jsonl`` instead (32 training problems, chosen = the tool
demonstration, rejected = a direct wrong answer, from ``envs.domains.arithmetic.demos``); mining
itself is tested on its own (tests/rl/test_preference_phase.py).
"""

from __future__ import annotations

from pathlib import Path

import ml_collections as mlc

from configs import common, quickstart

PAIRS = Path(__file__).resolve().parent / "data" / "arithmetic_pairs.jsonl"


def get_config(arg: str | None = None) -> mlc.ConfigDict:
    arg = common.variant(arg, __file__, "test")
    config = quickstart.get_config("test" if arg == "test" else None)
    if arg != "test":  # the SFT of the demonstration in docs/preference.md: shorter, gentler, more tool demonstrations
        config.sft.steps = 400
        config.sft.check_every = 0  # a fixed 400-step cosine, as the demonstration ran
        config.sft.learning_rate = 3e-3
        config.sft.options = {"num_tasks": 4000, "tool_fraction": 0.45}
        config.eval.every = 5
        config.model.overrides = {"num_kv_heads": 4}  # the preset's 0.02 initialisation the demonstration ran with
    # lr 1e-4: a higher rate drives the rejected episodes far down and drags the chosen ones with them,
    # and the policy forgets the task (docs/benchmarks.md, "Figures behind design choices").
    config.preference = common.preference(
        30, data="mined", batch_size=16, learning_rate=1e-4, warmup_steps=3, beta=0.1, mine_tasks=64, mine_group=8
    )
    if arg == "test":  # a few steps of every phase, for tests/rl/test_preference_phase.py
        config.preference.steps = 3
        config.preference.warmup_steps = 1
        config.preference.batch_size = 2
        config.preference.learning_rate = 1e-3  # three steps must move the margin visibly
        config.preference.data = f"jsonl:{PAIRS}"
    return config
