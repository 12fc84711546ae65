"""Rotary position embedding (RoPE), computed as the Hugging Face reference computes it.

Logit parity with a checkpoint depends on these few lines more than on any others: the inverse
frequencies are computed in float32 (with Llama-3 scaling when configured), the angles in float32
and cast to the compute dtype before rotation, and the rotation is the non-interleaved
("rotate half") form. :class:`rl.models.transformer.Attention` rotates its queries and keys with
:func:`apply_rope`; :meth:`rl.models.transformer.Transformer.hidden_states` computes the angles
once per forward (:func:`rope_angles`) for every layer.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rl.models.config import ModelConfig


def rope_frequencies(config: ModelConfig) -> np.ndarray:
    """Inverse frequencies ``[head_dim // 2]`` in float32, with Llama-3 scaling when configured."""
    dim = config.head_dim
    inv_freq = (1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))).astype(
        np.float32
    )
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = (2 * math.pi / inv_freq).astype(np.float32)
    scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq).astype(np.float32)
    smooth = (
        (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    ).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / scaling.factor + smooth * scaled).astype(np.float32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_angles(config: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(cos, sin)``, each ``[batch, seq, 1, head_dim]`` in the compute dtype, for ``[batch, seq]`` positions."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(rope_frequencies(config))
    freqs = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    return jnp.cos(freqs).astype(config.compute_dtype), jnp.sin(freqs).astype(config.compute_dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """``x`` (``[batch, seq, heads, head_dim]``) rotated by the angles of :func:`rope_angles`."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin
