"""Batched generation for RL rollouts: one jitted prefill + ``while_loop`` decode, bucketed shapes.

``Sampler.generate(prompts, params, seeds)`` takes prompt token ids (never text: the rollout
loop owns tokenization, see :mod:`rl.generation.tokenizer`) and returns, per prompt, the sampled ids, two
log-probs per token (see :mod:`rl.generation.token_selection`) and why it finished.

Design choices and why:
  - **Left padding with per-row positions.** Prompts are padded on the left to a common length,
    so every row appends its next token at the same cache slot (a cheap ``dynamic_update_slice``
    instead of a scatter) and the last prompt position holds every row's next-token logits. RoPE
    positions are per row and padding slots are masked out of attention, so a request's output
    does not depend on its neighbours (tested to 1e-5).
  - **Bucketed shapes.** Batch size, prompt length and max-new-tokens are rounded up to a few
    bucket sizes, so a run compiles a handful of programs instead of one per shape.
  - **Per-request settings and seeds are arrays**, not static arguments: mixing greedy and
    sampled requests, or changing top-p, never recompiles. Step ``i`` of a request uses
    ``fold_in(key(seed), i)``, so its sample is reproducible whatever the batch.
  - **The learner's parameters, not a copy.** The sampler reads ``nnx.state(model)`` on every
    call, so in-place updates to the model (``nnx.update``, an optimizer step on the same
    module) are picked up with no transfer; a learner holding a separate state passes it to
    :meth:`Sampler.update_weights`.
  - **The decode loop in segments** over a growing cache (:func:`_segment_ends`): attention
    reads every slot it is given, so early steps of a long generation would mostly read empty
    slots; each segment attends over just the slots it can have filled. Only the number of masked
    slots in a softmax changes (measured: log-probs move by < 4e-6, tokens do not change).
  - **Stop strings on the host**, after decode: the completion is cut after the token that
    completes the earliest stop string (token-exact: the text is always ``decode(token_ids)``).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rl.config.schema import increasing_ints, setting, validate
from rl.generation.token_selection import select_tokens
from rl.generation.tokenizer import Tokenizer
from rl.models.kv_cache import KVCache
from rl.models.sharding import Rules, constrain, host_to_sharded, named_sharding
from rl.models.transformer import Transformer


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled.

    Attributes:
      temperature: 0 for greedy decoding; otherwise logits are divided by it.
      top_k: keep the k most likely tokens (0 = off).
      top_p: keep the smallest nucleus with this much probability (1 = off).
      max_new_tokens: hard cap on generated tokens (the stop token counts).
      stop_token_ids: ids that end the completion (kept as its last token); ``None`` uses the
        tokenizer's ``stop_token_ids``.
      stop_strings: strings that end the completion, checked on the decoded text after decode.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] | None = None
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"SamplingParams.temperature: expected >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k: expected an int >= 0, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p: expected in (0, 1], got {self.top_p!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens: expected an int >= 1, got {self.max_new_tokens!r}")
        if self.stop_token_ids is not None:
            object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in self.stop_token_ids))
        if isinstance(self.stop_strings, str) or any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise ValueError(
                f"SamplingParams.stop_strings: expected a tuple of non-empty str, got {self.stop_strings!r}"
            )
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Shape buckets and defaults of a :class:`Sampler`.

    Attributes:
      batch_buckets: batch sizes compiled for (a larger batch is split into chunks of the
        largest); each is also rounded up to a multiple of the mesh's batch parallelism.
      prompt_buckets: padded prompt lengths (a longer prompt rounds up to a multiple of the last).
      new_token_buckets: decode-loop lengths (cache = prompt bucket + this).
      prefill_chunk: prompts longer than this are prefilled this many tokens at a time (their
        padded length is rounded up to a multiple of it), bounding attention memory: a chunk's
        float32 scores are ``[batch, heads, chunk, cache length]``, and XLA keeps several such
        tensors, so a long chunk costs gigabytes at a batch of hundreds of long prompts (where a
        short one leaves little beyond the KV cache itself) without running faster on CPU.
      seed: seeds requests that come without one.
    """

    batch_buckets: tuple[int, ...] = increasing_ints((1, 2, 4, 8, 16, 32, 64, 128))
    prompt_buckets: tuple[int, ...] = increasing_ints((32, 64, 128, 256, 512, 1024, 2048, 4096))
    new_token_buckets: tuple[int, ...] = increasing_ints((16, 64, 256, 1024, 4096))
    prefill_chunk: int = setting(32, low=1)
    seed: int = 0

    def __post_init__(self) -> None:
        validate(self)


@dataclasses.dataclass(frozen=True)
class Completion:
    """One generated completion.

    Attributes:
      token_ids: sampled ids, the stop token included when one ended the completion.
      logprobs: per token, log-prob under the distribution sampled from (temperature-scaled,
        top-k/top-p filtered; 0 for greedy).
      raw_logprobs: per token, log-prob under the model at temperature 1, full vocabulary.
      finish_reason: ``"stop"`` (stop token or stop string) or ``"length"``.
      stop: the stop token id or stop string that ended it, if any.
      text: ``tokenizer.decode(token_ids)``.
    """

    token_ids: list[int]
    logprobs: list[float]
    raw_logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    stop: int | str | None
    text: str


def _bucket(n: int, buckets: Sequence[int]) -> int:
    i = bisect.bisect_left(buckets, n)
    return buckets[i] if i < len(buckets) else -(-n // buckets[-1]) * buckets[-1]


#: The decode loop runs in up to this many segments, each attending over a cache just long enough for it ...
DECODE_SEGMENTS = 4
#: ... of at least this many steps each (every segment is one more copy of the decode step to compile).
MIN_SEGMENT_STEPS = 32


def _segment_ends(num_new: int) -> list[int]:
    """Step bounds of the decode loop's segments: segment ``i`` runs steps ``[ends[i-1], ends[i])``.

    Attention reads every slot of the cache it is given, filled or not. Segment ``i`` attends over
    ``prompt + ends[i]`` slots instead of ``prompt + num_new`` (the next segment's cache is this
    one padded), so with 4 segments a step reads ``3/8 * num_new`` fewer slots on average.
    """
    segments = max(1, min(DECODE_SEGMENTS, num_new // MIN_SEGMENT_STEPS))
    return [-(-num_new * (i + 1) // segments) for i in range(segments)]


def _grow(cache: KVCache, max_len: int, rules: Rules) -> KVCache:
    """``cache`` with empty (masked-out) slots appended up to ``max_len`` slots."""
    logical = ("batch", "kv_heads", "cache_seq", "head_dim")
    pad = lambda x: constrain(jnp.pad(x, ((0, 0), (0, 0), (0, max_len - x.shape[2]), (0, 0))), logical, rules)  # noqa: E731
    mask = jnp.pad(cache.mask, ((0, 0), (0, max_len - cache.mask.shape[1])))
    return cache.replace(k=tuple(map(pad, cache.k)), v=tuple(map(pad, cache.v)), mask=mask)


def _decode_program(graphdef: nnx.GraphDef, vocab_limit: int, num_new: int, pad_id: int, prefill_chunk: int) -> Any:
    """The traced body of one generate call (see module doc); shapes fix the compiled program."""

    def run(state, tokens, prompt_lens, temperature, top_k, top_p, max_new, stop_ids, seeds):
        model: Transformer = nnx.merge(graphdef, state)
        batch, prompt_len = tokens.shape
        positions = jnp.arange(prompt_len)[None, :] - (prompt_len - prompt_lens)[:, None]
        ends = _segment_ends(num_new)
        # The prefill and the first segment's steps write slots [0, prompt_len + ends[0] - 1).
        cache = KVCache.zeros(model.config, batch, prompt_len + ends[0], model.rules)
        # Chunked prefill: attention scores are [chunk, cache length] per head, not
        # [prompt, cache length], so long prompts do not blow up memory.
        chunk = min(prompt_len, prefill_chunk)

        def prefill(i, carry):
            _, cache = carry
            window = lambda x: jax.lax.dynamic_slice_in_dim(x, i * chunk, chunk, axis=1)  # noqa: E731
            pos = window(positions)
            return model.hidden_states(window(tokens), jnp.maximum(pos, 0), pos >= 0, cache)

        hidden = jnp.zeros((batch, chunk, model.config.hidden_size), model.config.compute_dtype)
        hidden, cache = jax.lax.fori_loop(0, prompt_len // chunk, prefill, (hidden, cache))
        row_keys = jax.vmap(jax.random.key)(seeds)
        head = model.head_weight()  # materialised once, outside the decode loop

        def pick(logits, step):
            keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, step)
            return select_tokens(logits, keys, temperature, top_k, top_p, vocab_limit)

        def is_stop(tok):
            return jnp.any(tok[:, None] == stop_ids, axis=-1)

        tok, lp, raw = pick(model.logits(hidden[:, -1], head), 0)
        out = (
            jnp.full((batch, num_new), pad_id, jnp.int32).at[:, 0].set(tok),
            jnp.zeros((batch, num_new), jnp.float32).at[:, 0].set(lp),
            jnp.zeros((batch, num_new), jnp.float32).at[:, 0].set(raw),
        )
        stopped = is_stop(tok)
        lengths = jnp.ones((batch,), jnp.int32)
        done = stopped | (lengths >= max_new)

        def body(carry):
            step, tok, cache, out, done, lengths, stopped = carry
            pos = (prompt_lens + step - 1)[:, None]
            hidden, cache = model.hidden_states(tok[:, None], pos, ~done[:, None], cache)
            new, lp, raw = pick(model.logits(hidden[:, 0], head), step)
            active = ~done
            new = jnp.where(active, new, pad_id)
            values = (new, jnp.where(active, lp, 0.0), jnp.where(active, raw, 0.0))
            out = tuple(
                jax.lax.dynamic_update_slice(buf, val[:, None], (0, step)) for buf, val in zip(out, values, strict=True)
            )
            hit = active & is_stop(new)
            lengths = lengths + active.astype(jnp.int32)
            return step + 1, new, cache, out, done | hit | (lengths >= max_new), lengths, stopped | hit

        carry = (jnp.int32(1), tok, cache, out, done, lengths, stopped)
        for i, end in enumerate(ends):
            if i:  # the last segment's cache has prompt_len + num_new slots, as without segments
                carry = (*carry[:2], _grow(carry[2], prompt_len + end, model.rules), *carry[3:])
            cond = lambda c, end=end: (c[0] < end) & ~jnp.all(c[4])  # noqa: E731
            carry = jax.lax.while_loop(cond, body, carry)
        _, _, _, out, _, lengths, stopped = carry
        return (*out, lengths, stopped)

    return run


class Sampler:
    """Generates completions for batches of prompt ids with a model sharded on ``mesh``.

    Args:
      model: the policy (its parameters are used in place, see :meth:`update_weights`).
      tokenizer: for stop ids, the pad id, decoding and the vocabulary limit.
      mesh: the model's mesh; batches are split over its ``data`` and ``fsdp`` axes.
      config: shape buckets and the default seed.

    On a multi-process mesh every process calls :meth:`generate` with the same arguments (SPMD);
    each feeds only its own devices and every process receives all completions.
    """

    def __init__(self, model: Transformer, tokenizer: Tokenizer, mesh: Mesh, config: SamplerConfig | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.mesh = mesh
        self.config = config or SamplerConfig()
        self._graphdef, state = nnx.split(model)
        self._state: Any = None
        self._rng = np.random.default_rng(self.config.seed)
        self._programs: dict[tuple[int, int, int], Any] = {}
        sizes = dict(mesh.shape)
        self._batch_multiple = sizes.get("data", 1) * sizes.get("fsdp", 1)
        self._state_shardings = jax.tree.map(lambda x: x.sharding, state)
        self._vocab_limit = min(tokenizer.vocab_size, model.config.vocab_size)

    def update_weights(self, state_or_model: Any) -> None:
        """Samples from these parameters from now on.

        A ``Transformer`` (same architecture) becomes the module read on every call, so its
        later in-place updates are seen; an ``nnx.State`` is pinned until the next call here.
        """
        if isinstance(state_or_model, nnx.Module):
            if nnx.split(state_or_model)[0] != self._graphdef:
                raise ValueError("update_weights: the model's structure differs from the sampler's model")
            self.model, self._state = state_or_model, None
        else:
            self._state = state_or_model

    @property
    def compiled_shapes(self) -> set[tuple[int, int, int]]:
        """(batch, prompt length, new tokens) buckets compiled so far: one program each."""
        return set(self._programs)

    def _batch_sharding(self, shape: tuple[int, ...]) -> NamedSharding:
        return named_sharding(self.mesh, ("batch",) + (None,) * (len(shape) - 1), shape, self.model.rules)

    def _program(self, shapes: list[tuple[int, ...]], num_new: int) -> Any:
        key = (shapes[0][0], shapes[0][1], num_new)
        if key not in self._programs:
            run = _decode_program(
                self._graphdef, self._vocab_limit, num_new, self.tokenizer.pad_id, self.config.prefill_chunk
            )
            in_shardings = (self._state_shardings, *(self._batch_sharding(s) for s in shapes))
            out_shardings = NamedSharding(self.mesh, PartitionSpec())
            self._programs[key] = jax.jit(run, in_shardings=in_shardings, out_shardings=out_shardings)
        return self._programs[key]

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Completion]:
        """Completions for ``prompts`` (lists of token ids), in order.

        ``params`` is one setting for all prompts or one per prompt; ``seeds`` (one int per
        prompt) make each request reproducible regardless of batch composition.
        """
        n = len(prompts)
        if n == 0:
            return []
        params_list = [params or SamplingParams()] * n if not isinstance(params, Sequence) else list(params)
        if len(params_list) != n:
            raise ValueError(f"params: expected 1 or {n} SamplingParams, got {len(params_list)}")
        if seeds is None:
            seeds = [int(s) for s in self._rng.integers(0, 2**32, size=n)]
        if len(seeds) != n:
            raise ValueError(f"seeds: expected {n} seeds (one per prompt), got {len(seeds)}")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompts[{i}]: empty prompt (at least one token is needed)")
            total = len(p) + params_list[i].max_new_tokens
            if total > self.model.config.max_position_embeddings:
                raise ValueError(
                    f"prompts[{i}]: {len(p)} prompt + {params_list[i].max_new_tokens} new tokens exceed the model's "
                    f"max_position_embeddings={self.model.config.max_position_embeddings}"
                )
        chunk = self.config.batch_buckets[-1]
        results: list[Completion] = []
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            results += self._generate_chunk(prompts[start:end], params_list[start:end], seeds[start:end])
        return results

    def _generate_chunk(
        self, prompts: Sequence[Sequence[int]], params: list[SamplingParams], seeds: Sequence[int]
    ) -> list[Completion]:
        cfg, tok = self.config, self.tokenizer
        n = len(prompts)
        batch = _bucket(n, cfg.batch_buckets)
        batch = -(-batch // self._batch_multiple) * self._batch_multiple
        prompt_len = _bucket(max(len(p) for p in prompts), cfg.prompt_buckets)
        if prompt_len > cfg.prefill_chunk:
            prompt_len = -(-prompt_len // cfg.prefill_chunk) * cfg.prefill_chunk
        num_new = _bucket(max(p.max_new_tokens for p in params), cfg.new_token_buckets)
        stops = [p.stop_token_ids if p.stop_token_ids is not None else tok.stop_token_ids for p in params]
        width = max(1, *(len(s) for s in stops))

        tokens = np.full((batch, prompt_len), tok.pad_id, np.int32)
        prompt_lens = np.ones((batch,), np.int32)
        stop_ids = np.full((batch, width), -1, np.int32)
        for i, (p, s) in enumerate(zip(prompts, stops, strict=True)):
            tokens[i, prompt_len - len(p) :] = p
            prompt_lens[i] = len(p)
            stop_ids[i, : len(s)] = s
        pad_rows = batch - n  # dummy one-token rows, finished after one step
        column = lambda values, dtype: np.asarray(list(values) + [values[0]] * pad_rows, dtype)  # noqa: E731
        args = (
            tokens,
            prompt_lens,
            column([p.temperature for p in params], np.float32),
            column([p.top_k for p in params], np.int32),
            column([p.top_p for p in params], np.float32),
            np.asarray([p.max_new_tokens for p in params] + [1] * pad_rows, np.int32),
            stop_ids,
            np.asarray([s % 2**32 for s in seeds] + [0] * pad_rows, np.uint32),
        )
        program = self._program([a.shape for a in args], num_new)
        # make_array_from_callback, unlike device_put, is also right on a multi-process mesh
        # (every process passes the same prompts; each fills only its own devices).
        args = tuple(host_to_sharded(a, self._batch_sharding(a.shape)) for a in args)
        state = self._state if self._state is not None else nnx.state(self.model)
        # A learner may hand back arrays placed differently (e.g. after an optimizer step).
        state = jax.tree.map(lambda x, s: x if x.sharding == s else jax.device_put(x, s), state, self._state_shardings)
        with jax.set_mesh(self.mesh):
            out_tok, out_lp, out_raw, lengths, stopped = jax.device_get(program(state, *args))
        return [
            self._finish(out_tok[i, : lengths[i]], out_lp[i], out_raw[i], bool(stopped[i]), params[i]) for i in range(n)
        ]

    def _finish(
        self, ids: np.ndarray, lp: np.ndarray, raw: np.ndarray, stopped: bool, params: SamplingParams
    ) -> Completion:
        ids = [int(i) for i in ids]
        stop: int | str | None = ids[-1] if stopped else None
        if params.stop_strings:
            cut = _stop_string_cut(self.tokenizer, ids, params.stop_strings)
            if cut is not None:
                ids, stop, stopped = ids[: cut[0]], cut[1], True
        n = len(ids)
        return Completion(
            token_ids=ids,
            logprobs=[float(x) for x in lp[:n]],
            raw_logprobs=[float(x) for x in raw[:n]],
            finish_reason="stop" if stopped else "length",
            stop=stop,
            text=self.tokenizer.decode(ids),
        )


def _stop_string_cut(tokenizer: Tokenizer, ids: list[int], stop_strings: Sequence[str]) -> tuple[int, str] | None:
    """(number of tokens to keep, matched string) for the stop string completed first, or None."""

    def found(n: int) -> list[str]:
        text = tokenizer.decode(ids[:n])
        return sorted((s for s in stop_strings if s in text), key=text.find)

    if not found(len(ids)):
        return None
    # Fewest tokens whose decoded text contains a stop string: "contains" only switches from
    # false to true as the prefix grows, so binary search over the prefix length.
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if found(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo, found(lo)[0]
