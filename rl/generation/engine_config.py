"""The decode engine's sizes (:class:`EngineConfig`): its fields, their checks, the windows they imply.

A config is data that a run states and checks before anything starts
(:func:`rl.run.experiment.engine_config` builds one from the settings), so it lives apart from
:mod:`rl.generation.engine`, which holds the engine that runs with it.
"""

from __future__ import annotations

import dataclasses

from rl.config.schema import increasing_ints, setting, validate


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Sizes of a :class:`~rl.generation.engine.DecodeEngine`.

    Attributes:
      slots: sequences decoded at once (rounded up to the mesh's batch parallelism).
      max_len: cache length per sequence: prompt + every turn + every observation.
      prefill_buckets: padded chunk lengths of a prefill; longer pending tokens are prefilled in
        chunks of the largest.
      page_out: when every slot is taken, an idle sequence's cache moves to host memory.
      decode_steps: decode steps per :meth:`~rl.generation.engine.DecodeEngine.step` call (>1
        amortises the host round trip; a turn finishing mid-call idles its slot for the rest of it).
      prefill_tokens: the most padded tokens (rows x chunk) one prefill call computes; rows of one
        chunk bucket are batched up to this, in powers of two.
      window_min: the smallest attention window; windows are powers of two from here up to
        ``max_len`` (and ``max_len`` itself).
      stop_width: the most stop token ids a request may carry.
      prefill_rows: 0: a prefill call batches as many rows as are waiting (powers of two, up to
        ``prefill_tokens``); N > 0: every prefill call has exactly N rows. XLA's matmuls may
        block a row differently in a batch of another size, so only fixed shapes (with one
        attention window, ``window_min = max_len``) make a request's numbers bit-identical
        whatever arrived with it: what a reproducible run needs.
    """

    slots: int = setting(64, low=1)
    max_len: int = setting(2048, low=1)
    prefill_buckets: tuple[int, ...] = increasing_ints((16, 32, 64, 128, 256, 512, 1024, 2048))
    page_out: bool = True
    decode_steps: int = setting(1, low=1)
    prefill_tokens: int = setting(2048, low=1)
    window_min: int = setting(256, low=1)
    stop_width: int = setting(8, low=1)
    prefill_rows: int = setting(0, low=0)

    def __post_init__(self) -> None:
        validate(self)

    def windows(self) -> tuple[int, ...]:
        """The attention windows compiled for: powers of two from ``window_min``, then ``max_len``."""
        sizes, w = [], min(self.window_min, self.max_len)
        while w < self.max_len:
            sizes.append(w)
            w *= 2
        return (*sizes, self.max_len)
