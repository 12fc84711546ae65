"""The decode engine's sizes (:class:`EngineConfig`): ``config.engine``, its checks, the windows they imply.

A config is data that a run states and checks before anything starts, so it lives apart from
:mod:`rl.generation.engine`, which holds the engine that runs with it. A run's config leaves the
sizes that follow from the rest of the experiment at 0 (``slots``, ``max_len``) or empty
(``prefill_buckets``); :meth:`EngineConfig.resolved` fills them in
(:func:`rl.run.experiment.engine_config`), and ``config.rollout.reproducible`` fixes every shape
(:meth:`EngineConfig.exact`).
"""

from __future__ import annotations

import dataclasses

from rl.config.schema import increasing_ints, setting, validate

#: The largest chunk a prefill call computes at once when ``prefill_buckets`` is derived: a longer
#: prompt is prefilled chunk by chunk (each chunk's attention reads the cache before it).
MAX_DERIVED_CHUNK = 1024
#: The most slots a run derives (one per episode of a step, beyond which episodes wait for one).
MAX_DERIVED_SLOTS = 256


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Sizes of a :class:`~rl.generation.engine.DecodeEngine` (``config.engine`` of a run).

    Attributes:
      slots: sequences decoded at once (rounded up to the mesh's batch parallelism); 0: one per
        episode a training step starts (``loop.tasks_per_step x rollout.group_size``, at most
        :data:`MAX_DERIVED_SLOTS`); more episodes wait for a slot.
      max_len: cache length per sequence: prompt + every turn + every observation; 0:
        ``rollout.max_context + rollout.max_new_tokens``.
      prefill_buckets: padded chunk lengths of a prefill; longer pending tokens are prefilled in
        chunks of the largest. Empty: powers of two from 16 and the midpoints between them (24,
        48, 96...: a chunk pads at most half of itself) below ``min(max_len, MAX_DERIVED_CHUNK)``,
        then that.
      page_out: when every slot is taken, an idle sequence's cache moves to host memory.
      decode_steps: decode steps per :meth:`~rl.generation.engine.DecodeEngine.step` call (>1
        amortises the host round trip; a turn finishing mid-call idles its slot for the rest of it).
      prefill_tokens: the most padded tokens (rows x chunk) one prefill call computes; rows of one
        chunk bucket are batched up to this, in powers of two.
      window_min: the smallest attention window; windows are powers of two from here up to
        ``max_len`` (and ``max_len`` itself). A call reads only the window its longest row needs.
      stop_width: the most stop token ids a request may carry.
      prefill_rows: 0: a prefill call batches as many rows as are waiting (powers of two, up to
        ``prefill_tokens``); N > 0: every prefill call has exactly N rows.
      compact_decode: a decode call gathers the decoding slots into the smallest power-of-two
        row count that holds them and decodes only those (their cache up to the window), when
        that is fewer rows than ``slots``; off: every slot rides along.

    A request's tokens do not depend on what decodes beside it; its log-probs may, in the last
    float bits: XLA's matmuls round a row differently in a batch of another size (three regimes on
    a CPU: one row, a few, many), and a softmax over a longer window sums in another order. Fixed
    shapes (:meth:`exact`) make them bit-identical, which a bit-for-bit resume needs.
    """

    slots: int = setting(0, low=0)
    max_len: int = setting(0, low=0)
    prefill_buckets: tuple[int, ...] = increasing_ints((), allow_empty=True)
    page_out: bool = True
    decode_steps: int = setting(4, low=1)
    prefill_tokens: int = setting(2048, low=1)
    window_min: int = setting(128, low=1)
    stop_width: int = setting(8, low=1)
    prefill_rows: int = setting(0, low=0)
    compact_decode: bool = True

    def __post_init__(self) -> None:
        validate(self)

    def resolved(self, *, slots: int, max_len: int) -> EngineConfig:
        """These sizes with the derived ones filled in: ``slots`` and ``max_len`` where they are 0, and
        the prefill buckets from ``max_len`` where they are empty."""
        slots = self.slots or min(MAX_DERIVED_SLOTS, slots)
        max_len = self.max_len or max_len
        top = min(max_len, MAX_DERIVED_CHUNK)
        steps = sorted({n for i in range(4, top.bit_length()) for n in (1 << i, 3 << (i - 1))})
        buckets = self.prefill_buckets or (*(n for n in steps if n < top), top)
        return dataclasses.replace(self, slots=slots, max_len=max_len, prefill_buckets=buckets)

    def check_resolved(self, where: str) -> None:
        """Raises naming the first size still left for a run to derive (0 or empty)."""
        for name in ("slots", "max_len", "prefill_buckets"):
            if not getattr(self, name):
                raise ValueError(
                    f"{where}: EngineConfig.{name} is derived by a run (0 or empty); "
                    "give it, or use EngineConfig.resolved(slots=, max_len=)"
                )

    def exact(self) -> EngineConfig:
        """These sizes with every call's shape fixed, so that a request's numbers are bit-identical
        whatever decodes beside it: 8 prefill rows (or ``slots``), one attention window, no compaction.
        It computes the padding: ``docs/benchmarks.md`` measures what that costs."""
        return dataclasses.replace(self, prefill_rows=min(8, self.slots), window_min=self.max_len, compact_decode=False)

    def windows(self) -> tuple[int, ...]:
        """The attention windows compiled for: powers of two from ``window_min``, then ``max_len``."""
        sizes, w = [], min(self.window_min, self.max_len)
        while w < self.max_len:
            sizes.append(w)
            w *= 2
        return (*sizes, self.max_len)
