"""Whole-sequence causal attention for training, tiled by query block, with its own backward pass.

A training forward attends every position to the positions before it. Computed whole, it holds
``[b, heads, s, s]`` float32 scores, computes the half of them above the diagonal only to mask
them away, and its gradient keeps several such tensors alive. Here the queries go one block at
a time, and block ``i`` reads only the keys up to its own end: the causal half is never
computed (about half the FLOPs of the whole square at long lengths).

The backward pass is written out (:func:`jax.custom_vjp`) in the flash-attention form. Autodiff
through the blocks would keep the scores, the probabilities and their softmax intermediates of
every block. Here the forward keeps the blocks' probabilities when they are small
(:data:`KEEP_PROBABILITIES_BYTES`: a micro-batch of a small model), and otherwise only each
query's log-sum-exp, from which the backward recomputes a block's probabilities one block at a
time (a large model's long rows, whose probabilities would not fit).

Every query row's softmax and weighted sum are the plain attention's; only the order of float
additions differs (~1e-7 relative).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

#: The largest query block: 128 rows measured fastest on a 2-core CPU at 32 x 1536 tokens
#: (``benchmarks/learner_bench.py``); a length with no divisor of at least 16 up to it runs whole.
MAX_QUERY_BLOCK = 128
MIN_QUERY_BLOCK = 16
#: One call's probabilities (float32, every block) up to this size are kept from the forward for
#: the backward pass instead of being recomputed there: a recompute costs a score matmul and an
#: exponential per block, about a quarter of the attention's time on a CPU.
KEEP_PROBABILITIES_BYTES = 256 << 20
_F32 = jnp.float32


def query_block(s: int) -> int:
    """The largest divisor of ``s`` up to :data:`MAX_QUERY_BLOCK`; ``s`` itself (one block) when ``s``
    is that short or has no divisor of at least :data:`MIN_QUERY_BLOCK`."""
    block = max(d for d in range(1, min(s, MAX_QUERY_BLOCK) + 1) if s % d == 0)
    return block if block >= MIN_QUERY_BLOCK else s


def causal_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, segment_ids: jax.Array | None, block: int
) -> jax.Array:
    """``softmax(q k^T / sqrt(d)) v`` of a whole sequence, each query seeing the valid keys at or before it.

    Args:
      q: ``[b, kv_heads, groups, s, d]`` queries (``groups`` query heads share each key/value head).
      k, v: ``[b, kv_heads, s, d]``.
      key_valid: ``[b, s]`` bool, False for padding (never attended to).
      segment_ids: ``[b, s]`` int or None; with them a query sees only keys of its own segment.
      block: query rows per block; must divide ``s``.

    Returns ``[b, kv_heads, groups, s, d]`` in ``v``'s dtype. A query that sees no valid key (a
    padding row) gets zeros, and no gradient flows through it.
    """
    b, kv, g, s, _ = q.shape
    if s % block:
        raise ValueError(f"causal_attention(block={block}): must divide the sequence length {s}")
    segments = jnp.zeros(key_valid.shape, jnp.int32) if segment_ids is None else segment_ids
    pairs = block * block * (s // block) * (s // block + 1) // 2  # (query, key) pairs of every block
    keep = math.prod((b, kv, g, pairs, 4)) <= KEEP_PROBABILITIES_BYTES
    return _attention(q, k, v, key_valid, segments, block, keep)


def _block_mask(key_valid: jax.Array, segments: jax.Array, i: int, block: int) -> jax.Array:
    """``[b, 1, 1, block, end]``: which keys ``0..end`` query block ``i`` may read (``end`` = its last row + 1)."""
    start, end = i * block, (i + 1) * block
    causal = jnp.arange(end)[None, :] <= (start + jnp.arange(block))[:, None]
    same = segments[:, start:end, None] == segments[:, None, :end]
    return (causal[None] & same & key_valid[:, None, :end])[:, None, None]


def _scores(q_block: jax.Array, k: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Scaled scores, ``-inf`` where ``mask`` hides the key (its probability is then exactly 0)."""
    s = jnp.einsum("bkgsd,bktd->bkgst", q_block, k, preferred_element_type=_F32) * scale
    return jnp.where(mask, s, -jnp.inf)


def _forward(q, k, v, key_valid, segments, block):
    """The output, each query's log-sum-exp ``[b, kv, g, s]``, and each block's probabilities."""
    scale = q.shape[-1] ** -0.5
    outs, lses, probs = [], [], []
    for i in range(q.shape[3] // block):
        end = (i + 1) * block
        s = _scores(q[:, :, :, i * block : end], k[:, :, :end], _block_mask(key_valid, segments, i, block), scale)
        top = jnp.max(s, axis=-1, keepdims=True)
        top = jnp.where(top > -jnp.inf, top, 0.0)  # a row that sees no key: every exp(-inf) is 0
        e = jnp.exp(s - top)
        total = jnp.sum(e, axis=-1, keepdims=True)
        p = e / jnp.where(total > 0, total, 1.0)
        outs.append(jnp.einsum("bkgst,bktd->bkgsd", p.astype(v.dtype), v[:, :, :end], preferred_element_type=_F32))
        lses.append(jnp.where(total > 0, top + jnp.log(total), jnp.inf)[..., 0])  # inf: p = 0 again
        probs.append(p)
    return jnp.concatenate(outs, axis=3).astype(v.dtype), jnp.concatenate(lses, axis=3), probs


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(q, k, v, key_valid, segments, block, keep):
    return _forward(q, k, v, key_valid, segments, block)[0]


def _attention_fwd(q, k, v, key_valid, segments, block, keep):
    out, lse, probs = _forward(q, k, v, key_valid, segments, block)
    return out, (q, k, v, key_valid, segments, out, lse, probs if keep else None)


def _attention_bwd(block, keep, residuals, d_out):
    q, k, v, key_valid, segments, out, lse, probs = residuals
    scale = q.shape[-1] ** -0.5
    delta = jnp.sum(d_out.astype(_F32) * out.astype(_F32), axis=-1)  # [b, kv, g, s]
    dq_blocks = []
    # dK and dV accumulate transposed, [b, kv, d, s]: contracting a block's (group, query) rows
    # then reads the probabilities in their own layout instead of transposing every block.
    dkt = jnp.zeros((*k.shape[:2], k.shape[3], k.shape[2]), _F32)
    dvt = jnp.zeros(dkt.shape, _F32)
    for i in range(q.shape[3] // block):
        start, end = i * block, (i + 1) * block
        q_i, do_i = q[:, :, :, start:end], d_out[:, :, :, start:end]
        k_i, v_i = k[:, :, :end], v[:, :, :end]
        if probs is not None:
            p = probs[i]
        else:  # the forward's probabilities, recomputed from its log-sum-exp
            p = jnp.exp(
                _scores(q_i, k_i, _block_mask(key_valid, segments, i, block), scale) - lse[..., start:end, None]
            )
        dvt = dvt.at[..., :end].add(
            jnp.einsum("bkgsd,bkgst->bkdt", do_i, p.astype(do_i.dtype), preferred_element_type=_F32)
        )
        dp = jnp.einsum("bkgsd,bktd->bkgst", do_i, v_i, preferred_element_type=_F32)
        ds = (p * (dp - delta[..., start:end, None]) * scale).astype(q.dtype)
        dq_blocks.append(jnp.einsum("bkgst,bktd->bkgsd", ds, k_i, preferred_element_type=_F32))
        dkt = dkt.at[..., :end].add(jnp.einsum("bkgsd,bkgst->bkdt", q_i, ds, preferred_element_type=_F32))
    dq = jnp.concatenate(dq_blocks, axis=3)
    dk, dv = jnp.swapaxes(dkt, -1, -2), jnp.swapaxes(dvt, -1, -2)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


_attention.defvjp(_attention_fwd, _attention_bwd)
