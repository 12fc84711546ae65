"""Training attention in causal query blocks equals the whole-square attention, forward and backward.

:mod:`rl.models.causal_attention` skips the blocks above the diagonal and writes its own backward
pass, keeping the probabilities when they are small and recomputing them otherwise. Both must give
the plain masked softmax's outputs and gradients on every valid query, with padding and packed
segments, grouped heads, and through a whole model (a long training forward against the cached
decode path, which never uses the blocks).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.models import causal_attention as ca

B, KV, G, S, D = 3, 2, 2, 256, 32


def _inputs():
    rng = np.random.default_rng(0)
    q, w = (jnp.asarray(rng.standard_normal((B, KV, G, S, D)), jnp.float32) for _ in range(2))
    k, v = (jnp.asarray(rng.standard_normal((B, KV, S, D)), jnp.float32) for _ in range(2))
    lengths = np.array([256, 200, 130])
    valid = jnp.asarray(np.arange(S)[None] < lengths[:, None])  # right padding
    cut = np.array([100, 50, 130])[:, None]
    segments = jnp.asarray(np.where(np.arange(S)[None] < cut, 1, 2) * np.asarray(valid))  # two packed sequences
    return q, k, v, valid, segments, w * valid[:, None, None, :, None]  # the loss reads valid queries only


def _plain(q, k, v, valid, segments):
    s = jnp.einsum("bkgsd,bktd->bkgst", q, k) * D**-0.5
    mask = jnp.tril(jnp.ones((S, S), bool))[None] & (segments[:, :, None] == segments[:, None, :]) & valid[:, None]
    s = jnp.where(mask[:, None, None], s, jnp.finfo(jnp.float32).min)
    return jnp.einsum("bkgst,bktd->bkgsd", jax.nn.softmax(s, axis=-1), v)


@pytest.mark.parametrize("keep", [True, False], ids=["probabilities kept", "probabilities recomputed"])
def test_blocked_attention_and_its_gradients_equal_the_plain_attention(monkeypatch, keep):
    monkeypatch.setattr(ca, "KEEP_PROBABILITIES_BYTES", 1 << 40 if keep else 0)
    q, k, v, valid, segments, w = _inputs()
    rows = valid[:, None, None, :, None]

    def loss(attend):
        return lambda q, k, v: jnp.sum(attend(q, k, v) * w)

    blocked = lambda q, k, v: ca.causal_attention(q, k, v, valid, segments, 64)  # noqa: E731
    plain = lambda q, k, v: _plain(q, k, v, valid, segments)  # noqa: E731
    np.testing.assert_allclose(jnp.where(rows, blocked(q, k, v), 0), jnp.where(rows, plain(q, k, v), 0), atol=1e-5)
    got = jax.grad(loss(blocked), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(plain), argnums=(0, 1, 2))(q, k, v)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, atol=2e-5)
        assert bool(jnp.isfinite(g).all())
    # a padding query sees no key: zeros, and nothing flows back through it
    assert float(jnp.abs(blocked(q, k, v)[2, :, :, 200:]).max()) == 0.0


def test_the_probabilities_are_kept_only_when_small(monkeypatch):
    seen = []
    original = ca._attention

    def spy(q, k, v, key_valid, segments, block, keep):
        seen.append(keep)
        return original(q, k, v, key_valid, segments, block, keep)

    monkeypatch.setattr(ca, "_attention", spy)
    q, k, v, valid, segments, _ = _inputs()
    ca.causal_attention(q, k, v, valid, segments, 64)
    monkeypatch.setattr(ca, "KEEP_PROBABILITIES_BYTES", 1024)
    ca.causal_attention(q, k, v, valid, segments, 64)
    assert seen == [True, False]


def test_query_blocks_divide_the_length_or_the_sequence_runs_whole():
    assert [ca.query_block(s) for s in (64, 96, 128, 384, 1536, 1792, 100, 97)] == [64, 96, 128, 128, 128, 128, 100, 97]
    with pytest.raises(ValueError, match="block=48"):
        q, k, v, valid, segments, _ = _inputs()
        ca.causal_attention(q, k, v, valid, segments, 48)


def test_a_long_training_forward_equals_the_cached_decode_path(single_mesh):
    """Past one block (here 384 tokens, 3 blocks of 128) the model's training forward uses the blocks; the
    sampler's prefill attends through its KV cache without them. Same logits."""
    from flax import nnx

    from rl.models import Transformer, sharding
    from rl.models.config import get_model_config
    from rl.models.kv_cache import KVCache

    config = get_model_config("tiny", vocab_size=300, max_position_embeddings=512)
    model = sharding.create_sharded_model(
        lambda: Transformer(config, rngs=nnx.Rngs(1)), single_mesh, sharding.DEFAULT_RULES
    )
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 300, size=(2, 384)), jnp.int32)
    whole, _ = model(tokens)
    cache = KVCache.zeros(config, 2, 384)
    cached, _ = model(tokens, cache=cache)
    np.testing.assert_allclose(np.asarray(whole), np.asarray(cached), atol=2e-4)
