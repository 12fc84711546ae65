"""One RL step of the agentic demo from a fixed checkpoint: this tree beside a baseline revision, in one run.

The step is ``configs/repair_from_scratch.py``'s, run by each revision's own CLI as it ships:
``--episodes`` repair_gen episodes (``--episodes / 8`` tasks x group 8), through the engine with
multi-turn KV reuse, the sandbox scheduler, bwrap and the hidden-tests judge, then the learner's
update. Every variant resumes from the same SFT checkpoint (made once, by the baseline's CLI, with
``--sft-steps`` steps of the config's SFT; kept in ``--cache``), so its episodes start from the same
weights and seeds, and the bench says whether they came out token-identical.

Each variant runs twice: the first run fills a compilation cache of its own, the second is
measured, so a figure is the step, not XLA's compiler. A run takes two RL steps: the first loads
every program from that cache (a few hundred milliseconds each), the second runs on them and is
the step's figure (its episodes come from the policy the first step trained, so they match across
variants only up to the learner's float rounding). Printed per variant and step: the RL step and its
time split (``time/*``: prefill and decode where the revision reports them, tools, judge,
learner, waiting), the engine's real and padded prefill and decode tokens and its average active
slots, and the process's peak RSS; then the ratio of the steps.

    python benchmarks/agentic_step_bench.py [--baseline 66721c6] [--exact] [--episodes 32] [--sft-steps 40]
                                            [--cache DIR] [--no-warmup] [--quick]

``--exact`` adds this tree with ``rollout.reproducible=True`` (every engine shape fixed): what the
bit-for-bit mode costs.

``--quick`` (the suite's smoke run): the config's ``:test`` variant, 2 SFT steps, 4 episodes, no baseline.
It relies on each revision's ``python -m rl.train`` and its ``metrics.jsonl`` and
``trajectories/step_*.npz`` files, which every revision since the engine rollout has.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.machine import describe_machine  # noqa: E402

HERE = Path(__file__).resolve().parent.parent
CONFIG = "configs/repair_from_scratch.py"
RL_STEPS = 2  # the first loads every program (from the warm-up's compilation cache); the second is the figure
SPLIT = ("time/prefill_s", "time/decode_s", "time/tools_s", "time/verify_s", "time/learn_s", "time/wait_s")
ENGINE = ("prefill_tokens", "prefill_tokens_padded", "decode_tokens", "decode_tokens_padded", "active_slots_mean")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_cli(tree: Path, args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """``python -m rl.train ARGS`` in ``tree``: (wall seconds, peak RSS of that process in GB)."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl.train", *args],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()))
    reader.start()
    _, status, usage = os.wait4(proc.pid, 0)  # the child's own rusage: its peak RSS
    reader.join()
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    if code != 0:
        sys.stderr.write("".join(err)[-3000:])
        raise SystemExit(f"rl.train in {tree} failed (exit {code})")
    return time.perf_counter() - t, usage.ru_maxrss / 1e6


def sft_args(steps: int, quick: bool) -> list[str]:
    config = f"--config={CONFIG}:test" if quick else f"--config={CONFIG}"
    return [
        config,
        f"--config.sft.steps={steps}",
        "--config.sft.check_every=0",
        "--config.sft.anneal_steps=0",
        "--config.sft.warmup_steps=1",
        "--config.eval.every=0",
        "--config.eval.num_tasks=1",
        "--config.eval.k=0",
    ]


def make_checkpoint(tree: Path, cache: Path, steps: int, quick: bool) -> Path:
    """The SFT checkpoint every variant resumes from: made once with ``tree``'s CLI, kept in ``cache``."""
    workdir = cache / f"sft{steps}{'-quick' if quick else ''}"
    if (workdir / "checkpoints" / str(steps)).is_dir():
        return workdir
    shutil.rmtree(workdir, ignore_errors=True)
    log(f"making the SFT-{steps} checkpoint with {tree} (once; kept in {workdir})")
    run_cli(tree, [*sft_args(steps, quick), f"--workdir={workdir}", "--config.loop.steps=0"], {})
    return workdir


def rl_steps(
    tree: Path, checkpoint: Path, steps: int, episodes: int, quick: bool, cache_dir: Path, extra: list[str]
) -> dict[str, Any]:
    """Two RL steps (``steps + 1`` and ``steps + 2``) resumed from ``checkpoint`` by ``tree``'s CLI in a
    fresh workdir: the first loads the engine's and the learner's programs, the second runs on them."""
    workdir = Path(tempfile.mkdtemp(prefix="agentic-step-"))
    try:
        shutil.copytree(checkpoint / "checkpoints" / str(steps), workdir / "checkpoints" / str(steps))
        group = 2 if quick else 8
        args = [
            *sft_args(steps, quick),
            f"--workdir={workdir}",
            f"--config.loop.steps={RL_STEPS}",
            "--config.optimizer.warmup_steps=1",
            f"--config.loop.tasks_per_step={max(1, episodes // group)}",
            f"--config.rollout.group_size={group}",
            "--config.loop.checkpoint_every=1000",
            *extra,
        ]
        env = {
            "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        }
        wall, rss = run_cli(tree, args, env)
        lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        import numpy as np

        out = {"wall_s": wall, "peak_rss_gb": rss, "steps": []}
        for step in range(steps + 1, steps + RL_STEPS + 1):
            metrics = next(m for m in lines if m.get("step") == step and "time/step_s" in m)
            arrays = np.load(workdir / "trajectories" / f"step_{step:08d}.npz")
            offsets, ids = arrays["offsets"], arrays["token_ids"]
            tokens = [ids[a:b].tobytes().hex() for a, b in itertools.pairwise(offsets)]
            out["steps"].append({"step": step, "metrics": metrics, "episodes": tokens})
        return out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="", help="a revision to measure beside this tree (e.g. 66721c6)")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--sft-steps", type=int, default=40)
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "agentrl-agentic-bench"))
    parser.add_argument("--no-warmup", action="store_true", help="measure the first run (compiles included)")
    parser.add_argument("--exact", action="store_true", help="also this tree with rollout.reproducible=True")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.sft_steps, args.baseline, args.no_warmup = 4, 2, "", True

    from benchmarks.baseline import checkout

    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    trees: dict[str, tuple[Path, list[str]]] = {"this tree": (HERE, [])}
    if args.baseline:
        trees = {f"baseline {args.baseline}": (checkout(args.baseline), []), **trees}
    if args.exact:
        trees["this tree, rollout.reproducible"] = (HERE, ["--config.rollout.reproducible=True"])
    checkpoint = make_checkpoint(next(iter(trees.values()))[0], cache, args.sft_steps, args.quick)
    results = {}
    for name, (tree, extra) in trees.items():
        compile_cache = Path(tempfile.mkdtemp(prefix="agentic-jax-cache-"))
        try:
            if not args.no_warmup:
                log(f"{name}: a first run, to fill its compilation cache")
                rl_steps(tree, checkpoint, args.sft_steps, args.episodes, args.quick, compile_cache, extra)
            log(f"{name}: the measured run")
            results[name] = rl_steps(tree, checkpoint, args.sft_steps, args.episodes, args.quick, compile_cache, extra)
        finally:
            shutil.rmtree(compile_cache, ignore_errors=True)
        log(f"{name}: RL steps " + ", ".join(f"{s['metrics']['time/step_s']:.1f} s" for s in results[name]["steps"]))

    print(f"machine: {describe_machine()}")
    print(
        f"{CONFIG}{':test' if args.quick else ''}: RL steps of {args.episodes} repair_gen episodes resumed from the "
        f"SFT-{args.sft_steps} checkpoint; {'first run' if args.no_warmup else 'second run, compilation cached'}; "
        "the first step loads every program, the second is the step\n"
    )
    header = ["variant", "step", "RL step", "generate", *(k.split("/")[1][:-2] for k in SPLIT), "peak RSS"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name, r in results.items():
        for st in r["steps"]:
            m = st["metrics"]
            cells = [name, str(st["step"]), f"{m['time/step_s']:.1f} s", f"{m['time/generate_s']:.1f} s"]
            cells += [f"{m[k]:.1f} s" if k in m else "-" for k in SPLIT]
            cells.append(f"{r['peak_rss_gb']:.2f} GB")
            print("| " + " | ".join(cells) + " |")
    print()
    header = ["variant", "step", *ENGINE, "prefill padded / real", "decode padded / real"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name, r in results.items():
        for st in r["steps"]:
            m = st["metrics"]
            cells = [name, str(st["step"])]
            cells += [f"{m[f'rollout/{k}']:,.1f}" if f"rollout/{k}" in m else "-" for k in ENGINE]
            for kind in ("prefill", "decode"):
                real, padded = m.get(f"rollout/{kind}_tokens"), m.get(f"rollout/{kind}_tokens_padded")
                cells.append(f"{padded / real:.2f}x" if real and padded else "-")
            print("| " + " | ".join(cells) + " |")
    names = list(results)
    print()
    for other in names[1:]:
        a, b = results[names[0]], results[other]
        for sa, sb in zip(a["steps"], b["steps"], strict=True):
            ratio = sa["metrics"]["time/step_s"] / sb["metrics"]["time/step_s"]
            same = sum(x == y for x, y in zip(sa["episodes"], sb["episodes"], strict=False))
            print(
                f"step {sa['step']}: {other} / {names[0]}: {ratio:.2f}x faster; "
                f"episodes token-identical: {same} of {len(sa['episodes'])}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
