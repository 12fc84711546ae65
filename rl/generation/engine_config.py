"""The decode engine's sizes (:class:`EngineConfig`): its fields, their checks, the windows they imply.

A config is data that a run states and checks before anything starts
(:func:`rl.run.experiment.engine_config` builds one from the settings), so it lives apart from
:mod:`rl.generation.engine`, which holds the engine that runs with it.
"""

from __future__ import annotations

import dataclasses


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

    slots: int = 64
    max_len: int = 2048
    prefill_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048)
    page_out: bool = True
    decode_steps: int = 1
    prefill_tokens: int = 2048
    window_min: int = 256
    stop_width: int = 8
    prefill_rows: int = 0

    def __post_init__(self) -> None:
        for field in ("slots", "max_len", "decode_steps", "prefill_tokens", "window_min", "stop_width"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EngineConfig.{field}: expected an int >= 1, got {value!r}")
        if not isinstance(self.prefill_rows, int) or self.prefill_rows < 0:
            raise ValueError(f"EngineConfig.prefill_rows: expected an int >= 0, got {self.prefill_rows!r}")
        buckets = tuple(self.prefill_buckets)
        if (
            not buckets
            or any(not isinstance(b, int) or b < 1 for b in buckets)
            or list(buckets) != sorted(set(buckets))
        ):
            raise ValueError(f"EngineConfig.prefill_buckets: expected increasing ints >= 1, got {buckets!r}")
        object.__setattr__(self, "prefill_buckets", buckets)

    def windows(self) -> tuple[int, ...]:
        """The attention windows compiled for: powers of two from ``window_min``, then ``max_len``."""
        sizes, w = [], min(self.window_min, self.max_len)
        while w < self.max_len:
            sizes.append(w)
            w *= 2
        return (*sizes, self.max_len)
