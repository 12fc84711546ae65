"""Shapes and numerics of a Llama / Qwen2-family decoder (`ModelConfig`) and the preset registry.

A config is a frozen host-side dataclass, validated on construction so that a typo in a preset or
a bad ``config.json`` fails with the field's name instead of as a shape error deep inside jit.
Presets carry the real shapes of the public checkpoints, so a model can be built abstractly (for
memory planning, sharding dry runs) without the weights; loading real weights goes through
:func:`rl.models.hf.load_hf_model`, which derives the config from the checkpoint's own
``config.json`` and never trusts a preset name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax.numpy as jnp

Architecture = Literal["qwen2", "llama"]
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _check(cond: bool, field: str, expected: str, value: Any) -> None:
    if not cond:
        raise ValueError(f"ModelConfig.{field}: expected {expected}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama-3 ("llama3") frequency-dependent RoPE scaling, as in the Llama 3.1 / 3.2 checkpoints.

    Low frequencies (long wavelengths) are divided by ``factor``, high ones are kept, and the band
    in between is interpolated; see ``rl.models.rope.rope_frequencies``.
    """

    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    rope_type: Literal["llama3"] = "llama3"

    def __post_init__(self) -> None:
        if self.rope_type != "llama3":
            raise ValueError(f"RopeScaling.rope_type: only 'llama3' is implemented, got {self.rope_type!r}")
        if not self.factor >= 1.0:
            raise ValueError(f"RopeScaling.factor: expected >= 1, got {self.factor!r}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                "RopeScaling.low_freq_factor/high_freq_factor: expected 0 < low < high, "
                f"got {self.low_freq_factor!r}, {self.high_freq_factor!r}"
            )
        if self.original_max_position_embeddings <= 0:
            raise ValueError(
                f"RopeScaling.original_max_position_embeddings: expected > 0, got {self.original_max_position_embeddings!r}"
            )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only transformer (RMSNorm, RoPE, GQA, SwiGLU).

    Attributes:
      name: preset or checkpoint name; informational.
      architecture: ``"qwen2"`` or ``"llama"``; decides the Hugging Face ``model_type`` on save.
      vocab_size: rows of the embedding table (may exceed the tokenizer's vocabulary: padding).
      hidden_size: width of the residual stream.
      intermediate_size: width of the SwiGLU hidden layer.
      num_layers: decoder blocks.
      num_heads: query heads.
      num_kv_heads: key/value heads (grouped-query attention); must divide ``num_heads``.
      head_dim: per-head width; ``hidden_size // num_heads`` for every preset here.
      rope_theta: RoPE base frequency.
      rope_scaling: optional Llama-3 long-context scaling of the RoPE frequencies.
      rms_norm_eps: epsilon of every RMSNorm.
      qkv_bias: biases on the q/k/v projections (Qwen2 has them, Llama does not).
      tie_embeddings: the LM head reuses the embedding table.
      max_position_embeddings: longest context the checkpoint was trained for (checked by the
        sampler, not by the model).
      dtype: compute dtype of activations and the KV cache.
      param_dtype: storage dtype of parameters; ``float32`` params with ``bfloat16`` compute is
        the usual learner setting.
      initializer_range: standard deviation of the normal initialisation of every weight matrix
        and the embedding (Hugging Face's name for it), for models trained from scratch. 0.02 suits
        wide models; a narrow one learns attention patterns sooner with about ``hidden_size**-0.5``
        (the quickstart's copy skill arrives at SFT step ~100-250 instead of ~150-500+, by seed).
    """

    name: str
    architecture: Architecture
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False
    tie_embeddings: bool = False
    max_position_embeddings: int = 32768
    dtype: str = "float32"
    param_dtype: str = "float32"
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        _check(self.architecture in ("qwen2", "llama"), "architecture", "'qwen2' or 'llama'", self.architecture)
        for field in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, field)
            _check(isinstance(value, int) and not isinstance(value, bool) and value > 0, field, "an int > 0", value)
        _check(
            self.num_heads % self.num_kv_heads == 0,
            "num_kv_heads",
            f"a divisor of num_heads={self.num_heads}",
            self.num_kv_heads,
        )
        _check(self.head_dim % 2 == 0, "head_dim", "an even number (RoPE rotates pairs)", self.head_dim)
        _check(self.rope_theta > 0, "rope_theta", "> 0", self.rope_theta)
        _check(0 < self.rms_norm_eps < 1, "rms_norm_eps", "in (0, 1)", self.rms_norm_eps)
        _check(
            self.rope_scaling is None or isinstance(self.rope_scaling, RopeScaling),
            "rope_scaling",
            "None or a RopeScaling",
            self.rope_scaling,
        )
        _check(
            isinstance(self.initializer_range, float) and 0 < self.initializer_range < 1,
            "initializer_range",
            "a float in (0, 1)",
            self.initializer_range,
        )
        _check(self.dtype in _DTYPES, "dtype", f"one of {sorted(_DTYPES)}", self.dtype)
        _check(self.param_dtype in _DTYPES, "param_dtype", f"one of {sorted(_DTYPES)}", self.param_dtype)

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(_DTYPES[self.dtype])

    @property
    def params_dtype(self) -> jnp.dtype:
        return jnp.dtype(_DTYPES[self.param_dtype])

    @property
    def num_params(self) -> int:
        """Exact parameter count (biases and norms included), without building the model."""
        e, h, kv, d = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        attn = e * h * d * 2 + e * kv * d * 2 + (h * d + 2 * kv * d if self.qkv_bias else 0)
        mlp = 3 * e * self.intermediate_size
        per_layer = attn + mlp + 2 * e
        embed = self.vocab_size * e * (1 if self.tie_embeddings else 2)
        return self.num_layers * per_layer + embed + e

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again), e.g. ``cfg.replace(dtype="bfloat16")``."""
        return dataclasses.replace(self, **changes)


def _qwen25(name: str, **kw: Any) -> ModelConfig:
    base = dict(
        architecture="qwen2",
        vocab_size=151936,
        head_dim=128,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        qkv_bias=True,
        max_position_embeddings=32768,
        dtype="bfloat16",
        param_dtype="bfloat16",
    )
    return ModelConfig(name=name, **{**base, **kw})


def _llama3(name: str, factor: float, **kw: Any) -> ModelConfig:
    base = dict(
        architecture="llama",
        vocab_size=128256,
        head_dim=128,
        rope_theta=500_000.0,
        rope_scaling=RopeScaling(factor=factor),
        rms_norm_eps=1e-5,
        qkv_bias=False,
        max_position_embeddings=131072,
        dtype="bfloat16",
        param_dtype="bfloat16",
    )
    return ModelConfig(name=name, **{**base, **kw})


# Byte-level vocabulary of rl.generation.tokenizer.ByteTokenizer (256 bytes + 8 specials), padded to a
# multiple of 16 so that the vocab axis splits evenly over small tensor-parallel meshes.
TINY_VOCAB_SIZE = 272

PRESETS: dict[str, Callable[[], ModelConfig]] = {
    # ~0.43M params: CPU tests and the quickstart; pairs with the byte-level tokenizer.
    "tiny": lambda: ModelConfig(
        name="tiny",
        architecture="qwen2",
        vocab_size=TINY_VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=384,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        rope_theta=10000.0,
        qkv_bias=True,
        tie_embeddings=True,
        max_position_embeddings=4096,
    ),
    "qwen2.5-0.5b": lambda: _qwen25(
        "qwen2.5-0.5b",
        hidden_size=896,
        intermediate_size=4864,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        tie_embeddings=True,
    ),
    "qwen2.5-1.5b": lambda: _qwen25(
        "qwen2.5-1.5b",
        hidden_size=1536,
        intermediate_size=8960,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        tie_embeddings=True,
    ),
    "qwen2.5-7b": lambda: _qwen25(
        "qwen2.5-7b",
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        tie_embeddings=False,
    ),
    "llama-3.2-1b": lambda: _llama3(
        "llama-3.2-1b",
        32.0,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        tie_embeddings=True,
    ),
    "llama-3.2-3b": lambda: _llama3(
        "llama-3.2-3b",
        32.0,
        hidden_size=3072,
        intermediate_size=8192,
        num_layers=28,
        num_heads=24,
        num_kv_heads=8,
        tie_embeddings=True,
    ),
    "llama-3.1-8b": lambda: _llama3(
        "llama-3.1-8b",
        8.0,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        tie_embeddings=False,
    ),
}


def get_model_config(name: str, **overrides: Any) -> ModelConfig:
    """The preset called ``name`` (case-insensitive), with optional field overrides.

    Example: ``get_model_config("qwen2.5-0.5b", dtype="float32")``.
    """
    key = name.lower()
    if key not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    config = PRESETS[key]()
    return config.replace(**overrides) if overrides else config
