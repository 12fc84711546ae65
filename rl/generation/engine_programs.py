"""The decode engine's device programs: prefill into slots, decode every slot, page a slot out and in.

Pure functions of (model state, :class:`~rl.models.kv_cache.SlotCache`, :class:`SlotState`, small
per-call arrays); :mod:`rl.generation.engine` jits them with explicit shardings, donating the cache
and the slot state so that every call updates them in place. Everything a program's shape depends
on is static here (the prefill batch and chunk, the attention window, the decode steps per call),
so the engine compiles one program per bucket it meets, and the rest (which slot, its length, its
sampling settings, its seed) are arrays: a new request never recompiles.

Token selection is the sampler's, step for step: a turn's token ``i`` uses ``fold_in(key(seed), i)``
and :func:`rl.generation.token_selection.select_tokens`, so a first turn samples what
:class:`rl.generation.sampler.Sampler` samples for the same prompt, settings and seed.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from rl.generation.token_selection import select_tokens
from rl.models.kv_cache import SlotCache
from rl.models.transformer import Transformer


@struct.dataclass
class SlotState:
    """Per-slot decode state kept on the device between calls (all ``[slots]`` unless noted).

    Attributes:
      token: the last sampled token, not yet in the cache (the next step feeds it).
      generated: tokens sampled so far in the slot's turn (= the fold-in index of the next one).
      seed: the turn's seed (uint32).
      temperature, top_k, top_p, max_new: the turn's sampling settings.
      stop_ids: ``[slots, width]`` stop token ids, ``-1`` padded.
    """

    token: jax.Array
    generated: jax.Array
    seed: jax.Array
    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    max_new: jax.Array
    stop_ids: jax.Array

    @classmethod
    def zeros(cls, slots: int, stop_width: int) -> SlotState:
        i32 = lambda: jnp.zeros((slots,), jnp.int32)  # noqa: E731
        return cls(
            token=i32(),
            generated=i32(),
            seed=jnp.zeros((slots,), jnp.uint32),
            temperature=jnp.zeros((slots,), jnp.float32),
            top_k=i32(),
            top_p=jnp.ones((slots,), jnp.float32),
            max_new=jnp.ones((slots,), jnp.int32),
            stop_ids=jnp.full((slots, stop_width), -1, jnp.int32),
        )


def _is_stop(token: jax.Array, stop_ids: jax.Array) -> jax.Array:
    return jnp.any(token[:, None] == stop_ids, axis=-1)


def _select(model: Transformer, hidden: jax.Array, head: jax.Array, seeds, steps, temperature, top_k, top_p, vocab):
    """The sampler's token choice for rows at their own step indices."""
    keys = jax.vmap(lambda seed, step: jax.random.fold_in(jax.random.key(seed), step))(seeds, steps)
    return select_tokens(model.logits(hidden, head), keys, temperature, top_k, top_p, vocab)


def prefill_program(graphdef: nnx.GraphDef, vocab_limit: int, window: int) -> Any:
    """Appends one chunk per row to its slot and samples the turn's first token after it.

    Arguments of the returned function (``R`` rows of ``C`` tokens; padding rows have
    ``rows >= slots`` and change nothing):
      state, head, cache, slots: model state, its LM head (``Transformer.head_weight()``, kept by the
        engine across calls: a tied head is a transposed copy of the embedding, too costly to
        remake every step), :class:`SlotCache`, :class:`SlotState`.
      rows: ``[R]`` slot of each row. starts: ``[R]`` tokens already in that slot's cache (the
        host's count, authoritative: a turn cut at a stop string rolls its slot back this way).
      tokens: ``[R, C]`` right-padded; valid: ``[R]`` real tokens per row.
      seeds, temperature, top_k, top_p, max_new, stop_ids: the rows' turn settings.

    Returns ``(cache, slots, token, logprob, raw_logprob)``, the last three ``[R]``: the first
    token of each row's turn, meaningful for rows whose chunk ends their pending tokens. Every
    row's settings are written to its slot, with ``generated = 1``: an intermediate chunk's are
    overwritten by its last chunk before the slot decodes.
    """

    def run(
        state, head, cache, slots, rows, starts, tokens, valid, seeds, temperature, top_k, top_p, max_new, stop_ids
    ):
        model: Transformer = nnx.merge(graphdef, state)
        chunk = tokens.shape[1]
        lengths = cache.lengths.at[rows].set(starts, mode="drop")
        view = cache.replace(lengths=lengths, rows=rows, window=window)
        positions = starts[:, None] + jnp.arange(chunk, dtype=jnp.int32)[None, :]
        mask = jnp.arange(chunk)[None, :] < valid[:, None]
        hidden, view = model.hidden_states(tokens, positions, mask, view)
        last = jnp.take_along_axis(hidden, jnp.maximum(valid - 1, 0)[:, None, None], axis=1)[:, 0]
        zeros = jnp.zeros_like(valid)
        token, lp, raw = _select(model, last, model.head_weight(), seeds, zeros, temperature, top_k, top_p, vocab_limit)
        put = lambda field, value: field.at[rows].set(value, mode="drop")  # noqa: E731
        slots = slots.replace(
            token=put(slots.token, token),
            generated=put(slots.generated, zeros + 1),
            seed=put(slots.seed, seeds),
            temperature=put(slots.temperature, temperature),
            top_k=put(slots.top_k, top_k),
            top_p=put(slots.top_p, top_p),
            max_new=put(slots.max_new, max_new),
            stop_ids=put(slots.stop_ids, stop_ids),
        )
        cache = view.replace(rows=None, window=0)
        return cache, slots, token, lp, raw

    return run


def decode_program(
    graphdef: nnx.GraphDef, vocab_limit: int, window: int, steps: int, pad_id: int, compact: bool = False
) -> Any:
    """Up to ``steps`` decode steps of every active slot, stopping early once none is active.

    Arguments of the returned function: ``state, head, cache, slots`` (as for
    :func:`prefill_program`) and ``active`` (``[slots]`` bool, the host's view of which slots
    decode). Returns ``(cache, slots, tokens, logprobs, raw_logprobs, count, active)``:
    ``[slots, steps]`` outputs of which each slot's first ``count`` are its new tokens, and which
    slots are still decoding (a slot stops at a stop token or ``max_new``).

    Inactive slots ride along: they feed their last token with an input mask of False, so their
    lengths do not move and the key they write lands past their length (never read before it is
    overwritten). Their settings are forced to greedy, so an idle slot left with top-p settings
    never switches on the vocabulary sort for the others.

    ``compact``: the step runs over ``rows`` (a further ``[R]`` argument, the slots to decode;
    ``R`` rows padded with ``slots``, out of range) instead of every slot: their first ``window``
    cache positions are gathered into a cache of ``R`` rows, decoded there, and the positions the
    steps wrote are scattered back. ``active`` is then ``[R]`` and the outputs are ``[R, ...]``.
    A slot's numbers do not depend on which slots were gathered with it beyond the float rounding
    of a matmul of another row count (see ``EngineConfig.compact_decode``).
    """

    def loop(model, head, view, slots, active):
        n = active.shape[0]
        temperature = jnp.where(active, slots.temperature, 0.0)
        top_k = jnp.where(active, slots.top_k, 0)
        top_p = jnp.where(active, slots.top_p, 1.0)
        out = (
            jnp.full((n, steps), pad_id, jnp.int32),
            jnp.zeros((n, steps), jnp.float32),
            jnp.zeros((n, steps), jnp.float32),
        )

        def cond(carry):
            i, _, _, _, active, _, _ = carry
            return (i < steps) & jnp.any(active)

        def body(carry):
            i, view, token, generated, active, count, out = carry
            positions = view.lengths[:, None]
            hidden, view = model.hidden_states(token[:, None], positions, active[:, None], view)
            new, lp, raw = _select(
                model, hidden[:, 0], head, slots.seed, generated, temperature, top_k, top_p, vocab_limit
            )
            values = (jnp.where(active, new, pad_id), jnp.where(active, lp, 0.0), jnp.where(active, raw, 0.0))
            out = tuple(jax.lax.dynamic_update_slice(b, v[:, None], (0, i)) for b, v in zip(out, values, strict=True))
            step = active.astype(jnp.int32)
            token, generated, count = jnp.where(active, new, token), generated + step, count + step
            finished = _is_stop(new, slots.stop_ids) | (generated >= slots.max_new)
            return i + 1, view, token, generated, active & ~finished, count, out

        count = jnp.zeros((n,), jnp.int32)
        carry = (jnp.int32(0), view, slots.token, slots.generated, active, count, out)
        _, view, token, generated, active, count, out = jax.lax.while_loop(cond, body, carry)
        return view, token, generated, active, count, out

    def run(state, head, cache, slots, active):
        model: Transformer = nnx.merge(graphdef, state)
        view, token, generated, active, count, out = loop(
            model, head, cache.replace(rows=None, window=window), slots, active
        )
        cache = view.replace(rows=None, window=0)
        return (cache, slots.replace(token=token, generated=generated), *out, count, active)

    def run_compact(state, head, cache, slots, active, rows):
        model: Transformer = nnx.merge(graphdef, state)
        take = lambda x: jnp.take(x, rows, axis=0, mode="clip")  # noqa: E731  padding rows read the last slot
        starts = take(cache.lengths)
        view = SlotCache(
            k=tuple(take(x[:, :, :window]) for x in cache.k),
            v=tuple(take(x[:, :, :window]) for x in cache.v),
            lengths=starts,
            window=window,
        )
        mine = jax.tree.map(take, slots)
        view, token, generated, active, count, out = loop(model, head, view, mine, active)
        # Back into the slots: the positions the steps wrote, the lengths, the last token and count.
        written = starts[:, None] + jnp.arange(steps, dtype=jnp.int32)[None, :]  # [R, steps]
        within = jnp.minimum(written, window - 1)
        slot = rows[:, None]

        def put(full, part):
            new = jnp.take_along_axis(part, within[:, None, :, None], axis=2)  # [R, kv, steps, d]
            return full.at[slot, :, written].set(new.transpose(0, 2, 1, 3), mode="drop")

        cache = cache.replace(
            k=tuple(put(f, c) for f, c in zip(cache.k, view.k, strict=True)),
            v=tuple(put(f, c) for f, c in zip(cache.v, view.v, strict=True)),
            lengths=cache.lengths.at[rows].set(view.lengths, mode="drop"),
        )
        slots = slots.replace(
            token=slots.token.at[rows].set(token, mode="drop"),
            generated=slots.generated.at[rows].set(generated, mode="drop"),
        )
        return (cache, slots, *out, count, active)

    return run_compact if compact else run


def head_program(graphdef: nnx.GraphDef) -> Any:
    """The LM head ``[embed, vocab]`` of a model state (see ``Transformer.head_weight``)."""
    return lambda state: nnx.merge(graphdef, state).head_weight()


def read_slot(cache: SlotCache, slot: jax.Array) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    """One slot's keys and values, per layer ``[kv_heads, max_len, head_dim]`` (to page it out)."""
    take = lambda x: jax.lax.dynamic_index_in_dim(x, slot, axis=0, keepdims=False)  # noqa: E731
    return tuple(take(k) for k in cache.k), tuple(take(v) for v in cache.v)


def write_slot(cache: SlotCache, slot: jax.Array, k: tuple[jax.Array, ...], v: tuple[jax.Array, ...]) -> SlotCache:
    """Puts paged-out keys and values back into ``slot`` (its length is set by the next prefill)."""
    put = lambda x, row: jax.lax.dynamic_update_index_in_dim(x, row, slot, axis=0)  # noqa: E731
    return cache.replace(
        k=tuple(put(x, r) for x, r in zip(cache.k, k, strict=True)),
        v=tuple(put(x, r) for x, r in zip(cache.v, v, strict=True)),
    )
