r"""Repair from scratch: a tiny model learns to inspect, edit, verify and retry in a generated repository.

    python -m rl.train --config=configs/repair_from_scratch.py --workdir=runs/repair    (make repair-demo)

The agentic counterpart of the quickstart. Each task (``envs.domains.repair_gen``) is a tiny Python
module with one injected bug and a visible check; hidden tests in a separate judge process decide
the reward (the repair domain's ``hidden_tests`` verifier, on bwrap). The prompt does not show the
module, so an episode must run the check, read the file, replace a line, and, to be sure, run the
check again and try another fix while it fails, then submit.

The model is the quickstart's byte-level transformer (a wider context), trained from scratch. The
SFT warm start imitates demonstrations that are mostly *blind* (check, read, apply one plausible
fix drawn at random, submit) and a fifth that re-run the check after the edit and retry while it
fails. SFT ends when a check of sampled training episodes first passes ``until_pass_rate`` (the
model copies lines and emits well-formed calls), after a decay, or at its step cap. Sized for 2 CPU
cores (a ~30 min budget): 350 SFT steps at most, 20 GRPO steps of 4 tasks x 8, eval of 32 tasks.
Imitation alone is then right about as often as a random plausible fix is; GRPO rewards only the
episodes that end on the right fix, which a policy gets reliably by reading the check's output or by
re-running it after an edit and retrying. The before → after table reports the greedy pass rate,
pass@1, tool calls per episode and the share of passing episodes that re-checked their edit; the
time split of every RL step (decode, tools, verification, learner, waiting) is in its metrics.
Figures, the time split and what limits the run on 2 CPU cores: docs/repair_from_scratch.md.

``get_config("test")`` shrinks everything to a few steps for the test suite.
"""

from __future__ import annotations

import ml_collections as mlc

from configs import common


def get_config(arg: str | None = None) -> mlc.ConfigDict:
    arg = common.variant(arg, __file__, "test")
    config = common.base(
        seed=0,
        # The quickstart's model (see configs/quickstart.py for the initialisation), with the
        # episode's ~1.5 KB of bytes as its context.
        model=common.model("tiny", num_kv_heads=4, initializer_range=0.088),
        tasks={"repair_gen": common.pool("repair_gen:train")},
        sandbox=common.sandbox("bwrap"),  # a sandbox per episode in flight (derived from the step)
        algorithm=common.grpo(clip_low=0.2, clip_high=0.2),
        optimizer=common.optimizer(3e-4, warmup_steps=3, grad_clip_norm=1.0),
        rollout=common.rollout(
            group_size=8,
            max_turns=9,  # check, read, then up to three edits each checked, submit
            max_new_tokens=160,  # a replace call with a whole line is ~130 bytes; the demonstrations' ~70
            max_context=1792,  # a verify-and-retry episode fits (lengths: docs/repair_gen.md)
            temperature=1.0,
            render_tools=False,
            tool_timeout_s=10.0,
        ),
        sft=common.sft(
            350,  # at most (sized for 2 cores: docs/repair_from_scratch.md): SFT ends `anneal_steps` after its check passes
            data="repair_gen",
            batch_size=32,
            learning_rate=3e-3,
            warmup_steps=10,
            # a fifth of the demonstrations check after each edit and retry: the behaviour RL should
            # make the rule, present in the warm start so that sampling finds it
            options={"num_tasks": 2000, "retry_fraction": 0.2},
            check_every=50,
            check_tasks=32,
            until_pass_rate=0.15,
            anneal_steps=50,
        ),
        eval=common.evaluation(
            {"repair_gen": common.pool("repair_gen:eval")},
            every=10,
            num_tasks=32,
            k=2,
            check_tool="run_tests",
            edit_tools=("replace",),
        ),
        loop=common.loop(steps=20, tasks_per_step=4, checkpoint_every=10, max_len=1792),
    )
    if arg == "test":  # a few steps end to end, for tests/rl/test_repair_from_scratch.py
        config.sft.steps = 4
        config.sft.check_every = 0  # no check: tests/rl/test_sft_check.py covers it
        config.sft.warmup_steps = 2  # a warmup must fit in the phase's steps
        config.sft.batch_size = 4
        config.sft.options = {"num_tasks": 16}
        config.loop.steps = 3
        config.optimizer.warmup_steps = 1
        config.loop.tasks_per_step = 2
        config.loop.checkpoint_every = 1
        config.rollout.group_size = 2
        config.rollout.max_turns = 4
        config.rollout.max_new_tokens = 48
        config.eval.num_tasks = 2
        config.eval.k = 2
        config.eval.every = 2
        config.rollout.reproducible = True  # the suite compares resumed runs with uninterrupted ones bit for bit
    return config
