"""The learner's input: token-exact sequences with masks, packed into static shapes.

Alignment: ``tokens[b, t]`` is the t-th token of sequence ``b``; per-token arrays
(``loss_mask``, ``old_logprobs``, ``ref_logprobs``) describe *that token as a
target*, i.e. the prediction made at position ``t - 1``. Position 0 is never a
target. ``loss_mask`` is 1 exactly on tokens the policy sampled; prompt,
observation (tool output) and padding tokens are 0 and never train.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import struct


@struct.dataclass
class TrainBatch:
    """A padded batch of trajectories (a pytree: crosses ``jit``).

    Attributes:
      tokens: int32 ``[B, T]``, right-padded.
      input_mask: bool ``[B, T]``, True on real (non-padding) tokens.
      loss_mask: float32 ``[B, T]``, 1 on sampled tokens (targets that train).
      old_logprobs: float32 ``[B, T]``, the sampler's raw (temperature-1) log-prob of each
        sampled token; 0 elsewhere. The PPO importance ratio is taken against these.
      advantages: float32 ``[B, T]`` per token, or ``[B]`` per row (broadcast over its tokens).
      weights: float32 ``[B]``, 1 for real rows, 0 for rows added to fill a bucket.
      positions: int32 ``[B, T]`` RoPE positions, restarting at 0 for every packed sequence
        (None: ``0..T-1`` in every row).
      segment_ids: int32 ``[B, T]``: ``k >= 1`` for the k-th sequence packed into the row, 0 for
        padding (None: one sequence per row). Tokens attend only within their segment.
    """

    tokens: jax.Array
    input_mask: jax.Array
    loss_mask: jax.Array
    old_logprobs: jax.Array
    advantages: jax.Array
    weights: jax.Array
    positions: jax.Array | None = None
    segment_ids: jax.Array | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.tokens.shape)

    def with_defaults(self) -> TrainBatch:
        """Every field filled, per token: an unpacked batch as a packed one with one sequence per row."""
        b, t = self.shape
        adv = np.asarray(self.advantages, np.float32)
        if adv.ndim == 1:
            adv = np.broadcast_to(adv[:, None], (b, t))
        positions = self.positions
        if positions is None:
            positions = np.broadcast_to(np.arange(t, dtype=np.int32), (b, t))
        segments = self.segment_ids
        if segments is None:
            segments = np.asarray(self.input_mask).astype(np.int32)
        return self.replace(advantages=adv, positions=positions, segment_ids=segments)


DEFAULT_LENGTH_BUCKETS = (64, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
# Steps of 1.25-1.5x: a padding row costs a real row's compute, and packed batches land anywhere
# (17 packed rows padded to 32 nearly doubled an SFT step); each size is one more compiled step.
DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024)  # fmt: skip


def round_up(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= n (or n rounded up to a multiple of the largest bucket)."""
    for b in sorted(buckets):
        if n <= b:
            return b
    top = max(buckets)
    return -(-n // top) * top


def pack(
    sequences: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[float]],
    old_logprobs: Sequence[Sequence[float]],
    advantages: Sequence[float],
    *,
    pad_id: int,
    length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
    batch_multiple: int = 1,
    max_len: int | None = None,
    batch_buckets: Sequence[int] | None = DEFAULT_BATCH_BUCKETS,
    pack_sequences: bool = False,
) -> TrainBatch:
    """Pads host-side trajectories into a :class:`TrainBatch` of bucketed, static shape.

    Rows are added (weight 0, all-zero masks) so ``B`` reaches the next of
    ``batch_buckets`` and is a multiple of ``batch_multiple`` (the data-parallel
    size times the number of micro-batches): the number of trained episodes
    varies step to step (dropped groups), and each new shape would compile the
    train step again. Sequences longer than ``max_len`` lose their trailing tokens.

    With ``pack_sequences``, short sequences share rows (first-fit by decreasing
    length into rows as long as the longest sequence's bucket), each with its own
    positions and segment id: far less padding when lengths vary (a direct answer
    beside a multi-turn episode). Valid with a loss that normalises per token or per
    packed segment (``segment_ids``), never per row: that would mix a row's sequences.
    """
    n = len(sequences)
    if not n:
        raise ValueError("pack(sequences=): expected at least one sequence")
    if not (len(loss_masks) == len(old_logprobs) == len(advantages) == n):
        raise ValueError("pack: sequences, loss_masks, old_logprobs and advantages must have the same length")
    for i, (seq, m, lp) in enumerate(zip(sequences, loss_masks, old_logprobs, strict=True)):
        if not (len(seq) == len(m) == len(lp)):
            raise ValueError(
                f"pack: sequence {i} has {len(seq)} tokens but {len(m)} mask and {len(lp)} log-prob entries"
            )
    longest = max(len(s) for s in sequences)
    if max_len is not None:
        longest = min(longest, max_len)
    t = round_up(longest, length_buckets)
    if max_len is not None:
        t = min(t, max_len)
    rows = _first_fit([min(len(s), t) for s in sequences], t) if pack_sequences else [[i] for i in range(n)]
    b = round_up(len(rows), batch_buckets) if batch_buckets else len(rows)
    b = -(-b // batch_multiple) * batch_multiple
    tokens = np.full((b, t), pad_id, np.int32)
    input_mask = np.zeros((b, t), bool)
    loss = np.zeros((b, t), np.float32)
    old = np.zeros((b, t), np.float32)
    adv = np.zeros((b, t), np.float32)
    weights = np.zeros((b,), np.float32)
    positions = np.zeros((b, t), np.int32)
    segments = np.zeros((b, t), np.int32)
    for r, members in enumerate(rows):
        at = 0
        for k, i in enumerate(members, start=1):
            size = min(len(sequences[i]), t)
            span = slice(at, at + size)
            tokens[r, span] = sequences[i][:size]
            input_mask[r, span] = True
            loss[r, span] = loss_masks[i][:size]
            loss[r, at] = 0.0  # a sequence's first token has no prediction of its own
            old[r, span] = old_logprobs[i][:size]
            adv[r, span] = advantages[i]
            positions[r, span] = np.arange(size)
            segments[r, span] = k
            at += size
        weights[r] = 1.0
    return TrainBatch(tokens, input_mask, loss, old, adv, weights, positions, segments)


def _first_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of sequence indices (longest first), each bin's total length <= ``capacity``."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        for k, free in enumerate(room):
            if lengths[i] <= free:
                bins[k].append(i)
                room[k] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins
