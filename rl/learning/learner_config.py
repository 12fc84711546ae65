"""The settings of a :class:`rl.learning.learner.Learner`: optimizer, schedule, objective and loss.

A module of its own because both sides of the learner read it: the pure step
(:mod:`rl.learning.train_step`) builds its program from it, and the host side
(:mod:`rl.learning.learner`) checks batches and keys compiled programs by it.
Validated on construction, so a bad value fails before anything compiles.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rl.learning.losses import PolicyLossConfig
from rl.learning.preference import PreferenceConfig

OBJECTIVES = ("policy", "sft", "preference")
# What a step trains: every parameter, or only the LoRA adapters (rl.models.lora) with the base frozen.
TRAINABLE = ("all", "lora")
# Aggregations whose micro-batch split is exact (see rl.learning.train_step.microbatch_shares); a new
# entry in rl.learning.losses.AGGREGATIONS needs one here before it can be used with microbatches > 1.
SPLITTABLE_AGGREGATIONS = ("token", "sequence", "constant")
# The sampler's ``raw_logprobs`` are taken at temperature 1 over the full vocabulary: the learner's
# importance ratios compare against them at this temperature.
RAW_LOGPROB_TEMPERATURE = 1.0


def _fail(field: str, expected: str, value: Any) -> None:
    raise ValueError(f"LearnerConfig.{field}: expected {expected}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Optimizer, schedule, objective and loss settings of a ``Learner``; validated on construction.

    Attributes:
      objective: what :meth:`Learner.train_step` minimises: ``"policy"`` (the policy loss named by
        ``loss.name``, on advantages the caller computed), ``"sft"`` (masked cross-entropy) or
        ``"preference"`` (``preference.loss`` on a :func:`rl.learning.preference.pair_batch`).
      learning_rate: peak AdamW learning rate.
      warmup_steps: linear warmup steps (step 0 already uses ``learning_rate / warmup_steps``).
      total_steps: the cosine decay reaches ``end_lr_ratio * learning_rate`` at this step.
      end_lr_ratio: final learning rate as a fraction of the peak, in [0, 1].
      decay_start: the rate holds its peak until this step, then decays (0: right after warmup).
      weight_decay: decoupled AdamW decay, applied to matrices only (see :func:`rl.learning.train_step.decay_mask`).
      b1, b2, eps: AdamW moments' decay rates and denominator epsilon.
      grad_clip_norm: clip the global gradient norm to this; ``None`` disables clipping.
      microbatches: gradient-accumulation steps inside one jitted step; ``B`` must be divisible
        by the mesh's batch parallelism times this.
      microbatch_tokens: a batch whose micro-batches hold more than this many tokens per device
        is split further (the smallest extra factor dividing its rows that fits), so a step's
        activations stay bounded whatever the batch shape (0: never split further). The split
        is exact gradient accumulation; only float rounding differs from one pass (~1e-7). A step
        of the 0.46M-parameter quickstart model needs ~34 KB of XLA scratch per token at 384
        tokens (MLP activations, logits, attention blocks), so 8192 tokens is ~0.2-0.3 GB where its
        128 x 384 RL batch in one pass took 1.6 GB (3.2 GB before blocked attention).
      logits_chunk_mib: the LM head and log-softmax run over chunks of positions whose float32
        logits take at most this many MiB per device, and the backward pass recomputes one chunk
        at a time (:mod:`rl.learning.lm_head`), so the ``[B, T, vocab]`` logits of a micro-batch
        never exist at once (0: they do, the plain path). The same log-probs and gradients up to
        float rounding. Small vocabularies fit in one chunk, so only large ones (Qwen2.5's 152k,
        Llama-3's 128k: ~0.6 MB per token and tensor) are chunked, whose logits and their gradient
        were otherwise the largest scratch of a LoRA step (``benchmarks/lora_memory.py``).
      temperature: temperature of the ``old_logprobs``: :data:`RAW_LOGPROB_TEMPERATURE` for the
        sampler's ``raw_logprobs``.
      loss: which policy loss and its settings (clip range, KL and entropy coefficients, token
        aggregation); the KL coefficient also decides whether a reference policy is kept.
      preference: the ``"preference"`` objective's loss (DPO or SimPO, ``beta``, ...); DPO keeps the
        parameters the learner starts from as its frozen reference.
      trainable: ``"all"`` parameters, or ``"lora"``: only the model's LoRA adapters get gradients
        and optimizer state (the base weights stay bit-for-bit as they are).
      remat: recompute each layer's activations in the backward pass (gradient checkpointing)
        instead of keeping every layer's from the forward: a step holds one layer's activations
        at a time, for about a third more compute. The same gradients up to float rounding. With
        LoRA, whose step is otherwise mostly activations and the frozen weights, it is the
        larger saving (``benchmarks/lora_memory.py``). On XLA:CPU it saves memory only with
        ``XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false`` in the environment:
        the default scheduler runs every layer's recomputation ahead of the backward pass.
    """

    objective: str = "policy"
    learning_rate: float = 1e-6
    warmup_steps: int = 0
    total_steps: int = 1000
    end_lr_ratio: float = 0.1
    decay_start: int = 0
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.99  # the runs' value (configs.common.optimizer reads it): shorter memory than Adam's 0.999
    eps: float = 1e-8
    grad_clip_norm: float | None = 1.0
    microbatches: int = 1
    microbatch_tokens: int = 8192
    logits_chunk_mib: int = 64
    temperature: float = RAW_LOGPROB_TEMPERATURE
    loss: PolicyLossConfig = dataclasses.field(default_factory=PolicyLossConfig)
    trainable: str = "all"
    remat: bool = False
    preference: PreferenceConfig = dataclasses.field(default_factory=PreferenceConfig)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            _fail("objective", f"one of {OBJECTIVES}", self.objective)
        if not (_real(self.learning_rate) and self.learning_rate > 0):
            _fail("learning_rate", "a finite float > 0", self.learning_rate)
        if not (_is_int(self.total_steps) and self.total_steps >= 1):
            _fail("total_steps", "an int >= 1", self.total_steps)
        if not (_is_int(self.warmup_steps) and 0 <= self.warmup_steps <= self.total_steps):
            _fail("warmup_steps", f"an int in [0, total_steps={self.total_steps}]", self.warmup_steps)
        if not (_is_int(self.decay_start) and 0 <= self.decay_start <= self.total_steps):
            _fail("decay_start", f"an int in [0, total_steps={self.total_steps}]", self.decay_start)
        if not (_real(self.end_lr_ratio) and 0.0 <= self.end_lr_ratio <= 1.0):
            _fail("end_lr_ratio", "a float in [0, 1]", self.end_lr_ratio)
        if not (_real(self.weight_decay) and self.weight_decay >= 0.0):
            _fail("weight_decay", "a finite float >= 0", self.weight_decay)
        for name in ("b1", "b2"):
            if not (_real(getattr(self, name)) and 0.0 <= getattr(self, name) < 1.0):
                _fail(name, "a float in [0, 1)", getattr(self, name))
        if not (_real(self.eps) and 0.0 < self.eps < 1.0):
            _fail("eps", "a float in (0, 1)", self.eps)
        if self.grad_clip_norm is not None and not (_real(self.grad_clip_norm) and self.grad_clip_norm > 0):
            _fail("grad_clip_norm", "None or a finite float > 0", self.grad_clip_norm)
        if not (_is_int(self.microbatches) and self.microbatches >= 1):
            _fail("microbatches", "an int >= 1", self.microbatches)
        if not (_is_int(self.microbatch_tokens) and self.microbatch_tokens >= 0):
            _fail("microbatch_tokens", "an int >= 0 (0: off)", self.microbatch_tokens)
        if not (_is_int(self.logits_chunk_mib) and self.logits_chunk_mib >= 0):
            _fail("logits_chunk_mib", "an int >= 0 (0: off)", self.logits_chunk_mib)
        if not (_real(self.temperature) and self.temperature > 0):
            _fail("temperature", "a finite float > 0 (the sampler's; 1.0 for raw_logprobs)", self.temperature)
        if self.trainable not in TRAINABLE:
            _fail("trainable", f"one of {TRAINABLE}", self.trainable)
        if not isinstance(self.remat, bool):
            _fail("remat", "a bool", self.remat)
        if not isinstance(self.loss, PolicyLossConfig):
            _fail("loss", "a rl.learning.losses.PolicyLossConfig", self.loss)
        if not isinstance(self.preference, PreferenceConfig):
            _fail("preference", "a rl.learning.preference.PreferenceConfig", self.preference)
        if self.microbatches > 1 and self.loss.aggregation not in SPLITTABLE_AGGREGATIONS:
            _fail("loss.aggregation", f"one of {SPLITTABLE_AGGREGATIONS} when microbatches > 1", self.loss.aggregation)

    @property
    def use_reference(self) -> bool:
        """Whether a frozen reference policy is kept: the KL penalty's (policy objective), or DPO's."""
        if self.objective == "preference":
            return self.preference.uses_reference
        return self.loss.kl_coef > 0 and self.objective == "policy"
