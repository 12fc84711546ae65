"""Pure, vectorised token selection for the sampler: temperature, top-k, top-p, greedy, log-probs.

Every quantity is per row (each request in a batch carries its own temperature, top-k, top-p and
PRNG key), so a request's sample depends only on its own logits, settings, seed and step — never
on what else is in the batch.

Log-probabilities returned for each chosen token:
  - ``logprob``: under the distribution actually sampled from, i.e. ``log_softmax`` of the
    temperature-scaled logits after top-k / top-p filtering (and after masking ids the tokenizer
    cannot produce). Greedy rows (temperature 0) sample from a point mass: their ``logprob`` is 0.
  - ``raw_logprob``: under the model itself, ``log_softmax(logits)`` at temperature 1 over the
    full model vocabulary, unfiltered: what a learner's forward pass recomputes, hence what
    importance ratios (PPO/GRPO) should use as the behaviour policy's log-prob.

Sampling is Gumbel-max with exactly the noise of ``jax.random.gumbel(key, (vocab,))`` per row,
computed by :func:`gumbel_noise` in one fused pass (see there): on XLA:CPU, JAX's own lowering of
the Threefry hash is a rolled loop that writes the whole ``[batch, vocab]`` state to memory five
times, which made drawing the noise cost more than the rest of a sampled decode step's token choice.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

NEG_INF = -jnp.inf


def argmax(x: jax.Array) -> jax.Array:
    """``jnp.argmax`` over the last axis (first index among ties) as two plain reductions.

    XLA:CPU runs ``argmax``'s variadic (value, index) reduction unvectorised: over a 32k vocab
    it costs ~3x a max followed by a min over matching indices.
    """
    hit = x == jnp.max(x, axis=-1, keepdims=True)
    return jnp.min(jnp.where(hit, jnp.arange(x.shape[-1], dtype=jnp.int32), x.shape[-1]), axis=-1)


def _threefry2x32(k1: jax.Array, k2: jax.Array, x1: jax.Array, x2: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The Threefry-2x32 hash (20 rounds) as JAX defines it, unrolled: one elementwise fusion."""

    def rotl(x: jax.Array, d: int) -> jax.Array:
        return (x << np.uint32(d)) | (x >> np.uint32(32 - d))

    ks = (k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA))
    x1, x2 = x1 + ks[0], x2 + ks[1]
    for i in range(5):
        for r in ((13, 15, 26, 6), (17, 29, 16, 24))[i % 2]:
            x1 = x1 + x2
            x2 = x1 ^ rotl(x2, r)
        x1, x2 = x1 + ks[(i + 1) % 3], x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x1, x2


def _fast_gumbel_applies(keys: jax.Array) -> bool:
    """Whether :func:`gumbel_noise` can reproduce ``jax.random.gumbel`` bit for bit for ``keys``."""
    return (
        str(jax.random.key_impl(keys)) == "threefry2x32"
        and jax.config.jax_threefry_partitionable
        and not jax.config.jax_high_dynamic_range_gumbel
    )


def gumbel_noise(keys: jax.Array, vocab: int) -> jax.Array:
    """``[batch, vocab]`` float32: row ``i`` is ``jax.random.gumbel(keys[i], (vocab,))``, bit for bit.

    The same bits (partitionable Threefry over a flat counter), uniform floats and ``-log(-log(u))``
    as JAX's implementation, written out so that XLA fuses the 20 hash rounds into one pass (JAX
    lowers them on CPU as a 5-iteration loop over the whole array: ~4x slower at 32 x 32k).
    Other PRNG implementations or configurations fall back to ``jax.random.gumbel``.
    """
    if not _fast_gumbel_applies(keys):
        return jax.vmap(lambda key: jax.random.gumbel(key, (vocab,), jnp.float32))(keys)
    data = jax.random.key_data(keys)  # [batch, 2] uint32
    counter = jax.lax.broadcasted_iota(jnp.uint32, (1, vocab), 1)
    bits1, bits2 = _threefry2x32(data[:, :1], data[:, 1:], jnp.zeros_like(counter), counter)
    bits = bits1 ^ bits2
    # jax.random.uniform(minval=tiny, maxval=1): 23 random mantissa bits under exponent 0.
    one_to_two = jax.lax.bitcast_convert_type((bits >> np.uint32(9)) | np.uint32(0x3F800000), jnp.float32)
    tiny = jnp.float32(jnp.finfo(jnp.float32).tiny)
    uniform = jnp.maximum(tiny, (one_to_two - 1.0) * (1.0 - tiny) + tiny)
    return -jnp.log(-jnp.log(uniform))


def _chosen_logprob(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """``log_softmax(logits)[tokens]`` without materialising the full log-softmax."""
    chosen = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
    return chosen - jax.nn.logsumexp(logits, axis=-1)


def filter_logits(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Sets logits outside each row's top-k and top-p nucleus to ``-inf``.

    Args:
      scaled: ``[batch, vocab]`` temperature-scaled logits.
      top_k: ``[batch]`` int; 0 (or >= vocab) disables.
      top_p: ``[batch]`` float in (0, 1]; 1 disables. The nucleus is the smallest set of most
        likely tokens (after top-k) whose probability reaches ``top_p``.

    Ties at a threshold are kept (as in ``transformers``), so a row can keep more than k.
    """
    vocab = scaled.shape[-1]
    ordered = -jnp.sort(-scaled, axis=-1)
    k = jnp.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    kth = jnp.take_along_axis(ordered, (k - 1)[:, None], axis=-1)
    in_top_k = jnp.arange(vocab)[None, :] < k[:, None]
    probs = jax.nn.softmax(jnp.where(in_top_k, ordered, NEG_INF), axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of strictly more likely tokens
    keep = in_top_k & ((before < top_p[:, None]) | (jnp.arange(vocab)[None, :] == 0))
    num_keep = jnp.sum(keep, axis=-1)
    pth = jnp.take_along_axis(ordered, (num_keep - 1)[:, None], axis=-1)
    return jnp.where((scaled >= kth) & (scaled >= pth), scaled, NEG_INF)


def select_tokens(
    logits: jax.Array,
    keys: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    vocab_limit: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Chooses one token per row; returns ``(tokens, logprob, raw_logprob)`` (see module doc).

    Args:
      logits: ``[batch, vocab]`` float32 model logits.
      keys: ``[batch]`` PRNG keys, already folded with the step index.
      temperature: ``[batch]``; 0 means greedy (argmax).
      top_k, top_p: ``[batch]`` filters, see :func:`filter_logits`.
      vocab_limit: ids ``>= vocab_limit`` (embedding padding rows) are never chosen.
    """
    raw = logits = logits.astype(jnp.float32)
    if vocab_limit < logits.shape[-1]:
        logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab_limit, logits, NEG_INF)
    greedy = temperature <= 0
    greedy_tokens = argmax(logits)

    def stochastic() -> tuple[jax.Array, jax.Array]:
        scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
        needs_filter = jnp.any(~greedy & (((top_k > 0) & (top_k < logits.shape[-1])) | (top_p < 1.0)))
        # The sort behind top-k/top-p costs O(V log V) per row: skip it when no row filters.
        scaled = jax.lax.cond(needs_filter, filter_logits, lambda s, _k, _p: s, scaled, top_k, top_p)
        # Gumbel-max, as jax.random.categorical does, with the vectorisable argmax above.
        tokens = argmax(scaled + gumbel_noise(keys, scaled.shape[-1]))
        return tokens, _chosen_logprob(scaled, tokens)

    def all_greedy() -> tuple[jax.Array, jax.Array]:
        return greedy_tokens, jnp.zeros(greedy_tokens.shape, jnp.float32)

    tokens, logprob = jax.lax.cond(jnp.all(greedy), all_greedy, stochastic)
    tokens = jnp.where(greedy, greedy_tokens, tokens)
    logprob = jnp.where(greedy, 0.0, logprob)
    return tokens, logprob, _chosen_logprob(raw, tokens)
