"""The learner's host side: state, shardings and placement around one jitted optimizer step.

How a step is built, and why:
  - **Pure step, compiled once per batch shape.** ``(params, opt_state, step, ref_params, rest,
    batch) -> (params, opt_state, step, metrics)`` under one ``jax.jit`` with explicit in/out
    shardings: parameters and AdamW moments by their logical-axis shardings
    (:func:`rl.models.sharding.state_shardings`), the batch split along ``B`` over the mesh axes the
    ``"batch"`` rule names (``data`` x ``fsdp`` by default), scalars and metrics replicated.
    Parameters, optimizer state and the step counter are donated, so an update needs no second
    copy of the model in device memory.
  - **The sampler's module is the source of truth for the weights.** Every step reads the
    parameters from the ``Transformer`` it was given and writes the new ones back with
    ``nnx.update``; a :class:`rl.generation.sampler.Sampler` built on the same module therefore samples
    from the newest policy with no copy. (Donation deletes the old buffers: do not keep arrays
    from ``nnx.state(model)`` across a step.)
  - **Bounded activations.** A batch is split into more micro-batches than ``microbatches`` when
    its micro-batches would hold more than ``LearnerConfig.microbatch_tokens`` tokens per device
    (:meth:`Learner.microbatches_for`), so a long-episode RL batch does not need gigabytes; and
    the LM head runs a chunk of positions at a time (``LearnerConfig.logits_chunk_mib``,
    :mod:`rl.learning.lm_head`), so a 150k vocabulary's logits never exist for the whole batch.
  - **Exact gradient accumulation** over ``microbatches`` inside the one step (see :mod:`rl.learning.train_step`,
    which holds the pure step; this module is its host side).
  - **The learner knows objectives, not algorithms.** ``LearnerConfig.objective`` is ``"policy"``
    (the loss of :data:`rl.learning.losses.POLICY_LOSSES` named by ``loss.name``) or ``"sft"``.
    GRPO and PPO differ only in how the *caller* computes advantages (group-relative vs. batch
    baseline, :mod:`rl.learning.advantages`), so both are the same ``"policy"`` learner.
  - **Temperature.** The ratio's log-probs are computed at ``LearnerConfig.temperature``, which
    must be the temperature the ``old_logprobs`` were taken at. The sampler's ``raw_logprobs``
    are temperature-1, full-vocabulary log-probs, so RL configs sample at temperature 1 with no
    top-k/top-p and keep ``temperature=1.0`` here.
  - **Reference policy.** Only when ``loss.kl_coef > 0``: a copy of the initial parameters,
    placed with the same shardings (no full copy on one device), whose log-probs are computed
    inside the step; it is part of :meth:`Learner.state`, so a resumed run keeps the same one.
  - **LoRA** (``LearnerConfig.trainable="lora"``): only the adapters of :mod:`rl.models.lora` are
    "parameters" here: gradients, AdamW moments, donation, :meth:`Learner.state` and the KL
    reference hold adapters alone, and the base weights ride along unchanged (not donated) with
    the rest of the module's state. Adapter dropout, when configured, is on in the training
    forward only, with a fresh mask each step (the step number seeds it: a resume replays it).
  - Parameters and compute keep the model's own dtypes (``ModelConfig.param_dtype`` /
    ``dtype``); log-probs, losses and the accumulated gradients are float32.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rl.learning.batch import TrainBatch
from rl.learning.learner_config import SPLITTABLE_AGGREGATIONS, LearnerConfig
from rl.learning.train_step import build_train_step
from rl.learning.trained_state import TrainedState
from rl.models.lora import LoRAParam, has_lora
from rl.models.sharding import DEFAULT_RULES, Rules, host_to_sharded, logical_to_spec
from rl.models.transformer import Transformer

__all__ = ["Learner", "LearnerConfig"]

BATCH_FIELDS = {  # field -> (dtype, rank): how the learner places a TrainBatch
    "tokens": (np.int32, 2),
    "input_mask": (np.bool_, 2),
    "loss_mask": (np.float32, 2),
    "old_logprobs": (np.float32, 2),
    "advantages": (np.float32, 2),
    "weights": (np.float32, 1),
    "positions": (np.int32, 2),
    "segment_ids": (np.int32, 2),
}


# Compiled programs shared by learners of the same model structure, config, mesh and rules (a
# learner rebuilt to resume from a checkpoint reuses the program instead of recompiling).
_PROGRAMS: dict[tuple, Any] = {}


class Learner(TrainedState):
    """Trains ``model`` in place on ``mesh``: AdamW state, step counter and (if KL) a reference policy.

    Args:
      model: the policy; its parameters are read before and written back after every step, so
        a sampler on the same module always sees the newest weights.
      mesh: a ``(data, fsdp, tensor)`` mesh (:func:`rl.models.sharding.make_mesh`).
      config: optimizer, schedule and loss settings.
      rules: logical-axis rules mapping parameter and batch axes to mesh axes (use the model's).

    Usage from a training loop (sampler and learner share ``model``)::

        sampler, learner = Sampler(model, tokenizer, mesh), Learner(model, mesh, LearnerConfig(...))
        if (step := checkpointer.latest_step()) is not None:
            state, extra = checkpointer.restore(step, learner.abstract_state())
            learner.load_state(state)                 # also puts the weights back into `model`
        ...                                           # rollouts: completions' raw_logprobs -> old_logprobs
        batch = rl.learning.batch.pack(..., batch_multiple=learner.batch_multiple)
        metrics = learner.train_step(batch)           # {"train/loss": ...}; `model` now holds the new weights
        checkpointer.save(learner.step, learner.state(), extra)   # before the next step donates them
    """

    def __init__(self, model: Transformer, mesh: Mesh, config: LearnerConfig, rules: Rules = DEFAULT_RULES):
        if not isinstance(config, LearnerConfig):
            raise TypeError(f"Learner(config=): expected a LearnerConfig, got {type(config).__name__}")
        if config.trainable == "lora" and not has_lora(model):
            raise ValueError(
                "Learner(model=): LearnerConfig.trainable='lora' needs a model with adapters "
                "(rl.models.lora.apply_lora); this one has none"
            )
        self._dropout = any(isinstance(m, nnx.Dropout) and m.rate > 0 for _, m in nnx.iter_modules(model))
        # The training forward's module: adapter dropout on (the sampler's module keeps it off).
        train_view = nnx.view(model, only=nnx.Dropout, deterministic=False) if self._dropout else model
        self._train_graphdef = nnx.graphdef(train_view)
        # What is trained (and optimized, donated, checkpointed): the parameters, or the adapters only.
        super().__init__(model, mesh, config, rules, LoRAParam if config.trainable == "lora" else nnx.Param)
        # A real copy: the live parameters are donated every step, the reference must survive.
        self._ref = (
            jax.device_put(self._params(), self._param_shardings, may_alias=False) if config.use_reference else None
        )

    # -- public API -----------------------------------------------------------------------------
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step on ``batch`` with the configured objective; returns ``train/...`` metrics.

        Metrics: ``loss``, ``entropy`` (token mean), ``grad_norm`` (before clipping),
        ``learning_rate`` (the rate this step used), ``tokens`` (trained tokens); for policy
        objectives also ``pg_loss``, ``clip_fraction``, ``approx_kl_old``, ``ratio_mean`` and,
        with a KL penalty, ``kl_ref``; for SFT ``sft_nll``.
        """
        return self._update(self.config.objective, batch)

    # -- the reference policy is part of the state -----------------------------------------------
    def _extra_state(self) -> dict[str, Any]:
        return {"ref_params": self._ref} if self._ref is not None else {}

    def _extra_shardings(self) -> dict[str, Any]:
        return {"ref_params": self._param_shardings} if self.config.use_reference else {}

    def _load_extra_state(self, placed: dict[str, Any]) -> None:
        self._ref = placed.get("ref_params")

    # -- internals ------------------------------------------------------------------------------
    def _batch_shardings(self) -> tuple[NamedSharding, ...]:
        spec = logical_to_spec(("batch",), self.rules, (self.batch_parallelism,), dict(self.mesh.shape))
        row = NamedSharding(self.mesh, spec)
        table = NamedSharding(self.mesh, PartitionSpec(*spec, None))
        return tuple(table if rank == 2 else row for _, rank in BATCH_FIELDS.values())

    def _place_batch(self, batch: TrainBatch, multiple: int) -> TrainBatch:
        """Checks shapes and dtypes, then puts each field on the mesh, split along ``B``."""
        if not isinstance(batch, TrainBatch):
            raise TypeError(f"batch: expected a rl.learning.batch.TrainBatch, got {type(batch).__name__}")
        b, t = np.shape(batch.tokens) if np.ndim(batch.tokens) == 2 else (None, None)
        if b is None:
            raise ValueError(f"TrainBatch.tokens: expected shape [B, T], got {np.shape(batch.tokens)}")
        if b % multiple:
            raise ValueError(
                f"TrainBatch: batch size B={b} is not divisible by {multiple} = batch parallelism "
                f"{self.batch_parallelism} (mesh axes of the 'batch' rule) x LearnerConfig.microbatches="
                f"{self.config.microbatches}; pack with rl.learning.batch.pack(batch_multiple={multiple})"
            )
        fields = {}
        batch = batch.with_defaults()  # per-token advantages, positions and segments for unpacked rows
        for (name, (dtype, rank)), sharding in zip(BATCH_FIELDS.items(), self._batch_shardings(), strict=True):
            value = getattr(batch, name)
            want = (b, t)[:rank]
            if tuple(np.shape(value)) != want:
                raise ValueError(f"TrainBatch.{name}: expected shape {list(want)}, got {list(np.shape(value))}")
            if isinstance(value, jax.Array):
                fields[name] = jax.device_put(value.astype(dtype), sharding)
            else:
                fields[name] = host_to_sharded(np.asarray(value, dtype), sharding)
        return TrainBatch(**fields)

    def microbatches_for(self, shape: tuple[int, int]) -> int:
        """Micro-batches of a ``[B, T]`` batch: ``config.microbatches``, times the smallest factor of
        the rows that keeps each micro-batch within ``config.microbatch_tokens`` tokens per device.

        A function of the shape alone, so a resumed run splits every batch as the first run did.
        """
        b, t = shape
        configured, budget = self.config.microbatches, self.config.microbatch_tokens
        rows = b // (self.batch_parallelism * configured)  # per device, in each configured micro-batch
        if not budget or rows * t <= budget or self.config.loss.aggregation not in SPLITTABLE_AGGREGATIONS:
            return configured
        factor = next((f for f in range(2, rows) if rows % f == 0 and rows // f * t <= budget), rows)
        return configured * factor

    def _uses_reference(self, objective: str) -> bool:
        return (
            objective == self.config.objective and objective in ("policy", "preference") and self.config.use_reference
        )

    def _update(self, objective: str, batch: TrainBatch) -> dict[str, float]:
        placed = self._place_batch(batch, multiple=self.batch_multiple)
        microbatches = self.microbatches_for(placed.shape)
        if objective == "preference" and (placed.shape[0] // 2) % microbatches:
            microbatches = self.config.microbatches  # a pair's two rows must share a micro-batch
        config = dataclasses.replace(self.config, microbatches=microbatches)
        key = (objective, self._graphdef, config, self.mesh, self.rules)
        if key not in _PROGRAMS:
            step_fn = build_train_step(
                self._train_graphdef, config, objective, self.rules, self._param_shardings, ref_graphdef=self._graphdef
            )
            batch_shardings = TrainBatch(**dict(zip(BATCH_FIELDS, self._batch_shardings(), strict=True)))
            ref_shardings = self._param_shardings if self._uses_reference(objective) else None
            _PROGRAMS[key] = jax.jit(
                step_fn,
                in_shardings=(
                    self._param_shardings,
                    self._opt_shardings,
                    self._replicated,
                    ref_shardings,
                    self._rest_shardings,
                    batch_shardings,
                ),
                out_shardings=(self._param_shardings, self._opt_shardings, self._replicated, self._replicated),
                donate_argnums=(0, 1, 2),
            )
        ref = self._ref if self._uses_reference(objective) else None
        params, rest = self._params(), nnx.state(self.model, nnx.Not(self._trainable))
        if self._dropout:
            rest = _seed_dropout(rest, self.step)
        with jax.set_mesh(self.mesh):
            params, self._opt_state, self._step, metrics = _PROGRAMS[key](
                params, self._opt_state, self._step, ref, rest, placed
            )
        nnx.update(self.model, params)
        return {k: float(v) for k, v in jax.device_get(metrics).items()}


def _seed_dropout(rest: Any, step: int) -> Any:
    """``rest`` with every RNG stream's counter at ``step``: a fresh dropout mask each optimizer step.

    The step program does not return the module's RNG state, so its counters would never advance.
    (The micro-batches of one step share a mask: each starts from the same counter.)
    """

    def one(var: Any) -> Any:
        if isinstance(var, nnx.RngCount):
            return var.replace(jnp.full(var.shape, step, var.dtype))
        return var

    return jax.tree.map(one, rest, is_leaf=lambda x: isinstance(x, nnx.Variable))
