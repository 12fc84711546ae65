"""The decode engine's host view of one sequence, and how its turn in flight grows and ends.

:class:`rl.generation.engine.DecodeEngine` schedules slots; what happens to one sequence's turn
(tokens appended as steps return them, the turn ending on a stop token, a stop string or its token
limit, its :class:`~rl.generation.sampler.Completion` cut as the sampler cuts one) depends only on
that sequence and the tokenizer, so it lives here, on :class:`SeqState`; so does laying a prefill
call's sequences out as rows (:func:`prefill_arrays`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

import numpy as np

from rl.generation.sampler import Completion, SamplingParams, _stop_string_cut
from rl.generation.tokenizer import Tokenizer


@dataclasses.dataclass
class SeqState:
    """Host view of one sequence: where its cache is, how long it is, its turn in flight."""

    slot: int | None = None
    paged: tuple[list[np.ndarray], list[np.ndarray]] | None = None
    length: int = 0  # tokens in its cache
    pending: list[int] = dataclasses.field(default_factory=list)  # to prefill before the turn decodes
    params: SamplingParams | None = None  # the turn in flight, if any
    weights: Hashable = None  # key of the parameters its turns decode with
    seed: int = 0
    stops: tuple[int, ...] = ()
    start: int = 0  # cache length when the turn's first token was sampled
    ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    raw: list[float] = dataclasses.field(default_factory=list)
    used: int = 0  # LRU clock
    prefilled: int = 0  # tokens this sequence prefilled, over all its turns
    reused: int = 0  # context its turns found in their cache

    def extend(
        self, ids: list[int], lps: list[float], raws: list[float], still: bool, tokenizer: Tokenizer
    ) -> Completion | None:
        """Appends the turn's new tokens; the Completion if the turn ended (the sequence is then idle)."""
        self.ids += ids
        self.logprobs += lps
        self.raw += raws
        p = self.params
        last = self.ids[-1]
        stopped = last in self.stops
        going = still and not stopped and len(self.ids) < p.max_new_tokens
        if going and not (p.stop_strings and self._stop_string_in_tail(len(ids), tokenizer)):
            return None
        return self._complete(stopped, tokenizer)

    def _stop_string_in_tail(self, new: int, tokenizer: Tokenizer) -> bool:
        """Whether a stop string ends within the ``new`` last tokens (earlier ones were checked already).

        A token decodes to at least one byte and a character is at most 4, so a string of ``c``
        characters spans at most ``4c`` tokens; two more absorb a character split at the edge.
        """
        span = new + 4 * max(len(s) for s in self.params.stop_strings) + 2
        text = tokenizer.decode(self.ids[-span:])
        return any(s in text for s in self.params.stop_strings)

    def _complete(self, stopped: bool, tokenizer: Tokenizer) -> Completion:
        """The turn's Completion (cut at a stop string, as the sampler); the sequence turns idle."""
        ids, p = self.ids, self.params
        stop: int | str | None = ids[-1] if stopped else None
        if p.stop_strings:
            cut = _stop_string_cut(tokenizer, ids, p.stop_strings)
            if cut is not None:
                ids, stop, stopped = ids[: cut[0]], cut[1], True
        n = len(ids)
        # The cache holds the turn's tokens but its last: the next turn prefills that one first.
        self.length, self.pending = self.start + n - 1, [ids[-1]]
        self.params = None
        return Completion(
            token_ids=list(ids),
            logprobs=self.logprobs[:n],
            raw_logprobs=self.raw[:n],
            finish_reason="stop" if stopped else "length",
            stop=stop,
            text=tokenizer.decode(ids),
        )


def prefill_arrays(
    seqs: list[SeqState], take: list[int], rows: int, chunk: int, slots: int, pad_id: int, stop_width: int
) -> tuple[np.ndarray, ...]:
    """A prefill call's host arrays: each sequence's next ``take`` pending tokens in a row of ``chunk``,
    with its slot, cache length and sampling settings; ``rows`` pads the batch to its bucket.

    Padding rows name slot ``slots`` (past the cache), so the program drops what they write.
    """
    slot = np.full(rows, slots, np.int32)
    starts, valid, max_new = (np.zeros(rows, np.int32) for _ in range(3))
    tokens = np.full((rows, chunk), pad_id, np.int32)
    temperature, top_p = np.zeros(rows, np.float32), np.ones(rows, np.float32)
    top_k, seeds = np.zeros(rows, np.int32), np.zeros(rows, np.uint32)
    stop_ids = np.full((rows, stop_width), -1, np.int32)
    for r, (seq, n) in enumerate(zip(seqs, take, strict=True)):
        p = seq.params
        slot[r], starts[r], valid[r], tokens[r, :n] = seq.slot, seq.length, n, seq.pending[:n]
        temperature[r], top_k[r], top_p[r], max_new[r] = p.temperature, p.top_k, p.top_p, p.max_new_tokens
        seeds[r], stop_ids[r, : len(seq.stops)] = seq.seed % 2**32, seq.stops
    return slot, starts, tokens, valid, seeds, temperature, top_k, top_p, max_new, stop_ids
