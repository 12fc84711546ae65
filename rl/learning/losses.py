"""The learner's losses: token aggregation, policy losses (a registry), KL, SFT cross-entropy.

Pure, vectorised, jittable functions on arrays. The learner picks a policy loss
and an aggregation by name from small registries (:data:`POLICY_LOSSES`,
:data:`AGGREGATIONS`), so a config switches the loss or token ↔ sequence
normalisation without touching code; advantages are computed before the
learner sees a batch (:mod:`rl.learning.advantages`).

Shapes: ``[B, T]`` per-token arrays for ``B`` rows padded to ``T`` tokens;
``mask`` is 1 on tokens the policy sampled (observation and prompt tokens are 0
and never contribute to a loss). A row holds one sequence, or several packed ones
told apart by ``segment_ids`` (``k >= 1`` for the k-th, 0 for padding; see
:func:`rl.learning.batch.pack`): whatever is "per sequence" is per segment.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rl.config.schema import setting, validate

Array = jax.Array


# -- segments (packed sequences) ----------------------------------------------------
def segment_sums(x: Array, segment_ids: Array) -> Array:
    """``[B, T + 1]``: entry ``[b, k]`` sums ``x[b]`` over segment ``k`` of row ``b``.

    Per row (a vmapped scatter), so a batch split over devices stays split.
    """
    return jax.vmap(lambda v, s: jax.ops.segment_sum(v, s, num_segments=x.shape[-1] + 1))(x, segment_ids)


def to_tokens(per_segment: Array, segment_ids: Array) -> Array:
    """``[B, T]``: each token gets its segment's entry of a ``[B, T + 1]`` per-segment array."""
    return jnp.take_along_axis(per_segment, segment_ids, axis=1)


def count_sequences(mask: Array, segment_ids: Array | None = None) -> Array:
    """Sequences (segments; rows when ``segment_ids`` is None) with at least one sampled token."""
    if segment_ids is None:
        return (mask.sum(-1) > 0).sum().astype(jnp.float32)
    return (segment_sums(mask, segment_ids) > 0).sum().astype(jnp.float32)


# -- token aggregation ------------------------------------------------------------
# ``fn(x, mask, max_len=None, segment_ids=None) -> scalar``.
def token_mean(x: Array, mask: Array, max_len: int | None = None, segment_ids: Array | None = None) -> Array:
    """Every sampled token weighs the same across the batch (DAPO token-level)."""
    return (x * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def sequence_mean(x: Array, mask: Array, max_len: int | None = None, segment_ids: Array | None = None) -> Array:
    """Mean over sequences of each sequence's token mean (original GRPO; favours short answers).

    With ``segment_ids`` a packed row's sequences count one by one, so packing changes nothing.
    """
    if segment_ids is None:
        sums, counts = (x * mask).sum(-1), mask.sum(-1)
    else:
        sums, counts = segment_sums(x * mask, segment_ids), segment_sums(mask, segment_ids)
    has = (counts > 0).astype(x.dtype)
    return (sums / jnp.maximum(counts, 1.0) * has).sum() / jnp.maximum(has.sum(), 1.0)


def constant_normalizer(x: Array, mask: Array, max_len: int | None = None, segment_ids: Array | None = None) -> Array:
    """Dr. GRPO: token sum divided by a constant (batch size x generation budget), no length bias."""
    budget = x.shape[-1] if max_len is None else max_len
    return (x * mask).sum() / (x.shape[0] * budget)


AGGREGATIONS: dict[str, Callable[..., Array]] = {
    "token": token_mean,
    "sequence": sequence_mean,
    "constant": constant_normalizer,
}
# Aggregations that packing (several sequences per row) leaves unchanged; "constant" divides by
# the rows, which packing makes fewer.
PACKABLE_AGGREGATIONS = ("token", "sequence")


# -- policy losses ------------------------------------------------------------------
# ``fn(logprobs, old_logprobs, advantages, mask, cfg, *, ref_logprobs=None, entropy=None, segment_ids=None)
# -> (loss, metrics)`` with ``cfg`` a :class:`PolicyLossConfig`; see :func:`ppo_clip_loss` for each.
PolicyLoss = Callable[..., tuple[Array, dict[str, Array]]]
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Makes a policy loss selectable by ``algorithm.loss.name`` (``PolicyLossConfig.name``)."""

    def wrap(fn: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES:
            raise ValueError(f"register_policy_loss: {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return wrap


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
    """Which policy loss (``name``, a key of :data:`POLICY_LOSSES`) and its settings; validated on construction.

    ``clip_low``/``clip_high`` differ for clip-higher (DAPO: 0.2 / 0.28).
    ``kl_coef`` > 0 adds the k3 estimator of KL(policy || reference).
    ``tis_cap`` > 0 turns on truncated importance sampling for stale samples (asynchronous RL):
    the clipped ratio is taken against the learner's own policy at this update (the proximal
    policy, decoupled PPO) and each token is weighted by ``min(proximal / sampler, tis_cap)``, so
    a sample from an older policy is corrected without ever being up-weighted past the cap.
    ``name="gspo"`` takes one ratio per sequence (:func:`gspo_loss`): its clip range is
    sequence-level and far narrower (the GSPO paper: ``clip_low=3e-4``, ``clip_high=4e-4``).
    """

    name: str = setting("ppo_clip", choices=lambda: POLICY_LOSSES)
    clip_low: float = setting(0.2, check=lambda v: 0 <= v < 10, expected="a ratio margin in [0, 10)")
    clip_high: float = setting(0.2, check=lambda v: 0 <= v < 10, expected="a ratio margin in [0, 10)")
    kl_coef: float = setting(0.0, low=0)
    entropy_coef: float = setting(0.0, low=0)
    aggregation: str = setting("token", choices=lambda: AGGREGATIONS)
    tis_cap: float = setting(0.0, check=lambda v: 0 <= v < 1e6, expected="0 (off) or a cap > 0")
    max_len: int | None = setting(None, derived=True)  # the run's loop.max_len, not a config field

    def __post_init__(self):
        validate(self)


def kl_k3(logprobs: Array, ref_logprobs: Array) -> Array:
    """Schulman's k3 estimator of KL(pi || ref) per token: unbiased, always >= 0."""
    log_ratio = ref_logprobs - logprobs
    return jnp.exp(log_ratio) - log_ratio - 1.0


@register_policy_loss("ppo_clip")
def ppo_clip_loss(
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    mask: Array,
    cfg: PolicyLossConfig,
    *,
    ref_logprobs: Array | None = None,
    entropy: Array | None = None,
    segment_ids: Array | None = None,
) -> tuple[Array, dict[str, Array]]:
    """PPO-clip surrogate (GRPO's too): ``-min(r*A, clip(r, 1-eps_low, 1+eps_high)*A)``, ratio ``r`` per sampled token.

    ``old_logprobs`` are the *sampler's* log-probs of the tokens it produced, so
    the importance ratio stays correct for rollouts one or more steps stale.
    ``advantages`` are per row ``[B]`` (broadcast over tokens) or per token ``[B, T]``.
    ``segment_ids`` (packed rows) only matter to the ``"sequence"`` aggregation.
    """
    on = mask > 0
    mask = mask.astype(logprobs.dtype)
    adv = advantages[:, None] if advantages.ndim == 1 else advantages
    # Masked positions (prompt, observations, padding) are zeroed *before* exp so
    # whatever they hold can neither overflow nor leak into the gradient.
    log_ratio = jnp.where(on, logprobs - old_logprobs, 0.0)
    weight = None
    if cfg.tis_cap > 0:
        # Decoupled PPO: clip against the learner's policy at this update (its first pass over the
        # batch: the policy the step starts from), weight by the truncated behaviour correction.
        proximal = jax.lax.stop_gradient(logprobs)
        weight = jnp.minimum(jnp.exp(jnp.where(on, proximal - old_logprobs, 0.0)), cfg.tis_cap)
        ratio = jnp.exp(jnp.where(on, logprobs - proximal, 0.0))
    else:
        ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    per_token = -jnp.minimum(ratio * adv, clipped * adv)
    if weight is not None:
        per_token = per_token * weight
    aggregate = functools.partial(AGGREGATIONS[cfg.aggregation], max_len=cfg.max_len, segment_ids=segment_ids)
    pg_loss = aggregate(per_token, mask)
    metrics = {
        "pg_loss": pg_loss,
        "clip_fraction": token_mean((jnp.abs(ratio - clipped) > 0).astype(mask.dtype), mask),
        # k3 of KL(old || new): how far this update moved from the sampling policy.
        "approx_kl_old": token_mean(jnp.exp(-log_ratio) - 1.0 + log_ratio, mask),
        "ratio_mean": token_mean(ratio, mask),
    }
    if weight is not None:
        metrics["tis_weight_mean"] = token_mean(weight, mask)
    return _with_kl_and_entropy(pg_loss, metrics, logprobs, mask, cfg, aggregate, ref_logprobs, entropy)


@register_policy_loss("gspo")
def gspo_loss(
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    mask: Array,
    cfg: PolicyLossConfig,
    *,
    ref_logprobs: Array | None = None,
    entropy: Array | None = None,
    segment_ids: Array | None = None,
) -> tuple[Array, dict[str, Array]]:
    """GSPO (Zheng et al. 2025): PPO-clip on one importance ratio per *sequence*.

    ``s_i = exp(mean_t(logprobs - old_logprobs))`` over sequence ``i``'s sampled tokens (the
    geometric mean of its token ratios), and ``loss_i = -min(s_i*A_i, clip(s_i, 1-eps_low,
    1+eps_high)*A_i)``: a sequence is kept or clipped whole, so one noisy token ratio cannot
    skew the update, which is what makes it stable on long answers and MoE models. Typical clip
    range: ``clip_low=3e-4``, ``clip_high=4e-4`` (the paper's), not PPO's 0.2. The loss is
    ``loss_i`` averaged over sequences with the ``"sequence"`` aggregation (the paper's),
    weighted by length with ``"token"``. A sequence is a packed segment (``segment_ids``), or a
    row when None; ``A_i`` is the mean of its tokens' advantages. ``tis_cap`` weighs each
    sequence by ``min(exp(mean_t(proximal - old)), tis_cap)``. Clip-fraction and ratio metrics
    are token-weighted (each token reports its sequence's), so micro-batches sum them exactly.
    """
    on = mask > 0
    mask = mask.astype(logprobs.dtype)
    ids = jnp.ones(mask.shape, jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    lengths = jnp.maximum(segment_sums(mask, ids), 1.0)

    def seq_mean(x: Array) -> Array:  # [B, T] -> [B, T + 1], masked tokens excluded before they can overflow
        return segment_sums(jnp.where(on, x, 0.0), ids) / lengths

    log_ratio = jnp.where(on, logprobs - old_logprobs, 0.0)
    adv = seq_mean(jnp.broadcast_to(advantages[:, None] if advantages.ndim == 1 else advantages, mask.shape))
    weight = None
    if cfg.tis_cap > 0:
        proximal = jax.lax.stop_gradient(logprobs)
        weight = jnp.minimum(jnp.exp(seq_mean(proximal - old_logprobs)), cfg.tis_cap)
        ratio = jnp.exp(seq_mean(logprobs - proximal))
    else:
        ratio = jnp.exp(seq_mean(log_ratio))
    clipped = jnp.clip(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    per_seq = -jnp.minimum(ratio * adv, clipped * adv)
    if weight is not None:
        per_seq = per_seq * weight
    aggregate = functools.partial(AGGREGATIONS[cfg.aggregation], max_len=cfg.max_len, segment_ids=segment_ids)
    pg_loss = aggregate(to_tokens(per_seq, ids), mask)
    metrics = {
        "pg_loss": pg_loss,
        "clip_fraction": token_mean(to_tokens((jnp.abs(ratio - clipped) > 0).astype(mask.dtype), ids), mask),
        "approx_kl_old": token_mean(jnp.exp(-log_ratio) - 1.0 + log_ratio, mask),
        "ratio_mean": token_mean(to_tokens(ratio, ids), mask),
    }
    if weight is not None:
        metrics["tis_weight_mean"] = token_mean(to_tokens(weight, ids), mask)
    return _with_kl_and_entropy(pg_loss, metrics, logprobs, mask, cfg, aggregate, ref_logprobs, entropy)


def _with_kl_and_entropy(
    pg_loss: Array,
    metrics: dict[str, Array],
    logprobs: Array,
    mask: Array,
    cfg: PolicyLossConfig,
    aggregate: Callable[[Array, Array], Array],
    ref_logprobs: Array | None,
    entropy: Array | None,
) -> tuple[Array, dict[str, Array]]:
    """``pg_loss`` plus the k3 KL penalty and minus the entropy bonus (when given), aggregated alike."""
    on = mask > 0
    loss = pg_loss
    if ref_logprobs is not None:
        kl = aggregate(kl_k3(jnp.where(on, logprobs, 0.0), jnp.where(on, ref_logprobs, 0.0)), mask)
        metrics["kl_ref"] = kl
        loss = loss + cfg.kl_coef * kl
    if entropy is not None:
        ent = aggregate(jnp.where(on, entropy, 0.0), mask)
        metrics["entropy"] = ent
        loss = loss - cfg.entropy_coef * ent
    metrics["loss"] = loss
    return loss, metrics


def sft_loss(logprobs: Array, mask: Array) -> tuple[Array, dict[str, Array]]:
    """Masked cross-entropy (mean negative log-likelihood of the target tokens)."""
    nll = token_mean(-jnp.where(mask > 0, logprobs, 0.0), mask.astype(logprobs.dtype))
    return nll, {"loss": nll, "sft_nll": nll}


def token_logprobs_and_entropy(logits: Array, targets: Array, temperature: float = 1.0) -> tuple[Array, Array]:
    """Log-prob of each target token and the entropy of each position's distribution.

    ``logits[:, t]`` predicts ``targets[:, t]``. ``temperature`` must match the
    sampler's, so ratios compare the same distribution the tokens came from.
    """
    logits = logits.astype(jnp.float32) / temperature
    logp = jax.nn.log_softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    entropy = -(jnp.exp(logp) * logp).sum(-1)
    return chosen, entropy
