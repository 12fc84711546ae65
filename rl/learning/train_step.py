"""The learner's pure update: forward -> policy or SFT loss -> accumulated gradients -> AdamW.

Everything here is a jittable function of arrays (or builds one); :mod:`rl.learning.learner` owns the
host side (shardings, placement, state, checkpoints) and :mod:`rl.learning.learner_config` the
settings both read. Splitting them this
way keeps the step testable on its own and lets a notebook plot :func:`lr_schedule` for a config.

Exact gradient accumulation: with ``microbatches = M`` the batch is split into M interleaved
micro-batches and a ``lax.scan`` sums their gradients in float32. The aggregations of
:mod:`rl.learning.losses` normalise by batch-wide counts (tokens, sequences, rows), so each micro-batch's
loss is weighted by its share of that count (:func:`microbatch_shares`): the sum is the
full-batch loss, and ``M = 4`` equals ``M = 1`` up to float rounding.

Why a hand-written schedule rather than ``optax.warmup_cosine_decay_schedule``: optax's warmup
starts at ``init_value`` on step 0, so with ``init_value=0`` the first update is a no-op (and
AdamW then applies no weight decay either). Here step ``s < warmup_steps`` uses
``lr * (s + 1) / warmup_steps``: the first step already learns, and step ``warmup_steps - 1``
reaches the peak.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rl.learning.batch import TrainBatch
from rl.learning.learner_config import LearnerConfig
from rl.learning.lm_head import token_logprobs
from rl.learning.losses import POLICY_LOSSES, count_sequences, sft_loss, token_mean
from rl.learning.preference import PREFERENCE_METRICS, preference_loss
from rl.models.sharding import Rules, constrain
from rl.models.transformer import Transformer


def lr_schedule(
    learning_rate: float, warmup_steps: int, total_steps: int, end_lr_ratio: float = 0.0, decay_start: int = 0
) -> optax.Schedule:
    """Learning rate at optimizer step ``count`` (0-based): linear warmup, a plateau, then cosine decay.

    After warmup the rate stays at ``learning_rate`` until step ``max(warmup_steps, decay_start)``,
    then follows half a cosine down to ``end_lr_ratio * learning_rate`` at step ``total_steps``,
    and stays there after. ``decay_start=0``: no plateau (warmup-cosine); a later one is the
    warmup-stable-decay shape an SFT warm start that ends on a check uses (``rl.phases.sft_check``).
    """
    peak = float(learning_rate)
    end = peak * float(end_lr_ratio)
    start = max(warmup_steps, decay_start)
    decay_steps = max(total_steps - start, 1)

    def schedule(count: Any) -> jax.Array:
        step = jnp.asarray(count, jnp.float32)
        warm = peak * jnp.minimum(1.0, (step + 1.0) / max(warmup_steps, 1))
        progress = jnp.clip((step - start) / decay_steps, 0.0, 1.0)
        cosine = end + (peak - end) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
        return jnp.where(step < warmup_steps, warm, cosine)

    return schedule


def decay_mask(params: Any) -> Any:
    """True for matrices (embeddings and projections), False for norm scales and biases.

    Decaying a norm's scale towards 0 or a bias towards 0 has no regularising meaning, and
    shrinking RMSNorm scales of a pretrained model slowly distorts every activation.
    """
    return jax.tree.map(lambda x: x.ndim >= 2, params)


def make_optimizer(config: Any) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """``(optimizer, schedule)``: global-norm clipping (if ``config.grad_clip_norm``) then AdamW.

    ``config`` is anything with the fields of :class:`rl.learning.learner_config.LearnerConfig` that name the
    optimizer (``learning_rate``, ``warmup_steps``, ``total_steps``, ``end_lr_ratio``, ``decay_start``,
    ``weight_decay``, ``b1``, ``b2``, ``eps``, ``grad_clip_norm``). The schedule is returned too
    so that the learner reports the exact rate each step used. The optimizer's state mirrors
    the parameter tree (``mu``/``nu`` keep the parameters' ``nnx.Variable`` wrappers and their
    logical-axis metadata), so :func:`rl.models.sharding.state_shardings` shards it like the parameters.
    """
    c = config
    schedule = lr_schedule(c.learning_rate, c.warmup_steps, c.total_steps, c.end_lr_ratio, c.decay_start)
    adamw = optax.adamw(schedule, b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=c.weight_decay, mask=decay_mask)
    if c.grad_clip_norm is None:
        return adamw, schedule
    return optax.chain(optax.clip_by_global_norm(c.grad_clip_norm), adamw), schedule


def split_microbatches(tree: Any, microbatches: int, rules: Rules) -> Any:
    """``[B, ...]`` leaves -> ``[M, B / M, ...]``, row ``b`` going to micro-batch ``b % M``.

    Interleaving (rather than taking contiguous blocks) keeps every micro-batch spread over all
    the devices the batch is split over: a contiguous block would sit on ``1 / M`` of them.
    """

    def split(x: jax.Array) -> jax.Array:
        y = x.reshape(x.shape[0] // microbatches, microbatches, *x.shape[1:]).swapaxes(0, 1)
        return constrain(y, (None, "batch") + (None,) * (x.ndim - 1), rules)

    return jax.tree.map(split, tree)


def accumulate_gradients(
    loss_fn: Callable[[Any, Any], tuple[jax.Array, Any]], params: Any, micro: Any, param_shardings: Any = None
) -> tuple[Any, Any]:
    """``(sum of grads in float32, sum of aux)`` of ``loss_fn(params, mb)`` over micro-batches ``micro``.

    ``micro`` has a leading micro-batch axis (:func:`split_microbatches`); a ``lax.scan`` keeps
    one micro-batch's activations alive at a time. ``loss_fn`` returns ``(loss, aux)`` already
    weighted so that plain sums are the full-batch values. Float32 sums keep bfloat16
    parameters from losing the small micro-batch contributions.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def body(acc, mb):
        (_, aux), grads = grad_fn(params, mb)
        grads = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc[0], grads)
        return (grads, jax.tree.map(jnp.add, acc[1], aux)), None

    first = jax.tree.map(lambda x: x[0], micro)
    aux_shapes = jax.eval_shape(lambda: loss_fn(params, first)[1])
    zero_grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    if param_shardings is not None:
        zero_grads = jax.lax.with_sharding_constraint(zero_grads, param_shardings)
    zero_aux = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), aux_shapes)
    (grads, aux), _ = jax.lax.scan(body, (zero_grads, zero_aux), micro)
    return grads, aux


# -- the pure train step ---------------------------------------------------------------------------
def forward_logprobs(
    graphdef: nnx.GraphDef,
    params: Any,
    rest: Any,
    tokens: jax.Array,
    input_mask: jax.Array,
    temp: float,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    logits_chunk_mib: int = 0,
    remat: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Per-token ``(logprobs, entropy)`` ``[B, T]`` aligned with ``tokens`` as targets (column 0 is 0).

    With packed rows (``segment_ids``), the first token of each segment is "predicted" by the
    previous segment's last token: its loss mask is 0 (see :func:`rl.learning.batch.pack`).
    ``logits_chunk_mib``: the LM head runs over chunks of positions whose float32 logits take
    at most this many MiB per device (:func:`rl.learning.lm_head.token_logprobs`; 0: all at once).
    ``remat``: each layer's activations are recomputed in the backward pass (``LearnerConfig.remat``).
    """
    model: Transformer = nnx.merge(graphdef, params, rest)
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    hidden, _ = model.hidden_states(tokens, positions, input_mask, segment_ids=segment_ids, remat=remat)
    tied = model.config.tie_embeddings
    head = (model.embed if tied else model.lm_head)[...].astype(model.config.compute_dtype)
    logp, entropy = token_logprobs(hidden[:, :-1], head, tokens[:, 1:], temp, logits_chunk_mib, model.rules, tied)
    pad = jnp.zeros((tokens.shape[0], 1), jnp.float32)
    return jnp.concatenate([pad, logp], axis=1), jnp.concatenate([pad, entropy], axis=1)


def microbatch_shares(
    mask: jax.Array, totals: dict[str, jax.Array], aggregation: str, segment_ids: jax.Array | None = None
) -> dict[str, jax.Array]:
    """Weights turning micro-batch means into their part of the full-batch mean (1.0 for one micro-batch).

    ``"token"`` is for token means (``token_mean``); ``"agg"`` for the loss's own aggregation.
    ``segment_ids``: packed rows, whose sequences ``"sequence"`` counts one by one.
    """
    token = jnp.maximum(mask.sum(), 1.0) / jnp.maximum(totals["tokens"], 1.0)
    if aggregation == "token":
        agg = token
    elif aggregation == "sequence":
        agg = jnp.maximum(count_sequences(mask, segment_ids), 1.0) / jnp.maximum(totals["sequences"], 1.0)
    else:  # "constant": a fixed denominator proportional to the rows (and 1.0 for any M = 1 step)
        agg = jnp.asarray(mask.shape[0] / totals["rows"], jnp.float32)
    return {"token": token, "agg": agg}


def build_train_step(
    graphdef: nnx.GraphDef,
    config: LearnerConfig,
    objective: str,
    rules: Rules,
    param_shardings: Any,
    ref_graphdef: nnx.GraphDef | None = None,
) -> Callable[..., Any]:
    """``step(params, opt_state, step, ref_params, rest, batch) -> (params, opt_state, step + 1, metrics)``.

    ``objective`` is ``"policy"`` (the policy loss ``config.loss.name``, KL to ``ref_params`` when
    given), ``"sft"``, or ``"preference"`` (``config.preference``'s loss on pairs laid out by
    :func:`rl.learning.preference.pair_batch`; DPO's reference is ``ref_params``). The returned function is pure: the caller jits it with shardings and donation.
    ``params`` are the trained variables (all ``nnx.Param``, or only LoRA adapters), ``rest`` the
    module's other state. ``ref_graphdef`` (default ``graphdef``) runs the reference forward:
    the module without training-only behaviour such as adapter dropout.
    """
    ref_graphdef = graphdef if ref_graphdef is None else ref_graphdef
    tx, schedule = make_optimizer(config)
    cfg = config.loss
    policy_loss = POLICY_LOSSES[cfg.name]
    agg_metrics = {"policy": ("loss", "pg_loss", "kl_ref"), "preference": PREFERENCE_METRICS}.get(objective, ())

    def inputs(mb: TrainBatch) -> tuple:  # forward_logprobs' arguments after the weights
        temp, chunk = config.temperature, config.logits_chunk_mib
        return mb.tokens, mb.input_mask, temp, mb.positions, mb.segment_ids, chunk, config.remat

    def loss_fn(params, rest, ref, mb: TrainBatch, totals):
        logp, entropy = forward_logprobs(graphdef, params, rest, *inputs(mb))
        mask = mb.loss_mask
        shares = microbatch_shares(mask, totals, cfg.aggregation if objective == "policy" else "token", mb.segment_ids)
        if objective == "preference":  # a pair's weight sits on its chosen row, the first half
            pairs = mb.weights[: mb.weights.shape[0] // 2].sum()
            shares["agg"] = pairs / jnp.maximum(totals["pairs"], 1e-9)
        if objective in ("policy", "preference") and ref is not None:
            ref_logp = jax.lax.stop_gradient(forward_logprobs(ref_graphdef, ref, rest, *inputs(mb))[0])
        else:
            ref_logp = None
        if objective == "preference":
            loss, metrics = preference_loss(logp, ref_logp, mask, mb.weights, config.preference)
        elif objective == "policy":
            loss, metrics = policy_loss(
                logp,
                mb.old_logprobs,
                mb.advantages,
                mask,
                cfg,
                ref_logprobs=ref_logp,
                entropy=entropy if cfg.entropy_coef > 0 else None,
                segment_ids=mb.segment_ids,
            )
        else:
            loss, metrics = sft_loss(logp, mask)
        # Reported entropy is always the token mean, whatever the loss's aggregation.
        metrics["entropy"] = token_mean(jax.lax.stop_gradient(entropy), mask)
        scaled = {k: v * shares["agg" if k in agg_metrics else "token"] for k, v in metrics.items()}
        return loss * shares["token" if objective == "sft" else "agg"], scaled

    def step_fn(params, opt_state, step, ref, rest, batch: TrainBatch):
        mask = batch.loss_mask * batch.weights[:, None] * batch.input_mask
        mask = mask.at[:, 0].set(0.0)  # position 0 is never a target
        totals = {
            "tokens": mask.sum(),
            "sequences": count_sequences(mask, batch.segment_ids),
            "rows": jnp.float32(mask.shape[0]),
            "pairs": batch.weights.sum() / 2.0,  # the preference objective's rows come in pairs
        }
        micro = split_microbatches(batch.replace(loss_mask=mask), config.microbatches, rules)
        grads, metrics = accumulate_gradients(
            lambda p, mb: loss_fn(p, rest, ref, mb, totals), params, micro, param_shardings
        )
        grad_norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {f"train/{k}": v for k, v in metrics.items()}
        metrics |= {
            "train/grad_norm": grad_norm,
            "train/learning_rate": schedule(step),
            "train/tokens": (mask > 0).sum().astype(jnp.float32),
        }
        return params, opt_state, step + 1, metrics

    return step_fn
