"""The two KV caches the decoder reads and writes: one per batch of prompts, one per decode slot.

A :class:`KVCache` serves the sampler, which generates a batch of left-padded prompts together:
its rows share one write index, and a mask records which slots hold real tokens. A
:class:`SlotCache` serves the decode engine, which inserts, continues and drops sequences one at a
time: each row holds one sequence from position 0 and appends at its own length.
:meth:`rl.models.transformer.Transformer.hidden_states` takes either and returns it updated.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from rl.models.config import ModelConfig
from rl.models.sharding import DEFAULT_RULES, Rules, constrain


@struct.dataclass
class KVCache:
    """Preallocated keys/values for every layer, plus which slots hold real tokens.

    Attributes:
      k, v: one ``[batch, num_kv_heads, max_len, head_dim]`` array per layer (heads before
        slots, so attention reads each head's keys contiguously, with no per-step transpose).
      mask: ``[batch, max_len]`` bool, True where a slot holds a real (non-padding) token.
      index: int32 scalar, the next slot to write; shared by all rows (prompts are left-padded
        to a common length, so every row appends at the same slot).
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    mask: jax.Array
    index: jax.Array

    @classmethod
    def zeros(cls, config: ModelConfig, batch: int, max_len: int, rules: Rules = DEFAULT_RULES) -> KVCache:
        shape = (batch, config.num_kv_heads, max_len, config.head_dim)
        logical = ("batch", "kv_heads", "cache_seq", "head_dim")
        zeros = lambda: constrain(jnp.zeros(shape, config.compute_dtype), logical, rules)  # noqa: E731
        return cls(
            k=tuple(zeros() for _ in range(config.num_layers)),
            v=tuple(zeros() for _ in range(config.num_layers)),
            mask=jnp.zeros((batch, max_len), bool),
            index=jnp.zeros((), jnp.int32),
        )


@struct.dataclass
class SlotCache:
    """Keys/values of independent sequences, one per row (a *slot*), each stored from position 0.

    A :class:`KVCache`'s rows share one write index, which suits a batch of left-padded prompts
    generated together. A decode engine inserts, continues and drops sequences one at a time, so
    here every slot has its own length: slot position ``i`` holds the token at RoPE position ``i``,
    a key is valid iff its position is below the slot's length, and no mask is stored.

    Attributes:
      k, v: one ``[slots, num_kv_heads, max_len, head_dim]`` array per layer (the KVCache layout).
      lengths: ``[slots]`` int32, tokens held by each slot.
      rows: ``[batch]`` int32 or None: the slot each input row reads and writes (None: row ``i``
        is slot ``i``, the whole cache decodes). Rows ``>= slots`` are padding: their writes are
        dropped and their outputs meaningless.
      window: static; attention reads only the first ``window`` positions of each slot (0: all).
        Must exceed every row's last position in the chunk; a smaller window is a cheaper step.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    lengths: jax.Array
    rows: jax.Array | None = None
    window: int = struct.field(pytree_node=False, default=0)

    @classmethod
    def zeros(cls, config: ModelConfig, slots: int, max_len: int, rules: Rules = DEFAULT_RULES) -> SlotCache:
        kv = KVCache.zeros(config, slots, max_len, rules)
        return cls(k=kv.k, v=kv.v, lengths=jnp.zeros((slots,), jnp.int32))

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]
