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
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


def argmax(x: jax.Array) -> jax.Array:
    """``jnp.argmax`` over the last axis (first index among ties) as two plain reductions.

    XLA:CPU runs ``argmax``'s variadic (value, index) reduction unvectorised: over a 32k vocab
    it costs ~3x a max followed by a min over matching indices.
    """
    hit = x == jnp.max(x, axis=-1, keepdims=True)
    return jnp.min(jnp.where(hit, jnp.arange(x.shape[-1], dtype=jnp.int32), x.shape[-1]), axis=-1)


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
        noise = jax.vmap(lambda key: jax.random.gumbel(key, scaled.shape[-1:], jnp.float32))(keys)
        tokens = argmax(scaled + noise)
        return tokens, _chosen_logprob(scaled, tokens)

    def all_greedy() -> tuple[jax.Array, jax.Array]:
        return greedy_tokens, jnp.zeros(greedy_tokens.shape, jnp.float32)

    tokens, logprob = jax.lax.cond(jnp.all(greedy), all_greedy, stochastic)
    tokens = jnp.where(greedy, greedy_tokens, tokens)
    logprob = jnp.where(greedy, 0.0, logprob)
    return tokens, logprob, _chosen_logprob(raw, tokens)
