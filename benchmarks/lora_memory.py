r"""Device memory of one learner step, LoRA vs full fine-tuning, from XLA's own accounting.

    python benchmarks/lora_memory.py                                   # qwen2.5-0.5b and llama-3.2-1b
    python benchmarks/lora_memory.py --presets tiny --tokens 128      # a quick check
    python benchmarks/lora_memory.py --remat --logits-chunk-mib 16    # the memory-saving settings

For each preset the real learner step (:func:`rl.learning.train_step.build_train_step`, policy
objective, one micro-batch, AdamW with gradient clipping) is lowered and compiled on *abstract*
arrays (``nnx.eval_shape`` for the model, ``jax.ShapeDtypeStruct`` for the batch and optimizer
state): no weight is ever materialised, so a 1B model costs only its compile time. Compiled
with donation of the trained parameters, optimizer state and step counter, as the learner does.
The figures come from ``compiled.memory_analysis()``:

  - **argument**: every input buffer: the trained parameters and their AdamW moments (``mu``,
    ``nu``), the frozen rest of the module (for LoRA: all base weights; for full fine-tuning:
    nothing but RNG state) and the batch.
  - **output**: new parameters, new optimizer state, metrics.
  - **alias**: output bytes written into donated input buffers (counted once, not twice).
  - **temp**: XLA's scratch for the step: activations kept for the backward pass, their
    cotangents, the LM head's logits, the float32 gradient accumulator (one per trained
    parameter), the update.
  - **total** = argument + output - alias + temp: every buffer of the step allocated at once, the
    number that must fit on one device (an upper bound: XLA already shares temp buffers whose
    lifetimes do not overlap, but counts the whole argument and output). (jax 0.10's CPU
    ``peak_memory_in_bytes`` reports the arguments alone, so it is not shown.)

Each preset is measured twice, with the same LM head for both modes: chunked
(``LearnerConfig.logits_chunk_mib``, default 64 MiB of float32 logits per chunk, see
:mod:`rl.learning.lm_head`) and with all ``[B, T, vocab]`` logits at once (``0``, the step before
the chunked head).

``--remat`` turns on ``LearnerConfig.remat`` for both modes (each layer's activations recomputed in
the backward pass). On XLA:CPU that only pays with the memory-minimising scheduler: the default
one, tuned for concurrency, runs every layer's recomputation as soon as its input exists, ahead of
the backward pass, so all of them are alive at once. The flag sets
``XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false`` for this process, as a CPU
user of ``remat`` should; accelerators' schedulers are memory-aware already.

Full fine-tuning: every weight is trained (bf16 parameters as the presets use, f32 gradient
accumulator, bf16 AdamW moments). LoRA: rank ``--rank`` adapters (float32) on all seven
projections (q, k, v, o, gate, up, down) of every layer, the base frozen. The batch is
``--batch`` rows of ``--tokens`` tokens. CPU's compiler plans memory like the accelerator
back ends (buffer assignment), but fusion, layouts and scheduling differ (e.g. XLA:CPU keeps a
transposed copy of a tied embedding for the LM head). The model's projections are bf16 x bf16 ->
f32 matmuls (:mod:`rl.models.projection`) because XLA:CPU would otherwise run them on float32
copies of the weights and keep those from the forward to the backward pass. Treat the absolute
numbers as estimates and the ratio as the result.
"""

from __future__ import annotations

import argparse
import os
import sys

if "--remat" in sys.argv:  # before JAX starts its CPU client (see the module docstring)
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_concurrency_optimized_scheduler=false"
    ).strip()
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.machine import describe_machine  # noqa: E402
from rl.learning.batch import TrainBatch  # noqa: E402
from rl.learning.learner import BATCH_FIELDS  # noqa: E402
from rl.learning.learner_config import LearnerConfig  # noqa: E402
from rl.learning.train_step import build_train_step, make_optimizer  # noqa: E402
from rl.models import Transformer, get_model_config  # noqa: E402
from rl.models.lora import TARGETS, LoRAConfig, LoRAParam, apply_lora  # noqa: E402
from rl.models.sharding import DEFAULT_RULES  # noqa: E402


def _abstract_batch(b: int, t: int) -> TrainBatch:
    return TrainBatch(**{k: jax.ShapeDtypeStruct((b, t)[:rank], dtype) for k, (dtype, rank) in BATCH_FIELDS.items()})


def _size(tree: Any) -> int:
    return sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def measure(
    preset: str,
    lora: LoRAConfig | None,
    batch: int,
    tokens: int,
    dtype: str = "",
    chunk_mib: int = 0,
    remat: bool = False,
) -> dict[str, Any]:
    """Compiles one train step on abstract arrays and returns XLA's memory figures (bytes).

    ``dtype`` (e.g. ``"float32"``) overrides the preset's parameter and compute dtype; ``chunk_mib``
    is ``LearnerConfig.logits_chunk_mib`` (0: all logits at once).
    """
    config = get_model_config(preset, **({"dtype": dtype, "param_dtype": dtype} if dtype else {}))

    def factory() -> Transformer:
        model = Transformer(config)
        return apply_lora(model, lora) if lora is not None else model

    model = nnx.eval_shape(factory)
    trained = LoRAParam if lora is not None else nnx.Param
    graphdef = nnx.graphdef(model)
    params, rest = nnx.state(model, trained, ...)
    trainable = "lora" if lora else "all"
    learner = LearnerConfig(
        objective="policy", learning_rate=1e-5, trainable=trainable, logits_chunk_mib=chunk_mib, remat=remat
    )
    tx, _ = make_optimizer(learner)
    opt_state = jax.eval_shape(tx.init, params)
    step_fn = build_train_step(graphdef, learner, "policy", DEFAULT_RULES, None)
    args = (params, opt_state, jax.ShapeDtypeStruct((), jnp.int32), None, rest, _abstract_batch(batch, tokens))
    start = time.perf_counter()
    compiled = jax.jit(step_fn, donate_argnums=(0, 1, 2)).lower(*args).compile()
    seconds = time.perf_counter() - start
    mem = compiled.memory_analysis()
    arg, out = mem.argument_size_in_bytes, mem.output_size_in_bytes
    alias, temp = mem.alias_size_in_bytes, mem.temp_size_in_bytes
    return {
        "trained": sum(x.size for x in jax.tree.leaves(params)),
        "weights": _size(nnx.state(model, nnx.Param)),
        "opt_state": _size(opt_state),
        "argument": arg,
        "output": out,
        "alias": alias,
        "temp": temp,
        "total": arg + out - alias + temp,
        "compile_s": seconds,
    }


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["qwen2.5-0.5b", "llama-3.2-1b"])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--dtype", default="", help="override the presets' dtypes (default: their own, bfloat16)")
    parser.add_argument("--logits-chunk-mib", type=int, default=LearnerConfig().logits_chunk_mib)
    parser.add_argument("--remat", action="store_true", help="LearnerConfig.remat for both modes (see above)")
    args = parser.parse_args()
    lora = LoRAConfig(rank=args.rank, alpha=2.0 * args.rank, target_modules=TARGETS)
    print(f"machine: {describe_machine()}; jax {jax.__version__} on {jax.devices()[0].platform}")
    dtypes = args.dtype or "preset dtypes"
    remat = ", remat (memory-minimising XLA:CPU scheduler)" if args.remat else ""
    print(
        f"one train step, batch {args.batch} x {args.tokens} tokens, {dtypes}, LoRA rank {args.rank} on all 7{remat}\n"
    )
    header = "| preset | LM head | mode | trained params | optimizer state GiB | argument GiB | output GiB |"
    print(header + " alias GiB | temp GiB | total GiB | total LoRA/full | compile s |")
    print("|" + "---|" * 12)
    heads = ((args.logits_chunk_mib, f"chunked, {args.logits_chunk_mib} MiB"), (0, "all logits at once"))
    for preset in args.presets:
        for chunk, head in heads:
            full = measure(preset, None, args.batch, args.tokens, args.dtype, chunk, args.remat)
            adapted = measure(preset, lora, args.batch, args.tokens, args.dtype, chunk, args.remat)
            for mode, m in (("full", full), (f"LoRA r={args.rank}", adapted)):
                cells = [preset, head, mode, f"{m['trained'] / 1e6:.2f}M", _gib(m["opt_state"])]
                cells += [_gib(m[k]) for k in ("argument", "output", "alias", "temp", "total")]
                cells += [f"{m['total'] / full['total']:.3f}", f"{m['compile_s']:.0f}"]
                print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
