"""A slot-based decode engine for multi-turn rollouts: insert turns, step, collect finished turns.

:class:`~rl.generation.sampler.Sampler` runs whole prompts to completion, so a rollout would
re-prefill every episode's context each turn and wait for its slowest decode. The engine keeps
*slots*, each holding one sequence's KV cache (:class:`~rl.models.kv_cache.SlotCache`) across turns:

  - ``add(seq_id, token_ids, params, seed)`` queues a turn (a new sequence's prompt, or only the
    tokens appended to one that continues, after its last sampled token); ``step()`` prefills
    queued turns and runs decode steps; finished turns come back as
    :class:`~rl.generation.sampler.Completion`. A finished turn's sequence keeps its cache in its
    slot, idle, until its next turn or :meth:`DecodeEngine.release`; when a new sequence finds no
    free slot, the least recently used idle cache moves to host memory and back when needed.
  - It computes what is in flight. Prefill batches the waiting turns (rows and chunk in
    power-of-two buckets); attention reads the smallest window (a power of two from
    ``window_min``) the call's longest row fits in; decode runs over the decoding slots gathered
    into a power-of-two row count (``compact_decode``). Cache and slot state are donated to every
    program. :meth:`stats` counts real and padded tokens and each phase's time.
  - Sampling is the sampler's (:mod:`rl.generation.engine_programs`): a first turn gives the
    sampler's tokens for the same prompt, settings and seed, and a request's tokens depend neither
    on its neighbours nor on when it was inserted (its log-probs may in the last float bits,
    unless the shapes are fixed: :meth:`EngineConfig.exact`).
  - Several policy versions at once (:mod:`rl.generation.engine_weights`): asynchronous RL starts
    step ``u + 1``'s episodes while step ``u``'s stragglers still decode with their weights; each
    step decodes one version's slots (the others ride along masked, unchanged).

Host bookkeeping (which sequence holds which slot) lives here, each turn's tokens and ending in
:mod:`rl.generation.engine_seqs`; the device holds the cache and each slot's last token, step count
and settings. Sizes: :class:`~rl.generation.engine_config.EngineConfig`.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import time
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rl.generation.engine_config import EngineConfig
from rl.generation.engine_programs import (
    SlotState,
    decode_program,
    prefill_program,
    read_slot,
    write_slot,
)
from rl.generation.engine_seqs import SeqState, prefill_arrays
from rl.generation.engine_weights import EngineWeights
from rl.generation.sampler import Completion, SamplingParams
from rl.generation.tokenizer import Tokenizer
from rl.models.kv_cache import SlotCache
from rl.models.sharding import host_to_sharded, named_sharding
from rl.models.transformer import Transformer

#: The engine's counters (:meth:`DecodeEngine.stats`), each a running total since it was built.
STATS = (
    "prefill_tokens",  # prompt and observation tokens prefilled (real ones)
    "prefill_tokens_padded",  # rows x chunk of every prefill call: what was computed
    "prefill_tokens_reused",  # context a turn found in its cache instead of prefilling it
    "prefill_calls",
    "prefill_s",  # wall time of the prefill calls, device work and host bookkeeping
    "decode_steps",  # decode steps run (a call runs up to decode_steps, fewer once none decodes)
    "decode_tokens",  # tokens sampled by decode steps (real ones)
    "decode_tokens_padded",  # rows x steps of every decode call: what was computed
    "decode_calls",
    "decode_s",
    "paged_out",
    "paged_in",
)


def _bucket(n: int, buckets: Sequence[int]) -> int:
    return buckets[min(bisect.bisect_left(buckets, n), len(buckets) - 1)]


class DecodeEngine:
    """Decodes many sequences' turns at once in fixed slots, keeping each sequence's KV cache.

    Args:
      model: the policy (read in place on every call, as the sampler; see :meth:`update_weights`).
      tokenizer: stop ids, the pad id, decoding and the vocabulary limit.
      mesh: the model's mesh; slots are split over its ``data`` and ``fsdp`` axes.
      config: sizes, resolved (:meth:`EngineConfig.resolved`).

    Not thread-safe: one caller drives ``add`` / ``step`` / ``release``.
    """

    def __init__(self, model: Transformer, tokenizer: Tokenizer, mesh: Mesh, config: EngineConfig):
        if not isinstance(config, EngineConfig):
            raise TypeError(f"DecodeEngine(config=): expected an EngineConfig, got {type(config).__name__}")
        config.check_resolved("DecodeEngine(config=)")
        self._programs: dict[tuple, Any] = {}
        self.model = model
        self.tokenizer = tokenizer
        self.mesh = mesh
        self.config = cfg = config
        self._weights = EngineWeights(model, self._jit)
        self._vocab_limit = min(tokenizer.vocab_size, model.config.vocab_size)
        sizes = dict(mesh.shape)
        multiple = sizes.get("data", 1) * sizes.get("fsdp", 1)
        self.slots = -(-cfg.slots // multiple) * multiple
        self._stop_width = max(cfg.stop_width, len(tokenizer.stop_token_ids))
        self._seqs: dict[Hashable, SeqState] = {}
        self._queue: collections.deque[Hashable] = collections.deque()
        self._owner: list[Hashable | None] = [None] * self.slots
        self._slot_weights: list[Hashable] = [None] * self.slots  # the weights key of each decoding slot
        self._decoding = np.zeros(self.slots, bool)
        self._clock = 0
        self._stats: dict[str, float] = dict.fromkeys(STATS, 0)
        with jax.set_mesh(mesh):
            self._cache = jax.jit(
                lambda: SlotCache.zeros(model.config, self.slots, cfg.max_len, model.rules),
                out_shardings=self._cache_shardings(),
            )()
            self._slot_state = jax.jit(
                lambda: SlotState.zeros(self.slots, self._stop_width), out_shardings=self._slot_shardings()
            )()

    # -- shardings --------------------------------------------------------------------
    def _batch_sharding(self, shape: tuple[int, ...]) -> NamedSharding:
        return named_sharding(self.mesh, ("batch",) + (None,) * (len(shape) - 1), shape, self.model.rules)

    def _cache_shardings(self) -> SlotCache:
        cfg = self.model.config
        shape = (self.slots, cfg.num_kv_heads, self.config.max_len, cfg.head_dim)
        kv = named_sharding(self.mesh, ("batch", "kv_heads", "cache_seq", "head_dim"), shape, self.model.rules)
        layers = (kv,) * cfg.num_layers
        return SlotCache(k=layers, v=layers, lengths=self._batch_sharding((self.slots,)))

    def _slot_shardings(self) -> SlotState:
        one = self._batch_sharding((self.slots,))
        fields = {f.name: one for f in dataclasses.fields(SlotState)}
        return SlotState(**{**fields, "stop_ids": self._batch_sharding((self.slots, self._stop_width))})

    def _jit(self, key: tuple, build: Any, in_shardings: tuple, out_shardings: Any, donate: tuple[int, ...]) -> Any:
        if key not in self._programs:
            self._programs[key] = jax.jit(
                build(), in_shardings=in_shardings, out_shardings=out_shardings, donate_argnums=donate
            )
        return self._programs[key]

    # -- public API -------------------------------------------------------------------
    def update_weights(self, state_or_model: Any) -> None:
        """Decodes with these parameters from now on (as :meth:`Sampler.update_weights`).

        Caches already filled keep the keys and values of the weights that computed them.
        """
        self._weights.update(state_or_model)
        self.model = self._weights.model

    def load_weights(self, key: Hashable, state: Any) -> None:
        """Keeps another set of parameters (an ``nnx.State`` of the engine's model) under ``key``:
        turns added with ``weights=key`` decode with it, next to turns of other keys."""
        self._weights.load(key, state)

    def unload_weights(self, key: Hashable) -> None:
        """Forgets the parameters under ``key`` (no turn in flight may still use them)."""
        if any(s.weights == key and s.params is not None for s in self._seqs.values()):
            raise ValueError(f"unload_weights(key={key!r}): a turn in flight still decodes with these weights")
        self._weights.unload(key)

    @property
    def weights_keys(self) -> set[Hashable]:
        """Keys of the parameter sets held (``None``: update_weights')."""
        return self._weights.keys()

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing decoding."""
        return not self._queue and not self._decoding.any()

    @property
    def compiled_programs(self) -> set[tuple]:
        """Keys of the programs compiled so far: ("prefill", rows, chunk, window), ("decode", window, steps,
        rows), ..."""
        return set(self._programs)

    def stats(self) -> dict[str, float]:
        """The running totals of :data:`STATS`, and ``slots_busy`` (slots holding a sequence now) and
        ``compiled_programs``. Decode tokens over decode steps is the average number of slots that
        decoded; padded over real tokens, what the bucketed shapes cost."""
        busy = sum(o is not None for o in self._owner)
        return {**{k: float(v) for k, v in self._stats.items()}, "slots_busy": float(busy),
                "compiled_programs": float(len(self._programs))}  # fmt: skip

    def add(
        self, seq_id: Hashable, token_ids: Sequence[int], params: SamplingParams, seed: int, *, weights: Hashable = None
    ) -> None:
        """Queue one turn of ``seq_id``: append ``token_ids`` to its sequence (the whole prompt for a new
        sequence; only the new tokens, e.g. an observation, for one that continues), then generate until a
        stop token, a stop string or ``params.max_new_tokens``. A sequence has at most one turn in flight.

        ``weights``: the key of the parameters to decode with (:meth:`load_weights`); None: those of
        :meth:`update_weights`. The turn's cache entries are computed by these weights too."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"add(params=): expected SamplingParams, got {type(params).__name__}")
        if weights not in self._weights:
            raise KeyError(f"add(weights={weights!r}): no such weights; load_weights() them first")
        seq = self._seqs.get(seq_id)
        if seq is not None and seq.params is not None:
            raise ValueError(f"add(seq_id={seq_id!r}): this sequence already has a turn in flight")
        if seq is None and len(token_ids) == 0:
            raise ValueError(f"add(token_ids=): empty prompt for new sequence {seq_id!r}")
        stops = params.stop_token_ids if params.stop_token_ids is not None else self.tokenizer.stop_token_ids
        if len(stops) > self._stop_width:
            raise ValueError(f"add(params=): {len(stops)} stop_token_ids, at most {self._stop_width} (stop_width)")
        held = 0 if seq is None else seq.length + len(seq.pending)
        total = held + len(token_ids) + params.max_new_tokens - 1
        limit = min(self.config.max_len, self.model.config.max_position_embeddings)
        if total > limit:
            raise ValueError(
                f"add(token_ids=, params=): sequence {seq_id!r} would reach {total} cached tokens ({held} held + "
                f"{len(token_ids)} new + max_new_tokens={params.max_new_tokens} - 1), over the limit {limit} "
                f"(EngineConfig.max_len / max_position_embeddings)"
            )
        if seq is None:
            seq = self._seqs[seq_id] = SeqState()
        seq.pending += [int(t) for t in token_ids]
        seq.params, seq.seed, seq.stops, seq.weights = params, int(seed), tuple(stops), weights
        seq.ids, seq.logprobs, seq.raw = [], [], []
        self._queue.append(seq_id)

    def release(self, seq_id: Hashable) -> dict[str, int]:
        """Drops a sequence, its turn in flight if any, and its cache (the episode ended).

        Returns its counters over all its turns: ``prefill_tokens``, ``prefill_tokens_reused``.
        """
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise KeyError(f"release(seq_id={seq_id!r}): unknown sequence")
        if seq_id in self._queue:
            self._queue.remove(seq_id)
        if seq.slot is not None:
            self._owner[seq.slot], self._decoding[seq.slot] = None, False
        return {"prefill_tokens": seq.prefilled, "prefill_tokens_reused": seq.reused}

    def step(self) -> list[tuple[Hashable, Completion]]:
        """One iteration: prefill queued turns into slots (a new sequence takes a free slot; a continuing one
        its own slot, or is paged back in), then ``decode_steps`` decode steps for every decoding slot.
        Returns the turns that finished in this iteration; their slots stop decoding at once."""
        finished: list[tuple[Hashable, Completion]] = []
        with jax.set_mesh(self.mesh):
            ready = self._admit()
            if ready:
                t = time.perf_counter()
                finished += self._prefill(ready)
                self._stats["prefill_s"] += time.perf_counter() - t
            for key in dict.fromkeys(self._slot_weights[s] for s in np.flatnonzero(self._decoding)):
                active = self._decoding & np.array([w == key for w in self._slot_weights])
                t = time.perf_counter()
                finished += self._decode(self._weights.placed(key), active)
                self._stats["decode_s"] += time.perf_counter() - t
        return finished

    # -- slots ------------------------------------------------------------------------
    def _admit(self) -> list[Hashable]:
        """Gives queued turns slots, in order, paging idle sequences out as needed; returns the admitted."""
        ready, waiting = [], collections.deque()
        while self._queue:
            seq_id = self._queue.popleft()
            seq = self._seqs[seq_id]
            if seq.slot is None:
                slot = self._free_slot()
                if slot is None:
                    waiting.append(seq_id)
                    continue
                self._owner[slot], seq.slot = seq_id, slot
                if seq.paged is not None:
                    self._page_in(seq, slot)
            ready.append(seq_id)
        self._queue = waiting
        if waiting and not ready and not self._decoding.any():
            raise RuntimeError(
                f"step: {len(waiting)} queued turns but every slot holds an idle sequence and page_out is off; "
                "release finished sequences or enable EngineConfig.page_out"
            )
        return ready

    def _free_slot(self) -> int | None:
        for slot, owner in enumerate(self._owner):
            if owner is None:
                return slot
        if not self.config.page_out:
            return None
        idle = [(self._seqs[o].used, s) for s, o in enumerate(self._owner) if self._seqs[o].params is None]
        if not idle:
            return None
        _, slot = min(idle)
        self._page_out(slot)
        return slot

    def _page_out(self, slot: int) -> None:
        seq = self._seqs[self._owner[slot]]
        key = ("page_out",)
        program = self._jit(key, lambda: read_slot, (self._cache_shardings(), None), None, ())
        k, v = jax.device_get(program(self._cache, np.int32(slot)))
        seq.paged = ([x[:, : seq.length].copy() for x in k], [x[:, : seq.length].copy() for x in v])
        self._owner[slot], seq.slot = None, None
        self._stats["paged_out"] += 1

    def _page_in(self, seq: SeqState, slot: int) -> None:
        cfg = self.model.config
        rows = []
        for part in seq.paged:
            full = []
            for x in part:
                row = np.zeros((cfg.num_kv_heads, self.config.max_len, cfg.head_dim), x.dtype)
                row[:, : x.shape[1]] = x
                full.append(row)
            rows.append(tuple(full))
        shardings = self._cache_shardings()
        program = self._jit(("page_in",), lambda: write_slot, (shardings, None, None, None), shardings, (0,))
        self._cache = program(self._cache, np.int32(slot), *rows)
        seq.paged = None
        self._stats["paged_in"] += 1

    # -- prefill and decode -------------------------------------------------------------
    def _prefill(self, ready: list[Hashable]) -> list[tuple[Hashable, Completion]]:
        """Prefills every admitted turn's pending tokens (long ones chunk by chunk, rows grouped by
        weights and chunk bucket); samples first tokens."""
        cfg, finished = self.config, []
        for seq_id in ready:
            seq = self._seqs[seq_id]
            self._stats["prefill_tokens_reused"] += seq.length
            seq.reused += seq.length
        todo = list(ready)
        while todo:
            groups: dict[tuple[Hashable, int], list[Hashable]] = collections.defaultdict(list)
            for seq_id in todo:
                seq = self._seqs[seq_id]
                n = min(len(seq.pending), cfg.prefill_buckets[-1])
                groups[seq.weights, _bucket(n, cfg.prefill_buckets)].append(seq_id)
            for (key, chunk), members in sorted(groups.items(), key=lambda kv: kv[0][1]):  # stable: by chunk
                state = self._weights.placed(key)
                most = cfg.prefill_rows or 1 << max(0, (cfg.prefill_tokens // chunk).bit_length() - 1)
                for i in range(0, len(members), most):
                    finished += self._prefill_call(state, chunk, members[i : i + most])
            # Still prefilling: neither decoding nor finished on its first token.
            todo = [s for s in todo if self._seqs[s].params is not None and not self._decoding[self._seqs[s].slot]]
        return finished

    def _prefill_call(self, state: Any, chunk: int, members: list[Hashable]) -> list[tuple[Hashable, Completion]]:
        rows = self.config.prefill_rows or 1 << (len(members) - 1).bit_length()
        seqs = [self._seqs[s] for s in members]
        take = [min(len(s.pending), chunk) for s in seqs]
        window = _bucket(max(s.length + n for s, n in zip(seqs, take, strict=True)), self.config.windows())
        args = prefill_arrays(seqs, take, rows, chunk, self.slots, self.tokenizer.pad_id, self._stop_width)
        in_shardings = (self._weights.shardings, None, self._cache_shardings(), self._slot_shardings())
        in_shardings += tuple(self._batch_sharding(a.shape) for a in args)
        out_shardings = (
            self._cache_shardings(),
            self._slot_shardings(),
            *(NamedSharding(self.mesh, PartitionSpec()),) * 3,
        )
        program = self._jit(
            ("prefill", rows, chunk, window),
            lambda: prefill_program(self._weights.graphdef, self._vocab_limit, window),
            in_shardings,
            out_shardings,
            (2, 3),
        )
        args = tuple(host_to_sharded(a, self._batch_sharding(a.shape)) for a in args)
        self._cache, self._slot_state, token, lp, raw = program(*state, self._cache, self._slot_state, *args)
        token, lp, raw = jax.device_get((token, lp, raw))
        self._stats["prefill_tokens_padded"] += rows * chunk
        self._stats["prefill_calls"] += 1
        finished = []
        for r, (seq_id, seq, n) in enumerate(zip(members, seqs, take, strict=True)):
            seq.pending, seq.length = seq.pending[n:], seq.length + n
            self._stats["prefill_tokens"] += n
            seq.prefilled += n
            if seq.pending:
                continue
            seq.start = seq.length
            self._decoding[seq.slot], self._slot_weights[seq.slot] = True, seq.weights
            done = self._extend(seq, [int(token[r])], [float(lp[r])], [float(raw[r])], still=True)
            if done is not None:
                finished.append((seq_id, done))
        return finished

    def _decode(self, state: Any, active: np.ndarray) -> list[tuple[Hashable, Completion]]:
        """``decode_steps`` steps of the ``active`` slots (all decoding with ``state``): over every slot,
        or, with ``compact_decode``, over the active ones gathered into a power-of-two row count."""
        steps = self.config.decode_steps
        decoding = np.flatnonzero(active)
        longest = max(self._seqs[self._owner[s]].length for s in decoding)
        window = _bucket(min(longest + steps, self.config.max_len), self.config.windows())
        rows = 1 << (len(decoding) - 1).bit_length()
        compact = self.config.compact_decode and rows < self.slots
        cache, slot_state = self._cache_shardings(), self._slot_shardings()
        replicated = NamedSharding(self.mesh, PartitionSpec())
        if compact:
            slot_ids = np.full(rows, self.slots, np.int32)  # padding rows point past the cache: dropped
            slot_ids[: len(decoding)] = decoding
            mask = np.arange(rows) < len(decoding)
            extra = (mask, slot_ids)
        else:
            extra = (active,)
        program = self._jit(
            ("decode", window, steps, rows if compact else self.slots),
            lambda: decode_program(
                self._weights.graphdef, self._vocab_limit, window, steps, self.tokenizer.pad_id, compact=compact
            ),
            (self._weights.shardings, None, cache, slot_state, *(self._row_sharding(a.shape, compact) for a in extra)),
            (cache, slot_state, *(replicated,) * 5),
            (2, 3),
        )
        placed = tuple(host_to_sharded(a, self._row_sharding(a.shape, compact)) for a in extra)
        self._cache, self._slot_state, *out = program(*state, self._cache, self._slot_state, *placed)
        tokens, lps, raws, count, still = jax.device_get(out)
        ran = int(count.max())
        self._stats["decode_steps"] += ran
        self._stats["decode_tokens"] += int(count.sum())
        self._stats["decode_tokens_padded"] += ran * (rows if compact else self.slots)
        self._stats["decode_calls"] += 1
        finished = []
        for row, slot in enumerate(decoding):
            i = row if compact else slot
            seq_id = self._owner[slot]
            seq, n = self._seqs[seq_id], int(count[i])
            seq.length += n
            done = self._extend(seq, tokens[i, :n].tolist(), lps[i, :n].tolist(), raws[i, :n].tolist(),
                                still=bool(still[i]))  # fmt: skip
            if done is not None:
                finished.append((seq_id, done))
        return finished

    def _row_sharding(self, shape: tuple[int, ...], compact: bool) -> NamedSharding:
        """A compacted call's rows are few and gathered from every shard: replicated; else split like the slots."""
        return NamedSharding(self.mesh, PartitionSpec()) if compact else self._batch_sharding(shape)

    def _extend(
        self, seq: SeqState, ids: list[int], lps: list[float], raws: list[float], still: bool
    ) -> Completion | None:
        """Appends a turn's new tokens; the Completion if the turn ended (its slot then stops decoding)."""
        done = seq.extend(ids, lps, raws, still, self.tokenizer)
        if done is not None:
            self._decoding[seq.slot] = False
            self._clock += 1
            seq.used = self._clock
        return done
