"""Rollout throughput: lock-step vs the decode engine, synchronous and with ``max_staleness=1``.

A multi-turn tool-use mix with a long tail: each episode takes ``--turns`` turns; each tool call
(an environment step) takes ~10 ms, except one in ten which takes ~2 s (which ones follows from a
hash of the episode and turn, so every variant sees the same latencies). The policy is a small
random transformer on this machine's CPU (or GPU); tool calls are environment steps that sleep
(the sandbox's own speed is ``benchmarks/sandbox_bench.py``'s business). Every variant runs
``--steps`` training steps of ``--tasks x --group`` episodes, with a real learner update per step:

- ``lock-step``: :class:`rl.rollout.lockstep.Rollout` and the bucketed sampler (the reference);
- ``engine sync``: :class:`rl.rollout.engine_rollout.EngineRollout` (tools through the scheduler),
  then the update;
- ``engine stale=1``: the same, with step ``u + 1`` sampled while the learner updates on ``u``
  and started while step ``u``'s stragglers still run (:class:`rl.rollout.producer.RolloutProducer`).

It prints episodes/s, generated tokens/s, prefill tokens per episode (lock-step prefills every
turn's whole context; the engine only what is new) and the ratio to lock-step.

    python benchmarks/rollout_bench.py [--steps 6] [--tasks 8] [--group 4] [--turns 4] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zlib
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.machine import describe_machine  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class LatencyEnv:
    """An environment whose every step is a tool call of a set latency; ends after ``turns`` turns."""

    hold_sandbox = False

    def __init__(self, domain: str, turns: int, slow_s: float, fast_s: float, slow_share: float):
        self.domain, self.turns = domain, turns
        self.slow_s, self.fast_s, self.slow_share = slow_s, fast_s, slow_share
        self.task_id, self.turn, self.seed = "", 0, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        task = options["task"]
        self.task_id, self.turn, self.seed = task.id, 0, seed or 0
        messages = [{"role": "user", "content": task.prompt}]
        return task.prompt, {"messages": messages, "tools": []}

    def step_sandbox(self, action: str) -> None:
        return None

    def step(self, action: str):
        self.turn += 1
        slow = zlib.crc32(f"{self.seed}/{self.turn}".encode()) % 1000 < self.slow_share * 1000
        time.sleep(self.slow_s if slow else self.fast_s)
        observation = f"exit code 0; output: {self.turn * 37 % 1000} (call {self.turn})"
        info: dict[str, Any] = {"tool_calls": [{"name": "python"}]}
        if self.turn >= self.turns:
            info["verification"] = {"reward": float(self.seed % 2), "passed": bool(self.seed % 2), "anomaly": None}
            info["episode"] = {"tool_calls": [], "end_reason": "max_turns"}
            return observation, 0.0, False, True, info
        return observation, 0.0, False, False, info

    def close(self) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--slow-s", type=float, default=2.0)
    parser.add_argument("--fast-s", type=float, default=0.01)
    parser.add_argument("--slow-share", type=float, default=0.1)
    parser.add_argument("--quick", action="store_true", help="2 steps of 4 tasks")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.tasks = 2, 4

    import jax
    from flax import nnx

    from envs import Task
    from envs.sandboxes import Host, LentSandboxes, Scheduler, WarmPool
    from rl.generation.engine import DecodeEngine
    from rl.generation.engine_config import EngineConfig
    from rl.generation.sampler import Sampler, SamplerConfig
    from rl.generation.tokenizer import ByteTokenizer
    from rl.learning.learner import Learner
    from rl.learning.learner_config import LearnerConfig
    from rl.models import Transformer, sharding
    from rl.models.config import get_model_config
    from rl.rollout.engine_rollout import EngineRollout
    from rl.rollout.episode_driver import EnvCache, RolloutConfig
    from rl.rollout.episodes import assign_advantages, train_batch
    from rl.rollout.lockstep import Rollout
    from rl.rollout.producer import Produced, RolloutProducer

    mesh = sharding.make_mesh({"data": 1})
    tok = ByteTokenizer()
    config = get_model_config("tiny", vocab_size=tok.vocab_size, max_position_embeddings=1024)
    context = 96 + args.turns * (args.new_tokens + 48)
    rollout_cfg = RolloutConfig(
        group_size=args.group, max_turns=args.turns, max_new_tokens=args.new_tokens, max_context=context,
        render_tools=False, env_workers=args.tasks * args.group, step_deadline_s=120.0,
    )  # fmt: skip
    episodes = args.tasks * args.group

    def make_envs() -> EnvCache:
        return EnvCache(lambda d: LatencyEnv(d, args.turns, args.slow_s, args.fast_s, args.slow_share))

    def tasks_of(step: int) -> list[Task]:
        return [
            Task(f"t{step}-{i}", "latency", f"Compute {step * 97 + i} * 3 with the tool.") for i in range(args.tasks)
        ]

    def fresh_model() -> Transformer:
        return sharding.create_sharded_model(
            lambda: Transformer(config, rngs=nnx.Rngs(0)), mesh, sharding.DEFAULT_RULES
        )

    def learn(model: Transformer, learner: Learner, produced: Produced) -> None:
        assign_advantages(produced.result.episodes)
        batch = train_batch(produced.result.episodes, pad_id=tok.pad_id, batch_multiple=learner.batch_multiple,
                            max_len=context + args.new_tokens)  # fmt: skip
        if batch is not None:
            learner.train_step(batch)

    pool = WarmPool(Host("bwrap", capacity=episodes))
    scheduler = Scheduler(pool, log_interval_s=None, max_running=episodes)
    rows = []

    def run_variant(name: str, kind: str, staleness: int = 0) -> None:
        model = fresh_model()
        learner = Learner(model, mesh, LearnerConfig(learning_rate=1e-4, total_steps=args.steps + 2))
        if kind == "lockstep":
            buckets = SamplerConfig(batch_buckets=(1, 2, 4, 8, 16, 32, 64, 128))
            rollout: Any = Rollout(Sampler(model, tok, mesh, buckets), tok, rollout_cfg, make_envs())
        else:
            lender = LentSandboxes(pool.acquire, pool.release)
            engine_cfg = EngineConfig(slots=episodes, max_len=context + args.new_tokens, decode_steps=4,
                                      window_min=context + args.new_tokens, prefill_rows=8,
                                      prefill_buckets=(16, 32, 64, 128, 256))  # fmt: skip
            engine = DecodeEngine(model, tok, mesh, engine_cfg)
            rollout = EngineRollout(engine, tok, rollout_cfg, make_envs(), scheduler, lender)

        def finish(step: int, tasks: list[Task], result: Any) -> Produced:
            return Produced(step, tasks, result, None)

        # Warm-up step (compiles), not timed.
        learn(model, learner, finish(0, tasks_of(0), rollout.run(tasks_of(0), step=0, policy_version=-1)))
        t0 = time.perf_counter()
        produced = []
        if staleness:
            producer = RolloutProducer(rollout, tasks_of, finish, model, staleness=staleness, rl_start=0, first=1,
                                       last=args.steps)  # fmt: skip
            producer.start()
            producer.publish(0)
            for step in range(1, args.steps + 1):
                produced.append(producer.take(step))
                learn(model, learner, produced[-1])
                producer.publish(step)
            producer.stop()
        else:
            for step in range(1, args.steps + 1):
                tasks = tasks_of(step)
                produced.append(finish(step, tasks, rollout.run(tasks, step=step, policy_version=step - 1)))
                learn(model, learner, produced[-1])
        wall = time.perf_counter() - t0
        eps = [e for p in produced for e in p.result.episodes]
        sampled = sum(e.sampled_tokens for e in eps)
        if kind == "lockstep":  # every turn re-prefills the whole context
            prefill = sum(
                sum(i for i in range(1, len(e.loss_mask)) if e.loss_mask[i] == 1 and e.loss_mask[i - 1] == 0)
                for e in eps
            )
        else:
            prefill = sum(p.result.timing["prefill_tokens"] for p in produced)
        rows.append((name, len(eps) / wall, sampled / wall, prefill / len(eps), wall))
        log(f"{name}: {len(eps)} episodes in {wall:.1f}s")
        rollout.close()

    try:
        run_variant("lock-step Rollout (reference)", "lockstep")
        run_variant("engine, synchronous RL", "engine")
        run_variant("engine, max_staleness=1", "engine", staleness=1)
    finally:
        scheduler.close(cancel=True)
        pool.close()
    print(f"machine: {describe_machine()}; jax {jax.__version__} on {jax.devices()[0].platform}")
    print(
        f"{args.steps} steps x {episodes} episodes, {args.turns} turns, {args.new_tokens} new tokens/turn; "
        f"tool latency {args.fast_s * 1000:.0f} ms, {args.slow_share:.0%} at {args.slow_s:.1f} s; tiny model"
    )
    ref = rows[0]
    print(
        f"{'variant':32s} {'episodes/s':>10s} {'tokens/s':>9s} {'prefill/ep':>10s} {'wall s':>7s} {'vs lock-step':>12s}"
    )
    for name, eps_s, tok_s, prefill, wall in rows:
        print(f"{name:32s} {eps_s:10.2f} {tok_s:9.0f} {prefill:10.0f} {wall:7.1f} {eps_s / ref[1]:11.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
