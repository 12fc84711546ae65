"""A Llama / Qwen2-family decoder in Flax NNX, with a KV cache usable for prefill and decode.

Numerics follow the Hugging Face reference exactly where it matters for logit parity: RMSNorm
and softmax in float32, RoPE as :mod:`rl.models.rope` computes it, query head ``h`` reading
key/value head ``h // (num_heads // num_kv_heads)``.

Every parameter carries logical axis names (``nnx.with_partitioning``); :mod:`rl.models.sharding` maps
them to mesh axes. Attention projections keep heads as their own dimension, e.g. the query
kernel is ``(embed, q_heads, head_dim)``, so tensor parallelism splits whole heads.

Masking is by *key validity* rather than by padding side: a ``KVCache`` (:mod:`rl.models.kv_cache`)
records which slots hold real tokens, and a query attends to valid slots at or before its own slot.
Positions (for RoPE) are passed per row, so a left-padded prompt sees exactly the positions it would
see alone. A ``SlotCache`` (for the decode engine) instead gives every row its own length: each row
holds one sequence from position 0 and appends where it left off.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from rl.models.causal_attention import causal_attention, query_block
from rl.models.config import ModelConfig
from rl.models.kv_cache import KVCache, SlotCache
from rl.models.projection import project
from rl.models.rope import apply_rope, rope_angles
from rl.models.sharding import DEFAULT_RULES, Rules, constrain


def _init(config: ModelConfig) -> nnx.Initializer:
    """Weights and embeddings start normal with ``config.initializer_range`` as standard deviation."""
    return nnx.initializers.normal(stddev=config.initializer_range)


def _param(
    rngs: nnx.Rngs | None, init: nnx.Initializer, shape: Sequence[int], logical: tuple[str, ...], dtype: jnp.dtype
) -> nnx.Param:
    key = rngs.params() if rngs is not None else jax.random.key(0)
    return nnx.Param(nnx.with_partitioning(init, logical)(key, tuple(shape), dtype))


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, param_dtype: jnp.dtype, rngs: nnx.Rngs | None):
        self.eps = eps
        self.scale = _param(rngs, nnx.initializers.ones, (dim,), ("norm",), param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return normed.astype(x.dtype) * self.scale[...].astype(x.dtype)


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE, optional QKV bias and a KV cache."""

    #: LoRA adapters by projection name (``rl.models.lora.apply_lora``); None: the plain projections.
    lora: nnx.Dict | None = None

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs | None):
        e, h, kv, d, pd = (
            config.hidden_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.params_dtype,
        )
        self.config = config
        self.q = _param(rngs, _init(config), (e, h, d), ("embed", "q_heads", "head_dim"), pd)
        self.k = _param(rngs, _init(config), (e, kv, d), ("embed", "kv_heads", "head_dim"), pd)
        self.v = _param(rngs, _init(config), (e, kv, d), ("embed", "kv_heads", "head_dim"), pd)
        self.o = _param(rngs, _init(config), (h, d, e), ("q_heads", "head_dim", "embed"), pd)
        if config.qkv_bias:
            zeros = nnx.initializers.zeros
            self.q_bias = _param(rngs, zeros, (h, d), ("q_heads", "head_dim"), pd)
            self.k_bias = _param(rngs, zeros, (kv, d), ("kv_heads", "head_dim"), pd)
            self.v_bias = _param(rngs, zeros, (kv, d), ("kv_heads", "head_dim"), pd)

    def _project(self, x: jax.Array, name: str) -> jax.Array:
        dtype = self.config.compute_dtype
        w = getattr(self, name)[...].astype(dtype)
        if w.dtype == jnp.float32:  # float32 programs stay the ones every recorded figure came from
            y = jnp.einsum("bse,ehd->bshd", x, w)
        else:
            y = project(x, w.reshape(w.shape[0], -1)).reshape(*x.shape[:-1], *w.shape[1:])
        if self.lora is not None and name in self.lora:
            y = y + self.lora[name](x)
        if self.config.qkv_bias:
            y = y + getattr(self, f"{name}_bias")[...].astype(dtype)
        return y

    def __call__(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        key_mask: jax.Array,
        cache_kv: tuple[jax.Array, jax.Array] | None,
        index: jax.Array,
        rules: Rules,
        segment_ids: jax.Array | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        q, k, v = self._qkv(x, cos, sin)
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [b, kv, s, d]: the cache layout
        s = x.shape[1]
        if cache_kv is None and query_block(s) < s:  # a training forward: causal blocks, no square
            return self._project_out(self._causal(q, k, v, key_mask, segment_ids, query_block(s))), None
        if cache_kv is not None:
            logical = ("batch", "kv_heads", "cache_seq", "head_dim")
            k_all = constrain(jax.lax.dynamic_update_slice(cache_kv[0], k, (0, 0, index, 0)), logical, rules)
            v_all = constrain(jax.lax.dynamic_update_slice(cache_kv[1], v, (0, 0, index, 0)), logical, rules)
            cache_kv = (k_all, v_all)
        else:
            k_all, v_all = k, v
        # Query i (absolute slot index + i) sees valid slots at or before itself.
        t = k_all.shape[2]
        causal = jnp.arange(t)[None, :] <= (index + jnp.arange(s))[:, None]
        mask = causal[None, :, :] & key_mask[:, None, :]
        if segment_ids is not None:  # packed rows: a token sees only its own sequence
            mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
        return self._attend(q, k_all, v_all, mask), cache_kv

    def call_slots(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        cache_kv: tuple[jax.Array, jax.Array],
        starts: jax.Array,
        rows: jax.Array | None,
        window: int,
        rules: Rules,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """Attention against a :class:`SlotCache` layer: row ``b`` writes its chunk at cache slot
        ``rows[b]``, positions ``starts[b] + i``, then its query ``i`` reads that slot's keys at
        positions ``<= starts[b] + i`` within the first ``window`` positions."""
        q, k, v = self._qkv(x, cos, sin)  # k, v: [b, s, kv, d]
        b, s, _ = x.shape
        pos = starts[:, None] + jnp.arange(s, dtype=starts.dtype)[None, :]
        slot = (jnp.arange(b, dtype=jnp.int32) if rows is None else rows)[:, None]
        logical = ("batch", "kv_heads", "cache_seq", "head_dim")
        # A scatter, one position per (row, token): rows write at their own lengths. Writes past
        # the cache's end, or by padding rows (slot index >= slots), are dropped.
        k_cache = constrain(cache_kv[0].at[slot, :, pos].set(k, mode="drop"), logical, rules)
        v_cache = constrain(cache_kv[1].at[slot, :, pos].set(v, mode="drop"), logical, rules)
        if rows is None:
            k_all, v_all = k_cache[:, :, :window], v_cache[:, :, :window]
        else:
            k_all = jnp.take(k_cache[:, :, :window], rows, axis=0, mode="clip")
            v_all = jnp.take(v_cache[:, :, :window], rows, axis=0, mode="clip")
        mask = jnp.arange(window)[None, None, :] <= pos[:, :, None]
        return self._attend(q, k_all, v_all, mask), (k_cache, v_cache)

    def _qkv(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Rotated queries and keys, and values, each ``[batch, seq, heads, head_dim]``."""
        q, k = apply_rope(self._project(x, "q"), cos, sin), apply_rope(self._project(x, "k"), cos, sin)
        return q, k, self._project(x, "v")

    def _attend(self, q: jax.Array, k_all: jax.Array, v_all: jax.Array, mask: jax.Array) -> jax.Array:
        """Output projection of ``softmax(q k^T) v`` over the keys ``mask`` (``[b, s, t]``) allows.

        ``q`` is ``[b, s, heads, head_dim]``; ``k_all``, ``v_all`` are ``[b, kv_heads, t, head_dim]``.
        """
        return self._project_out(self._attention(q, k_all, v_all, mask))

    def _causal(
        self, q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array, segment_ids: jax.Array | None, block: int
    ) -> jax.Array:
        """Whole-sequence causal attention (:mod:`rl.models.causal_attention`), ``[b, s, heads * head_dim]``."""
        cfg = self.config
        b, s = q.shape[:2]
        groups = cfg.num_heads // cfg.num_kv_heads
        q = q.reshape(b, s, cfg.num_kv_heads, groups, cfg.head_dim).transpose(0, 2, 3, 1, 4)
        out = causal_attention(q, k, v, key_mask, segment_ids, block)  # [b, kv, g, s, d]
        return out.transpose(0, 3, 1, 2, 4).reshape(b, s, cfg.num_heads * cfg.head_dim)

    def _attention(self, q: jax.Array, k_all: jax.Array, v_all: jax.Array, mask: jax.Array) -> jax.Array:
        """``softmax(q k^T) v`` per query (``[b, s, heads * head_dim]``), before the output projection."""
        cfg = self.config
        b, s = q.shape[:2]
        groups = cfg.num_heads // cfg.num_kv_heads
        q = q.reshape(b, s, cfg.num_kv_heads, groups, cfg.head_dim)
        f32 = jnp.float32
        # Decode with grouped heads: a broadcast multiply + reduce is one fused, vectorised loop on
        # CPU, where a batched dot_general of [.., 1, d] x [.., t, d] runs as many tiny matmuls.
        # Without groups (num_kv_heads == num_heads) XLA:CPU turns that same expression into a loop
        # far slower than the dot_general (docs/benchmarks.md, "Figures behind design choices").
        fused_decode = s == 1 and groups > 1
        if fused_decode:
            scores = jnp.sum(q[:, 0, :, :, None, :].astype(f32) * k_all[:, :, None].astype(f32), axis=-1)[:, :, :, None]
        else:
            scores = jnp.einsum("bskgd,bktd->bkgst", q, k_all, preferred_element_type=f32)
        scores = scores * (cfg.head_dim**-0.5)
        scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(cfg.compute_dtype)
        if fused_decode:
            out = jnp.sum(probs[:, :, :, 0, :, None].astype(f32) * v_all[:, :, None].astype(f32), axis=-2)
            out = out.astype(cfg.compute_dtype).reshape(b, 1, cfg.num_heads * cfg.head_dim)
        else:
            out = jnp.einsum("bkgst,bktd->bskgd", probs, v_all).reshape(b, s, cfg.num_heads * cfg.head_dim)
        return out

    def _project_out(self, out: jax.Array) -> jax.Array:
        cfg = self.config
        # A plain 2-D matmul against the [heads*head_dim, embed] view of the output weight: an
        # einsum over (heads, head_dim) let XLA:CPU transpose the whole weight on every call.
        o = self.o[...].astype(cfg.compute_dtype).reshape(cfg.num_heads * cfg.head_dim, -1)
        if self.lora is not None and "o" in self.lora:
            return project(out, o) + self.lora["o"](out)
        return project(out, o)


class MLP(nnx.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    #: LoRA adapters by projection name (``rl.models.lora.apply_lora``); None: the plain projections.
    lora: nnx.Dict | None = None

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs | None):
        e, m, pd = config.hidden_size, config.intermediate_size, config.params_dtype
        self.dtype = config.compute_dtype
        self.gate = _param(rngs, _init(config), (e, m), ("embed", "mlp"), pd)
        self.up = _param(rngs, _init(config), (e, m), ("embed", "mlp"), pd)
        self.down = _param(rngs, _init(config), (m, e), ("mlp", "embed"), pd)

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.lora is not None:
            return self._adapted(x, self.lora)
        gate = project(x, self.gate[...].astype(self.dtype))
        up = project(x, self.up[...].astype(self.dtype))
        return project(jax.nn.silu(gate) * up, self.down[...].astype(self.dtype))

    def _adapted(self, x: jax.Array, lora: nnx.Dict) -> jax.Array:
        """:meth:`__call__` with each adapted projection's low-rank update added to its output."""

        def adapted(h: jax.Array, name: str) -> jax.Array:
            y = project(h, getattr(self, name)[...].astype(self.dtype))
            return y + lora[name](h) if name in lora else y

        return adapted(jax.nn.silu(adapted(x, "gate")) * adapted(x, "up"), "down")


class Block(nnx.Module):
    def __init__(self, config: ModelConfig, rngs: nnx.Rngs | None):
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.params_dtype, rngs)
        self.attn = Attention(config, rngs)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.params_dtype, rngs)
        self.mlp = MLP(config, rngs)


def _block(
    layer: Block,
    x: jax.Array,
    segment_ids: jax.Array | None,
    *,
    cos: jax.Array,
    sin: jax.Array,
    key_mask: jax.Array,
    index: jax.Array,
    rules: Rules,
) -> jax.Array:
    """One layer of a training forward (no cache): what :meth:`Transformer.hidden_states` rematerialises."""
    attn, _ = layer.attn(layer.attn_norm(x), cos, sin, key_mask, None, index, rules, segment_ids)
    x = constrain(x + attn, ("batch", "seq", "embed"), rules)
    return constrain(x + layer.mlp(layer.mlp_norm(x)), ("batch", "seq", "embed"), rules)


class Transformer(nnx.Module):
    """Decoder-only language model.

    Args:
      config: architecture and dtypes.
      rngs: initialisation randomness; ``None`` initialises deterministically from key 0 (used
        when the weights are about to be overwritten by a checkpoint).
      rules: logical-axis rules for the activation sharding constraints (a static attribute, so
        a change of rules is a change of compiled program).
    """

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs | None = None, rules: Rules = DEFAULT_RULES):
        self.config = config
        self.rules = tuple(rules)
        # Logical names are inert metadata here; rl.models.sharding applies them under jit. Eager
        # sharding would try to place them on a mesh at construction time.
        with nnx.use_eager_sharding(False):
            e, v, pd = config.hidden_size, config.vocab_size, config.params_dtype
            self.embed = _param(rngs, _init(config), (v, e), ("vocab", "embed"), pd)
            self.layers = nnx.List([Block(config, rngs) for _ in range(config.num_layers)])
            self.final_norm = RMSNorm(e, config.rms_norm_eps, pd, rngs)
            if not config.tie_embeddings:
                self.lm_head = _param(rngs, _init(config), (e, v), ("embed", "vocab"), pd)

    def hidden_states(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        input_mask: jax.Array | None = None,
        cache: KVCache | SlotCache | None = None,
        segment_ids: jax.Array | None = None,
        remat: bool = False,
    ) -> tuple[jax.Array, KVCache | SlotCache | None]:
        """Final-norm hidden states ``[batch, seq, embed]`` and the updated cache.

        Args:
          tokens: ``[batch, seq]`` int token ids.
          positions: ``[batch, seq]`` RoPE positions (per row: padding does not shift them).
          input_mask: ``[batch, seq]`` bool, False for padding tokens (never attended to).
          cache: if given, this chunk is written at ``cache.index`` and attends to everything
            valid in the cache before it; the returned cache has ``index`` advanced by ``seq``.
            A :class:`SlotCache` instead: row ``b`` is written at its slot's own length (pass
            ``positions`` = that length + ``0..seq-1``, valid tokens first in ``input_mask``) and
            the slot's length grows by its valid tokens.
          segment_ids: ``[batch, seq]`` int, for rows that pack several sequences (training only,
            no cache): a token attends only to tokens of its own segment; pass per-segment
            ``positions`` too.
          remat: recompute each layer's activations in the backward pass instead of keeping
            them (training only, no cache): the backward holds one layer's activations, not
            every layer's, for about one more forward pass of compute.
        """
        if segment_ids is not None and cache is not None:
            raise ValueError("hidden_states: segment_ids (packed rows) cannot be combined with a KV cache")
        if remat and cache is not None:
            raise ValueError("hidden_states: remat is for training forwards; it cannot be combined with a KV cache")
        cfg, rules = self.config, self.rules
        b, s = tokens.shape
        if input_mask is None:
            input_mask = jnp.ones((b, s), bool)
        x = jnp.take(self.embed[...], tokens, axis=0).astype(cfg.compute_dtype)
        x = constrain(x, ("batch", "seq", "embed"), rules)
        cos, sin = rope_angles(cfg, positions)
        if isinstance(cache, SlotCache):
            return self._hidden_states_slots(x, cos, sin, input_mask, cache)
        if cache is not None:
            index = cache.index
            key_mask = jax.lax.dynamic_update_slice(cache.mask, input_mask, (0, index))
        else:
            index, key_mask = jnp.zeros((), jnp.int32), input_mask
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            if remat:  # only the layer's input is kept for the backward pass
                block = functools.partial(_block, layer, cos=cos, sin=sin, key_mask=key_mask, index=index, rules=rules)
                x = jax.checkpoint(block)(x, segment_ids)
                continue
            kv = (cache.k[i], cache.v[i]) if cache is not None else None
            attn, kv = layer.attn(layer.attn_norm(x), cos, sin, key_mask, kv, index, rules, segment_ids)
            x = constrain(x + attn, ("batch", "seq", "embed"), rules)
            x = constrain(x + layer.mlp(layer.mlp_norm(x)), ("batch", "seq", "embed"), rules)
            if kv is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
        if cache is not None:
            cache = KVCache(k=tuple(new_k), v=tuple(new_v), mask=key_mask, index=index + s)
        return self.final_norm(x), cache

    def _hidden_states_slots(
        self, x: jax.Array, cos: jax.Array, sin: jax.Array, input_mask: jax.Array, cache: SlotCache
    ) -> tuple[jax.Array, SlotCache]:
        """:meth:`hidden_states` against a :class:`SlotCache`: each row appends at its slot's length."""
        rules = self.rules
        window = cache.window or cache.max_len
        starts = cache.lengths if cache.rows is None else jnp.take(cache.lengths, cache.rows, mode="clip")
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            kv = (cache.k[i], cache.v[i])
            attn, kv = layer.attn.call_slots(layer.attn_norm(x), cos, sin, kv, starts, cache.rows, window, rules)
            x = constrain(x + attn, ("batch", "seq", "embed"), rules)
            x = constrain(x + layer.mlp(layer.mlp_norm(x)), ("batch", "seq", "embed"), rules)
            new_k.append(kv[0])
            new_v.append(kv[1])
        added = jnp.sum(input_mask, axis=1, dtype=jnp.int32)
        if cache.rows is None:
            lengths = cache.lengths + added
        else:
            lengths = cache.lengths.at[cache.rows].add(added, mode="drop")
        cache = cache.replace(k=tuple(new_k), v=tuple(new_v), lengths=lengths)
        return self.final_norm(x), cache

    def head_weight(self) -> jax.Array:
        """The LM head as ``[embed, vocab]`` in the compute dtype.

        With tied embeddings this is a transposed copy of the table: a decode loop computes it
        once, outside the loop, because XLA:CPU multiplies by a pre-transposed ``[embed, vocab]``
        matrix ~1.5x faster than by the ``[vocab, embed]`` table.
        """
        dtype = self.config.compute_dtype
        return self.embed[...].astype(dtype).T if self.config.tie_embeddings else self.lm_head[...].astype(dtype)

    def logits(self, hidden: jax.Array, head: jax.Array | None = None) -> jax.Array:
        """float32 logits ``[..., vocab]`` from final hidden states (``head``: see :meth:`head_weight`)."""
        head = self.head_weight() if head is None else head
        return jnp.matmul(hidden.astype(head.dtype), head, preferred_element_type=jnp.float32)

    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        input_mask: jax.Array | None = None,
        cache: KVCache | SlotCache | None = None,
        segment_ids: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache | SlotCache | None]:
        """``(logits [batch, seq, vocab] float32, cache)``; positions default to ``0..seq-1``."""
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        hidden, cache = self.hidden_states(tokens, positions, input_mask, cache, segment_ids)
        return self.logits(hidden), cache
