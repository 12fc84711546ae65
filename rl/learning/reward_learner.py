"""Trains a :class:`~rl.learning.reward_model.RewardModel` on preference pairs: the Bradley-Terry step.

The policy :class:`~rl.learning.learner.Learner`'s machinery, with the reward model's forward in
place of log-probs: the same AdamW schedule and clipping (:func:`rl.learning.train_step.make_optimizer`),
parameters and moments in their logical-axis shardings, the batch split along ``B`` over the
``"batch"`` mesh axes, exact gradient accumulation over ``microbatches`` (interleaved, so a pair's
two rows share a micro-batch whenever ``microbatches`` divides ``P``, which
:func:`rl.learning.preference.pair_batch` guarantees with ``pair_multiple=batch_multiple``), donation,
and a :meth:`RewardLearner.state` a :class:`rl.run.checkpoint.Checkpointer` saves and restores.

What is trained: every parameter of backbone and head, or with ``LearnerConfig.trainable="lora"``
the backbone's LoRA adapters and the head (the base weights stay frozen). Of the
:class:`~rl.learning.learner_config.LearnerConfig` only the optimizer, schedule, ``microbatches``,
``trainable`` and ``remat`` fields are read; the objective is always Bradley-Terry. Adapter dropout stays off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rl.learning.batch import TrainBatch
from rl.learning.learner_config import LearnerConfig
from rl.learning.reward_model import RewardModel, bradley_terry_loss, score_sequences
from rl.learning.train_step import accumulate_gradients, split_microbatches
from rl.learning.trained_state import TrainedState
from rl.models.lora import LoRAParam, has_lora
from rl.models.sharding import DEFAULT_RULES, Rules, host_to_sharded, logical_to_spec


class RewardLearner(TrainedState):
    """Trains ``model`` in place on ``mesh`` (see the module docstring).

    Args:
      model: the reward model; its parameters are read before and written back after every step.
      mesh: a ``(data, fsdp, tensor)`` mesh.
      config: optimizer and schedule (``objective`` and ``loss`` are not read).
      rules: logical-axis rules (the model's).
    """

    def __init__(self, model: RewardModel, mesh: Mesh, config: LearnerConfig, rules: Rules = DEFAULT_RULES):
        if not isinstance(model, RewardModel):
            raise TypeError(f"RewardLearner(model=): expected a RewardModel, got {type(model).__name__}")
        if not isinstance(config, LearnerConfig):
            raise TypeError(f"RewardLearner(config=): expected a LearnerConfig, got {type(config).__name__}")
        lora = config.trainable == "lora"
        if lora and not has_lora(model.backbone):
            raise ValueError("RewardLearner(model=): LearnerConfig.trainable='lora' needs a backbone with adapters")
        # Trained: everything, or the backbone's adapters and the head.
        trainable = nnx.Any(LoRAParam, nnx.All(nnx.Param, nnx.PathContains("head"))) if lora else nnx.Param
        super().__init__(model, mesh, config, rules, trainable)
        spec = logical_to_spec(("batch",), self.rules, (self.batch_parallelism,), dict(mesh.shape))
        self._rows, self._table = NamedSharding(mesh, spec), NamedSharding(mesh, PartitionSpec(*spec, None))
        self._programs: dict[str, Any] = {}

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One AdamW step of the Bradley-Terry loss on a :func:`~rl.learning.preference.pair_batch`.

        Metrics ``train/``: ``loss``, ``accuracy``, ``margin``, ``chosen``, ``rejected`` (pair means),
        ``grad_norm`` (before clipping), ``learning_rate``, ``pairs``.
        """
        b = np.shape(batch.tokens)[0]
        if b % (2 * self.batch_multiple):
            raise ValueError(
                f"RewardLearner.train_step(batch=): {b} rows are not 2 x a multiple of batch_multiple="
                f"{self.batch_multiple}; build it with pair_batch(pair_multiple=learner.batch_multiple)"
            )
        if "train" not in self._programs:
            self._programs["train"] = self._build_train()
        tokens, mask = self._place(batch.tokens, np.int32), self._place(batch.input_mask, np.bool_)
        weights = self._place(batch.weights, np.float32)
        params, rest = self._params(), nnx.state(self.model, nnx.Not(self._trainable))
        with jax.set_mesh(self.mesh):
            params, self._opt_state, self._step, metrics = self._programs["train"](
                params, self._opt_state, self._step, rest, tokens, mask, weights
            )
        nnx.update(self.model, params)
        return {k: float(v) for k, v in jax.device_get(metrics).items()}

    def scores(self, seqs: Sequence[Sequence[int]], *, pad_id: int, max_len: int | None = None) -> np.ndarray:
        """The current model's score of each token sequence (float32 ``[N]``)."""
        if "score" not in self._programs:
            graphdef = self._graphdef

            def run(params, rest, tokens, mask):
                return nnx.merge(graphdef, params, rest)(tokens, mask)

            shardings = (self._param_shardings, self._rest_shardings, self._table, self._table)
            self._programs["score"] = jax.jit(run, in_shardings=shardings, out_shardings=self._replicated)

        def apply(tokens: np.ndarray, mask: np.ndarray) -> jax.Array:
            params, rest = self._params(), nnx.state(self.model, nnx.Not(self._trainable))
            with jax.set_mesh(self.mesh):
                return self._programs["score"](params, rest, self._place(tokens, np.int32), self._place(mask, np.bool_))

        return score_sequences(apply, seqs, pad_id=pad_id, max_len=max_len, row_multiple=self.batch_parallelism)

    # -- internals ------------------------------------------------------------------------------
    def _place(self, value: Any, dtype: Any) -> jax.Array:
        array = np.asarray(value, dtype)
        return host_to_sharded(array, self._table if array.ndim == 2 else self._rows)

    def _build_train(self) -> Any:
        graphdef, rules, tx, schedule = self._graphdef, self.rules, self._tx, self._schedule
        microbatches, param_shardings, remat = self.config.microbatches, self._param_shardings, self.config.remat

        def loss_fn(params, rest, mb, total_pairs):
            tokens, mask, weights = mb
            loss, metrics = bradley_terry_loss(nnx.merge(graphdef, params, rest)(tokens, mask, remat), weights)
            share = weights[: weights.shape[0] // 2].sum() / jnp.maximum(total_pairs, 1e-9)
            return loss * share, {k: v * share for k, v in metrics.items()}

        def step_fn(params, opt_state, step, rest, tokens, mask, weights):
            total_pairs = weights[: weights.shape[0] // 2].sum()
            micro = split_microbatches((tokens, mask, weights), microbatches, rules)
            grads, metrics = accumulate_gradients(
                lambda p, mb: loss_fn(p, rest, mb, total_pairs), params, micro, param_shardings
            )
            grad_norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
            grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
            updates, opt_state = tx.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            metrics = {f"train/{k}": v for k, v in metrics.items()}
            metrics |= {"train/grad_norm": grad_norm, "train/learning_rate": schedule(step), "train/pairs": total_pairs}
            return params, opt_state, step + 1, metrics

        return jax.jit(
            step_fn,
            in_shardings=(
                self._param_shardings, self._opt_shardings, self._replicated, self._rest_shardings,
                self._table, self._table, self._rows,
            ),
            out_shardings=(self._param_shardings, self._opt_shardings, self._replicated, self._replicated),
            donate_argnums=(0, 1, 2),
        )  # fmt: skip
