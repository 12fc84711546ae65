"""The settings of a :class:`rl.learning.learner.Learner`: optimizer, schedule, objective and loss.

A module of its own because both sides of the learner read it: the pure step
(:mod:`rl.learning.train_step`) builds its program from it, and the host side
(:mod:`rl.learning.learner`) checks batches and keys compiled programs by it.
Validated on construction, so a bad value fails before anything compiles.
"""

from __future__ import annotations

import dataclasses

from rl.config.schema import need_field, setting, validate
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

    objective: str = setting("policy", choices=OBJECTIVES)
    learning_rate: float = setting(1e-6, check=lambda v: v > 0, expected="a finite float > 0")
    warmup_steps: int = setting(0, low=0)
    total_steps: int = setting(1000, low=1)
    end_lr_ratio: float = setting(0.1, low=0, high=1, expected="a float in [0, 1]")
    decay_start: int = setting(0, low=0)
    weight_decay: float = setting(0.0, low=0, expected="a finite float >= 0")
    b1: float = setting(0.9, check=lambda v: 0 <= v < 1, expected="a float in [0, 1)")
    # b2: the runs' value (configs.common.optimizer reads it): shorter memory than Adam's 0.999
    b2: float = setting(0.99, check=lambda v: 0 <= v < 1, expected="a float in [0, 1)")
    eps: float = setting(1e-8, check=lambda v: 0 < v < 1, expected="a float in (0, 1)")
    grad_clip_norm: float | None = setting(1.0, check=lambda v: v > 0, expected="None or a finite float > 0")
    microbatches: int = setting(1, low=1)
    microbatch_tokens: int = setting(8192, low=0, expected="an int >= 0 (0: off)")
    logits_chunk_mib: int = setting(64, low=0, expected="an int >= 0 (0: off)")
    temperature: float = setting(
        RAW_LOGPROB_TEMPERATURE,
        check=lambda v: v > 0,
        expected="a finite float > 0 (the sampler's; 1.0 for raw_logprobs)",
    )
    loss: PolicyLossConfig = setting(factory=PolicyLossConfig)
    trainable: str = setting("all", choices=TRAINABLE)
    remat: bool = False
    preference: PreferenceConfig = setting(factory=PreferenceConfig)

    def __post_init__(self) -> None:
        validate(self)
        in_steps = f"an int in [0, total_steps={self.total_steps}]"
        need_field(self.warmup_steps <= self.total_steps, self, "warmup_steps", in_steps)
        need_field(self.decay_start <= self.total_steps, self, "decay_start", in_steps)
        splittable = self.microbatches == 1 or self.loss.aggregation in SPLITTABLE_AGGREGATIONS
        need_field(splittable, self, "loss.aggregation", f"one of {SPLITTABLE_AGGREGATIONS} when microbatches > 1")

    @property
    def use_reference(self) -> bool:
        """Whether a frozen reference policy is kept: the KL penalty's (policy objective), or DPO's."""
        if self.objective == "preference":
            return self.preference.uses_reference
        return self.loss.kl_coef > 0 and self.objective == "policy"
