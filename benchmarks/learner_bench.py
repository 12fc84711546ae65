"""Learner throughput: tokens/s and GFLOP/s of an SFT and an RL step, beside this machine's f32 matmul peak.

The tiny preset (the quickstart's and the agentic demo's model family) trains on ``--batch`` rows
of ``--lengths`` tokens: one SFT step (masked cross-entropy) and one RL step (the GRPO policy
loss, no KL reference), each timed ``--repeats`` times after a compile, the median kept. The
FLOPs are the model's (the MFU convention): 6 x matmul parameters x tokens, plus causal
attention's 12 x layers x heads x head_dim x (T (T + 1) / 2) per row; the remat-free backward
is two forwards. The peak is a 2048^3 float32 matmul measured in the same run, so the percentage
says how far this step is from what the machine's matmul unit gives.

``--baseline REV`` runs the same measurement on revision ``REV`` of the library (the script is
copied into an export of it, see ``benchmarks/baseline.py``) and prints the ratio per row: the
speed-up in the same run, on the same machine. ``--splits`` adds rows with other
``LearnerConfig.microbatch_tokens`` values (0: one pass over the whole batch) for the current tree.

    python benchmarks/learner_bench.py [--lengths 512 1024 1536] [--batch 32] [--repeats 5]
                                       [--baseline 66721c6] [--splits 0] [--bf16] [--quick]

``--bf16`` adds this tree with the model computing in bfloat16 (parameters, gradients and the
optimizer stay float32): the peak printed is float32's, so that row's percentage can exceed it.

The worker relies only on ``rl.learning.learner.Learner``, ``LearnerConfig(objective=,
learning_rate=, microbatch_tokens=)``, ``rl.learning.batch.TrainBatch``, ``rl.models`` and the
byte tokenizer, which every revision since the learner landed has.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.machine import describe_machine  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """The best float32 GFLOP/s of an ``n^3`` matmul: what this machine's matmul unit gives under XLA."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    jax.block_until_ready(f(a))
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f(a))
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def model_flops(config: Any, batch: int, length: int) -> float:
    """Training FLOPs of one step (forward + backward) on ``batch`` full rows of ``length`` tokens."""
    c = config
    e, h, kv, d, m = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
    per_layer = e * h * d + 2 * e * kv * d + h * d * e + 3 * e * m
    matmul_params = c.num_layers * per_layer + e * c.vocab_size  # + the LM head
    attention = 12 * c.num_layers * h * d * (length * (length + 1) // 2)  # fwd 4 x, bwd 8 x per pair
    return batch * (6 * matmul_params * length + attention)


def measure(
    lengths: list[int], batch: int, repeats: int, split: int | None, dtype: str = "float32"
) -> list[dict[str, Any]]:
    """One row per (length, objective): median step seconds over ``repeats`` after a compile."""
    import jax
    import numpy as np
    from flax import nnx

    from rl.generation.tokenizer import ByteTokenizer
    from rl.learning.batch import TrainBatch
    from rl.learning.learner import Learner
    from rl.learning.learner_config import LearnerConfig
    from rl.models import Transformer, sharding
    from rl.models.config import get_model_config

    mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])  # one device, whatever XLA_FLAGS split
    tok = ByteTokenizer()
    rows = []
    for length in lengths:
        extra_model = {} if dtype == "float32" else {"dtype": dtype}  # what an older revision also accepts
        config = get_model_config(
            "tiny", vocab_size=tok.vocab_size, max_position_embeddings=max(4096, length), **extra_model
        )
        model = sharding.create_sharded_model(
            lambda c=config: Transformer(c, rngs=nnx.Rngs(0)), mesh, sharding.DEFAULT_RULES
        )
        rng = np.random.default_rng(0)
        tokens = rng.integers(3, tok.vocab_size, size=(batch, length)).astype(np.int32)
        train = TrainBatch(
            tokens=tokens,
            input_mask=np.ones((batch, length), bool),
            loss_mask=(rng.random((batch, length)) < 0.5).astype(np.float32),
            old_logprobs=np.full((batch, length), -3.0, np.float32),
            advantages=rng.standard_normal(batch).astype(np.float32),
            weights=np.ones(batch, np.float32),
        )
        for objective in ("sft", "policy"):
            extra = {} if split is None else {"microbatch_tokens": split}
            learner = Learner(model, mesh, LearnerConfig(objective=objective, learning_rate=1e-4, **extra))
            t = time.perf_counter()
            learner.train_step(train)
            compile_s = time.perf_counter() - t
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                learner.train_step(train)
                times.append(time.perf_counter() - t)
            step = statistics.median(times)
            flops = model_flops(config, batch, length)
            row = {"length": length, "objective": "rl" if objective == "policy" else "sft", "step_s": step,
                   "tokens_per_s": batch * length / step, "gflops": flops / step / 1e9, "compile_s": compile_s,
                   "microbatches": learner.microbatches_for((batch, length))}  # fmt: skip
            rows.append(row)
            log(f"T={length} {row['objective']}: {step:.2f} s ({row['gflops']:.0f} GFLOP/s)")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 1536])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", default="", help="a revision to measure beside this tree (e.g. 66721c6)")
    parser.add_argument("--splits", type=int, nargs="*", default=[], help="other microbatch_tokens to try here")
    parser.add_argument("--quick", action="store_true", help="4 rows of 128 tokens, 1 repeat (the suite's smoke run)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--split", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--bf16", action="store_true", help="also this tree computing in bfloat16 (float32 parameters)")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.batch, args.repeats = [128], 4, 1
    if args.worker:
        print(json.dumps(measure(args.lengths, args.batch, args.repeats, args.split, args.dtype)))
        return 0

    from benchmarks.baseline import checkout, run_worker

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees: dict[str, tuple[str, list[str]]] = {"this tree": (here, [])}
    if args.baseline:
        trees = {f"baseline {args.baseline}": (str(checkout(args.baseline)), []), **trees}
    trees.update({f"this tree, microbatch_tokens={s}": (here, ["--split", str(s)]) for s in args.splits})
    if args.bf16:
        trees["this tree, bfloat16 compute"] = (here, ["--dtype", "bfloat16"])
    variants: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for length in args.lengths:  # interleaved: a slow spell of a shared machine hits every variant alike
        for name, (tree, extra) in trees.items():
            log(f"{name}, T={length}")
            common = ["--lengths", str(length), "--batch", str(args.batch), "--repeats", str(args.repeats), *extra]
            runner = run_worker_here if tree == here else lambda _t, a, tree=tree: run_worker(Path(tree), __file__, a)
            variants[name] += runner(tree, common)
    peak = matmul_peak_gflops()

    print(f"machine: {describe_machine()}")
    print(f"float32 matmul peak (2048^3, best of 5): {peak:.0f} GFLOP/s")
    print(f"tiny preset, {args.batch} rows x T tokens, median of {args.repeats} steps after a compile\n")
    base = variants.get(f"baseline {args.baseline}")
    header = "| variant | T | step | s/step | tokens/s | GFLOP/s | % of peak | micro-batches |"
    header += " speed-up vs baseline |" if base else ""
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for name, rows in variants.items():
        for i, r in enumerate(rows):
            line = (f"| {name} | {r['length']} | {r['objective']} | {r['step_s']:.2f} | {r['tokens_per_s']:,.0f} | "
                    f"{r['gflops']:.0f} | {100 * r['gflops'] / peak:.0f}% | {r['microbatches']} |")  # fmt: skip
            if base:
                line += f" {base[i]['step_s'] / r['step_s']:.2f}x |"
            print(line)
    return 0


def run_worker_here(here: str, args: list[str]) -> list[dict[str, Any]]:
    """The worker in a fresh process of this tree (a fresh process: no program compiled by another variant)."""
    import subprocess

    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", *args], cwd=here, stdout=subprocess.PIPE, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"the worker failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
