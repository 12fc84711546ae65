"""Hugging Face checkpoints (``config.json`` + ``*.safetensors``) to and from the sharded NNX model.

Loading streams tensor by tensor: the model is built abstractly (shapes and logical names only),
then each parameter is read with ``safetensors.safe_open``, transposed / reshaped to our layout
on the host, and placed with ``jax.make_array_from_callback`` so every device receives only its
own shard. At most one checkpoint tensor (plus its transposed copy) is in host memory at a time.

Layout differences handled here (HF → ours):
  - linear weights are ``[out, in]`` in PyTorch and ``[in, out]`` here;
  - attention projections keep heads as a dimension: ``q_proj.weight [H*D, E]`` → ``[E, H, D]``,
    ``o_proj.weight [E, H*D]`` → ``[H, D, E]``.
Saving does the inverse and writes ``config.json`` with the legacy ``rope_theta`` /
``rope_scaling`` keys, which every ``transformers`` version reads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from safetensors import safe_open
from safetensors.numpy import save_file

from rl.models.config import ModelConfig, RopeScaling
from rl.models.sharding import (
    DEFAULT_RULES,
    Rules,
    abstract_model,
    host_to_sharded,
    make_mesh,
    state_shardings,
    to_host,
)
from rl.models.transformer import Transformer

log = logging.getLogger(__name__)

_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
# Tensors some checkpoints carry that the model recomputes or does not have.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A Hugging Face directory that cannot be loaded: missing files, unknown model, bad shapes."""


# ----------------------------------------------------------------------------- config.json


def config_from_hf(hf: dict[str, Any], name: str = "hf", dtype: str | None = None) -> ModelConfig:
    """``ModelConfig`` from a parsed ``config.json`` (transformers v4 or v5 key names)."""
    model_type = hf.get("model_type")
    if model_type not in _ARCHITECTURES:
        raise CheckpointError(
            f"config.json: model_type {model_type!r} (architectures={hf.get('architectures')}) is not supported; "
            f"supported: {sorted(_ARCHITECTURES)}"
        )
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"config.json: hidden_act {hf['hidden_act']!r} is not supported (only 'silu')")
    if model_type == "qwen2" and hf.get("use_sliding_window"):
        raise CheckpointError("config.json: use_sliding_window=true is not supported")
    if model_type == "llama" and (hf.get("attention_bias") or hf.get("mlp_bias")):
        raise CheckpointError("config.json: llama attention_bias / mlp_bias are not supported")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    max_positions = int(hf.get("max_position_embeddings", 32768))
    scaling = None
    if rope_type == "llama3":
        scaling = RopeScaling(
            factor=float(rope["factor"]),
            low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
            high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=_original_max_positions(hf, rope, max_positions),
        )
    elif rope_type != "default":
        raise CheckpointError(f"config.json: rope type {rope_type!r} is not supported ('default', 'llama3')")
    ckpt_dtype = str(hf.get("dtype") or hf.get("torch_dtype") or "float32")
    param_dtype = dtype or (ckpt_dtype if ckpt_dtype in _NP_DTYPES else "float32")
    heads = int(hf["num_attention_heads"])
    return ModelConfig(
        name=name,
        architecture=model_type,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qkv_bias=model_type == "qwen2",
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=max_positions,
        dtype=param_dtype,
        param_dtype=param_dtype,
    )


def _original_max_positions(hf: dict[str, Any], rope: dict[str, Any], max_positions: int) -> int:
    """The pre-training context of a scaled RoPE, resolved as ``transformers`` does.

    A top-level ``original_max_position_embeddings`` wins, then the rope dict's, then
    ``max_position_embeddings`` (``PreTrainedConfig.standardize_rope_params``); a fixed default
    (Llama 3.1's 8192) would scale different frequencies than ``transformers`` for any other model.
    """
    value = hf.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings")
    return int(value or max_positions)


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """A ``config.json`` dict that ``transformers.AutoModelForCausalLM`` loads."""
    if config.architecture == "llama" and config.qkv_bias:
        raise CheckpointError("config_to_hf: a llama model with qkv_bias has no transformers equivalent")
    if config.architecture == "qwen2" and not config.qkv_bias:
        raise CheckpointError("config_to_hf: a qwen2 model needs qkv_bias=True (transformers hard-codes it)")
    out: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[config.architecture]],
        "model_type": config.architecture,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": config.tie_embeddings,
        "torch_dtype": config.param_dtype,
    }
    if config.rope_scaling is not None:
        s = config.rope_scaling
        out["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }
    if config.architecture == "qwen2":
        out["use_sliding_window"] = False
    else:
        out["attention_bias"] = False
        out["mlp_bias"] = False
    return out


# ----------------------------------------------------------------------------- name mapping

Transform = Callable[[np.ndarray], np.ndarray]


def _param_table(config: ModelConfig) -> Iterator[tuple[tuple[Any, ...], str, Transform, Transform]]:
    """(our state path, HF name, HF→ours, ours→HF) for every parameter of ``config``."""
    e, h, kv, d = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
    t = lambda w: np.ascontiguousarray(w.T)  # noqa: E731
    same = lambda w: w  # noqa: E731
    yield ("embed",), "model.embed_tokens.weight", same, same
    yield ("final_norm", "scale"), "model.norm.weight", same, same
    if not config.tie_embeddings:
        yield ("lm_head",), "lm_head.weight", t, t
    for i in range(config.num_layers):
        hf, ours = f"model.layers.{i}", ("layers", i)
        yield (*ours, "attn_norm", "scale"), f"{hf}.input_layernorm.weight", same, same
        yield (*ours, "mlp_norm", "scale"), f"{hf}.post_attention_layernorm.weight", same, same
        for name, heads in (("q", h), ("k", kv), ("v", kv)):
            yield (
                (*ours, "attn", name),
                f"{hf}.self_attn.{name}_proj.weight",
                lambda w, n=heads: np.ascontiguousarray(w.T.reshape(e, n, d)),
                lambda w, n=heads: np.ascontiguousarray(w.reshape(e, n * d).T),
            )
            if config.qkv_bias:
                yield (
                    (*ours, "attn", f"{name}_bias"),
                    f"{hf}.self_attn.{name}_proj.bias",
                    lambda w, n=heads: w.reshape(n, d),
                    lambda w, n=heads: w.reshape(n * d),
                )
        yield (
            (*ours, "attn", "o"),
            f"{hf}.self_attn.o_proj.weight",
            lambda w: np.ascontiguousarray(w.T.reshape(h, d, e)),
            lambda w: np.ascontiguousarray(w.reshape(h * d, e).T),
        )
        for name in ("gate", "up", "down"):
            yield (*ours, "mlp", name), f"{hf}.mlp.{name}_proj.weight", t, t


# ----------------------------------------------------------------------------- loading


def _checkpoint_files(path: Path) -> dict[str, Path]:
    """HF tensor name → the safetensors file holding it."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        missing = sorted({f for f in weight_map.values() if not (path / f).exists()})
        if missing:
            raise CheckpointError(f"{index}: lists files that do not exist: {missing}")
        return {name: path / f for name, f in weight_map.items()}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors file (and no model.safetensors.index.json)")
    out: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="numpy") as handle:
            out.update(dict.fromkeys(handle.keys(), f))
    return out


def _host_device() -> Any:
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:  # JAX_PLATFORMS without cpu: the default device will do
        return jax.devices()[0]


class _TensorReader:
    """Reads tensors one at a time from a set of safetensors files, keeping handles open.

    ``safe_open(framework="numpy")`` cannot return bfloat16 (numpy has no such dtype), so those
    tensors go through ``framework="flax"`` on JAX's host CPU device and come back as
    ``ml_dtypes.bfloat16`` numpy arrays without a float32 detour.
    """

    def __init__(self, stack: contextlib.ExitStack):
        self._stack = stack
        self._handles: dict[tuple[Path, str], Any] = {}

    def _handle(self, file: Path, framework: str) -> Any:
        if (file, framework) not in self._handles:
            self._handles[file, framework] = self._stack.enter_context(safe_open(str(file), framework=framework))
        return self._handles[file, framework]

    def read(self, file: Path, name: str) -> np.ndarray:
        handle = self._handle(file, "numpy")
        if handle.get_slice(name).get_dtype() != "BF16":
            return handle.get_tensor(name)
        with jax.default_device(_host_device()):
            return np.asarray(self._handle(file, "flax").get_tensor(name))


def _resolve_tied_head(config: ModelConfig, files: dict[str, Path], path: Path) -> ModelConfig:
    """``config`` untied when ``tie_word_embeddings`` is true but ``lm_head.weight`` differs from the embedding.

    Such a config contradicts its checkpoint. ``transformers`` (>= 5, ``PreTrainedModel.tie_weights``)
    then keeps the two matrices apart and uses the checkpoint's ``lm_head.weight`` (with a
    warning); tying here would silently give other logits, so we do the same. An ``lm_head.weight``
    equal to the embedding (``.bin``-era checkpoints store both) stays tied. Reads both matrices.
    """
    embed, head = "model.embed_tokens.weight", "lm_head.weight"
    if not config.tie_embeddings or head not in files or embed not in files:
        return config
    with contextlib.ExitStack() as stack:
        reader = _TensorReader(stack)
        a = reader.read(files[embed], embed)
        b = reader.read(files[head], head)
        if a.shape == b.shape and np.array_equal(a, b):
            return config
    log.warning(
        "%s: config.json says tie_word_embeddings=true but the checkpoint's lm_head.weight differs from "
        "model.embed_tokens.weight; loading them untied, as transformers does",
        path,
    )
    return config.replace(tie_embeddings=False)


def load_hf_model(
    path: str | os.PathLike[str],
    mesh: Mesh | None = None,
    rules: Rules = DEFAULT_RULES,
    dtype: str | None = None,
    param_dtype: str | None = None,
) -> Transformer:
    """Loads a local Hugging Face Qwen2 / Llama directory into a sharded ``Transformer``.

    Args:
      path: directory with ``config.json`` and ``model.safetensors`` (or shards plus
        ``model.safetensors.index.json``).
      mesh: where to place the parameters (default: a one-device mesh).
      rules: logical-axis rules (see :mod:`rl.models.sharding`).
      dtype: compute dtype (default: the checkpoint's dtype).
      param_dtype: parameter storage dtype (default: ``dtype``).

    A config with ``tie_word_embeddings: true`` whose checkpoint holds a *different*
    ``lm_head.weight`` loads untied, with a warning: what ``transformers`` does, so the logits agree.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory")
    if not (path / "config.json").exists():
        raise CheckpointError(f"{path}: config.json is missing")
    config = config_from_hf(json.loads((path / "config.json").read_text()), name=path.name, dtype=dtype)
    config = config.replace(param_dtype=param_dtype or config.dtype)
    files = _checkpoint_files(path)
    config = _resolve_tied_head(config, files, path)
    with contextlib.ExitStack() as stack:
        reader = _TensorReader(stack)
        return place_tensors(
            config, {name: (lambda n=name: reader.read(files[n], n)) for name in files}, str(path), mesh, rules
        )


def place_tensors(
    config: ModelConfig,
    tensors: dict[str, Callable[[], np.ndarray]],
    source: str,
    mesh: Mesh | None = None,
    rules: Rules = DEFAULT_RULES,
) -> Transformer:
    """A sharded ``Transformer`` for ``config`` from Hugging Face-named tensors read one at a time.

    ``tensors`` maps each HF tensor name to a function that reads it in the HF layout; every
    parameter's tensor is read, mapped to our layout, checked against the shape ``config`` implies
    and placed, then dropped. A name the model does not use is an error (``source`` names the file).
    Shared by the safetensors and GGUF loaders, so both check the same things the same way.
    """
    mesh = mesh if mesh is not None else make_mesh({"data": 1}, devices=jax.devices()[:1])
    graphdef, abstract_state = abstract_model(lambda: Transformer(config, rules=rules))
    shardings = state_shardings(abstract_state, mesh, rules)
    target = _NP_DTYPES[config.param_dtype]
    flat = dict(nnx.to_flat_state(abstract_state))
    flat_shardings = dict(nnx.to_flat_state(shardings))
    used: set[str] = set()
    for state_path, hf_name, to_ours, _ in _param_table(config):
        if hf_name not in tensors:
            raise CheckpointError(f"{source}: tensor {hf_name!r} is missing from the checkpoint")
        tensor = to_ours(tensors[hf_name]())
        var = flat[state_path]
        if tuple(tensor.shape) != tuple(var.shape):
            raise CheckpointError(
                f"{source}: tensor {hf_name!r} has shape {tuple(tensor.shape)} after mapping to our layout, "
                f"but the model built from its config expects {tuple(var.shape)} at {'.'.join(map(str, state_path))}"
            )
        sharding = flat_shardings[state_path].get_value()
        flat[state_path] = var.replace(host_to_sharded(tensor.astype(target, copy=False), sharding))
        used.add(hf_name)
        del tensor
    unused = sorted(
        n
        for n in set(tensors) - used
        if not n.endswith(_IGNORED_SUFFIXES) and not (n == "lm_head.weight" and config.tie_embeddings)
    )
    if unused:
        raise CheckpointError(f"{source}: tensors not used by a {config.architecture} model: {unused[:10]}")
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


# ----------------------------------------------------------------------------- saving


def save_hf_model(
    model: Transformer, path: str | os.PathLike[str], max_shard_bytes: int = 2 * 1024**3, dtype: str | None = None
) -> None:
    """Writes ``config.json`` and safetensors (sharded above ``max_shard_bytes``, with an index).

    Tensors are gathered one at a time; at most one output shard is held in host memory. On a
    multi-process job every process must call this (the gathers are collective); process 0
    writes. ``dtype`` overrides the saved dtype (default: the parameter dtype).
    """
    config = model.config.replace(param_dtype=dtype) if dtype else model.config
    hf_config = config_to_hf(config)
    target = _NP_DTYPES[config.param_dtype]
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    path = Path(path)
    write = jax.process_index() == 0
    if write:
        path.mkdir(parents=True, exist_ok=True)
        # Stale shards of an earlier save would be picked up by a glob-based loader.
        for stale in [*path.glob("model*.safetensors"), path / "model.safetensors.index.json"]:
            stale.unlink(missing_ok=True)
        (path / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    current: dict[str, np.ndarray] = {}
    current_bytes = 0
    shard_names: list[list[str]] = []
    total_bytes = 0

    def flush() -> None:
        nonlocal current, current_bytes
        shard_names.append(list(current))
        if write:
            save_file(current, str(path / f"part-{len(shard_names)}.tmp"), metadata={"format": "pt"})
        current, current_bytes = {}, 0

    for state_path, hf_name, _, to_hf in _param_table(config):
        tensor = to_hf(to_host(flat[state_path].get_value())).astype(target)
        if current and current_bytes + tensor.nbytes > max_shard_bytes:
            flush()
        current[hf_name] = tensor
        current_bytes += tensor.nbytes
        total_bytes += tensor.nbytes
    flush()
    if not write:
        return
    count = len(shard_names)
    if count == 1:
        os.replace(path / "part-1.tmp", path / "model.safetensors")
        return
    weight_map: dict[str, str] = {}
    for i, names in enumerate(shard_names, start=1):
        final = f"model-{i:05d}-of-{count:05d}.safetensors"
        os.replace(path / f"part-{i}.tmp", path / final)
        weight_map.update(dict.fromkeys(names, final))
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


# ----------------------------------------------------------------------------- LoRA


def save_merged_hf_model(
    model: Transformer, path: str | os.PathLike[str], max_shard_bytes: int = 2 * 1024**3, dtype: str | None = None
) -> None:
    """Folds ``model``'s LoRA adapters into its weights and writes a plain Hugging Face checkpoint.

    The result loads with ``transformers`` (and :func:`load_hf_model`) with no adapter support;
    ``model`` keeps its adapters. Arguments as :func:`save_hf_model`.
    """
    from rl.models.lora import merge_lora

    save_hf_model(merge_lora(model), path, max_shard_bytes=max_shard_bytes, dtype=dtype)
