"""The generated repair domain's episodes: the demonstrations' pass share, their length, and their time.

What a training run on ``repair_gen`` is sized by:

* the share of demonstrations whose blind fix is right (the SFT ceiling the domain is designed
  for), over ``--demos`` training tasks, and the same share measured through the environment on
  ``--episodes`` of them (the real ``hidden_tests`` judge on bwrap);
* episode length in bytes (prompt and observations, what the model reads) and in tokens of the
  byte-level ``tiny`` model's chat format (the whole conversation, tool schemas not rendered, as the
  ``:test`` configs run it), for a blind demonstration and for a good one (each edit checked, the
  plausible fixes tried in a random order until the check passes: its max is two wrong edits first);
* seconds per episode through bwrap on a warm pool, split into reset, tool calls and verification
  (the ``submit`` step).

    python benchmarks/repair_gen_episodes.py --episodes 20

Figures are medians of a loaded machine: compare runs made side by side, not across machines.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any


def lengths(conversations: list[list[dict[str, Any]]]) -> dict[str, float]:
    """Median and max bytes read (prompt + observations) and tokens of the whole rendered conversation."""
    from rl.generation.tokenizer import ByteTokenizer

    tokenizer = ByteTokenizer()
    read = [sum(len(m["content"].encode()) for m in c if m["role"] != "assistant") for c in conversations]
    tokens = [len(tokenizer.encode_messages(c)) for c in conversations]
    return {
        "read_bytes_median": statistics.median(read),
        "read_bytes_max": max(read),
        "tokens_median": statistics.median(tokens),
        "tokens_max": max(tokens),
    }


def time_episodes(tasks: list[Any], conversations: list[list[dict[str, Any]]], backend: str) -> dict[str, Any]:
    """Plays each task's conversation through the environment: pass share and seconds per phase."""
    from envs.core import env_for_domain
    from envs.sandboxes import WarmPool

    phases: dict[str, list[float]] = {"reset": [], "tools": [], "verify": [], "total": []}
    passed, agree = 0, 0
    with WarmPool(backend) as pool:
        env = env_for_domain("repair_gen")(tasks, sandbox_factory=pool.acquire, sandbox_release=pool.release)
        try:
            for task, conversation in zip(tasks, conversations, strict=True):
                right = _right(task, conversation)
                replies = [m["content"] for m in conversation if m["role"] == "assistant"]
                start = time.perf_counter()
                env.reset(options={"task": task})
                phases["reset"].append(time.perf_counter() - start)
                mark = time.perf_counter()
                for reply in replies[:-1]:
                    env.step(reply)
                phases["tools"].append(time.perf_counter() - mark)
                mark = time.perf_counter()
                _, reward, _, _, info = env.step(replies[-1])
                phases["verify"].append(time.perf_counter() - mark)
                phases["total"].append(time.perf_counter() - start)
                passed += reward == 1.0
                agree += (reward == 1.0) == right and not info["verification"]["anomaly"]
        finally:
            env.close()
    out: dict[str, Any] = {f"{k}_s_median": round(statistics.median(v), 3) for k, v in phases.items()}
    out.update(episodes=len(tasks), pass_share=passed / len(tasks), judge_agrees_with_design=agree / len(tasks))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demos", type=int, default=2000, help="training tasks whose demonstrations are counted")
    parser.add_argument("--episodes", type=int, default=20, help="demonstrations played through the sandbox")
    parser.add_argument("--backend", default="bwrap", choices=["bwrap", "docker"])
    parser.add_argument("--seed", type=int, default=0, help="the demonstrations' seed (config.sft.options.seed)")
    args = parser.parse_args(argv)

    from envs.demonstrations import demonstrations
    from envs.domains.repair_gen.demos import demonstration
    from envs.domains.repair_gen.tasks import generate_split

    rng = random.Random(args.seed)

    tasks = generate_split("train", args.demos)
    demos = demonstrations("repair_gen", {"num_tasks": args.demos, "seed": args.seed})
    right = [_right(t, c) for t, c in zip(tasks, demos, strict=True)]
    report = {
        "demo_pass_share": round(sum(right) / len(right), 3),
        "demo_length": lengths(demos),
        "retry_episode_length": lengths([demonstration(t, rng, retry=True)[0] for t in tasks[:500]]),
    }
    if args.episodes:
        report["through_" + args.backend] = time_episodes(tasks[: args.episodes], demos[: args.episodes], args.backend)
    print(json.dumps(report, indent=1))
    return 0


def _right(task: Any, conversation: list[dict[str, Any]]) -> bool:
    """Whether the conversation's last edit writes the gold line (what the judge should reward)."""
    from envs.parsing import parse_tool_calls

    calls = [c for m in conversation if m["role"] == "assistant" for c in parse_tool_calls(m["content"]).calls]
    return [c.arguments["new"] for c in calls if c.name == "replace"][-1] == task.gold["edit"]["new"]


if __name__ == "__main__":
    raise SystemExit(main())
