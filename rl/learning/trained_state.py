"""What every learner holds on the host side: the trained variables, their AdamW state and step
counter, their shardings, and a checkpointable state.

The policy :class:`~rl.learning.learner.Learner` and the
:class:`~rl.learning.reward_learner.RewardLearner` differ in their step (log-probs and a policy,
SFT or preference loss; a Bradley-Terry loss on a scalar head) but not in this: which variables
train (a filter: ``nnx.Param``, or LoRA adapters, plus whatever a subclass adds), where they and
their optimizer moments live on the mesh, how many devices a batch is split over, and the
``state`` / ``abstract_state`` / ``load_state`` triple a :class:`rl.run.checkpoint.Checkpointer`
saves and restores. Keeping it in one place keeps a resumed run's state tree the same for both.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rl.learning.learner_config import LearnerConfig
from rl.learning.train_step import make_optimizer
from rl.models.sharding import Rules, batch_devices, state_shardings


class TrainedState:
    """The variables of ``model`` that ``trainable`` selects, with their AdamW state, on ``mesh``.

    Args:
      model: the module trained in place; its parameters are read before and written back after
        every step, so anyone holding the same module sees the newest weights.
      mesh: a ``(data, fsdp, tensor)`` mesh.
      config: optimizer and schedule (:func:`rl.learning.train_step.make_optimizer`).
      rules: logical-axis rules (the model's).
      trainable: an ``nnx`` filter of the variables that get gradients and optimizer state.
    """

    def __init__(self, model: nnx.Module, mesh: Mesh, config: LearnerConfig, rules: Rules, trainable: Any):
        self.model, self.mesh, self.config, self.rules = model, mesh, config, tuple(rules)
        self._trainable = trainable
        self._graphdef = nnx.graphdef(model)
        params, rest = nnx.state(model, trainable, ...)
        self._param_shardings = state_shardings(params, mesh, self.rules)
        self._rest_shardings = state_shardings(rest, mesh, self.rules)
        self._replicated = NamedSharding(mesh, PartitionSpec())
        self._tx, self._schedule = make_optimizer(config)
        self._opt_shardings = state_shardings(jax.eval_shape(self._tx.init, params), mesh, self.rules)
        params = self._params()  # placed in its shardings, and written back into the model
        with jax.set_mesh(mesh):
            self._opt_state = jax.jit(self._tx.init, out_shardings=self._opt_shardings)(params)
        self._step = jax.device_put(jnp.zeros((), jnp.int32), self._replicated)
        #: devices a batch is split over (the mesh axes the ``"batch"`` rule names)
        self.batch_parallelism = batch_devices(dict(mesh.shape), self.rules)

    @property
    def batch_multiple(self) -> int:
        """``B`` of every batch must be a multiple of this (the batch's devices x ``microbatches``)."""
        return self.batch_parallelism * self.config.microbatches

    @property
    def step(self) -> int:
        """Optimizer steps taken so far (restored by :meth:`load_state`)."""
        return int(jax.device_get(self._step))

    def state(self) -> dict[str, Any]:
        """Everything a bit-exact resume needs: ``params``, ``opt_state``, ``step`` (and a subclass's
        extras). The arrays are the live ones: save them before the next step, which donates them."""
        return {"params": self._params(), "opt_state": self._opt_state, "step": self._step, **self._extra_state()}

    def abstract_state(self) -> dict[str, Any]:
        """:meth:`state` as ``jax.ShapeDtypeStruct`` with shardings: the target of ``Checkpointer.restore``."""
        return jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), self.state(), self._state_shardings()
        )

    def load_state(self, state: dict[str, Any]) -> None:
        """Replaces the training state (e.g. from ``Checkpointer.restore``) and the model's parameters.

        Keys this learner does not hold are ignored (a run without KL ignores a checkpoint's
        reference). The arrays are copied into this learner's shardings, so the caller's stay valid.
        """
        name = type(self).__name__
        expected = set(self._state_shardings())
        missing = expected - set(state)
        if missing:
            raise ValueError(f"{name}.load_state(state=): missing {sorted(missing)} (expected keys {sorted(expected)})")
        state = {k: state[k] for k in expected}
        target = self.abstract_state()
        if jax.tree.structure(state) != jax.tree.structure(target):
            paths = lambda tree: {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)}  # noqa: E731
            got, want = paths(state), paths(target)
            raise ValueError(
                f"{name}.load_state(state=): the tree differs from this learner's (another model or optimizer?); "
                f"missing {sorted(want - got)[:5]}, unexpected {sorted(got - want)[:5]}"
            )
        placed = jax.device_put(state, self._state_shardings(), may_alias=False)
        nnx.update(self.model, placed["params"])
        self._opt_state, self._step = placed["opt_state"], placed["step"]
        self._load_extra_state(placed)

    # -- what a subclass adds to the state ---------------------------------------------------------
    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _extra_shardings(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, placed: dict[str, Any]) -> None:
        """``placed`` holds the extras of :meth:`_extra_shardings`, already on the mesh."""

    # -- internals ------------------------------------------------------------------------------
    def _state_shardings(self) -> dict[str, Any]:
        base = {"params": self._param_shardings, "opt_state": self._opt_shardings, "step": self._replicated}
        return {**base, **self._extra_shardings()}

    def _params(self) -> Any:
        """The trained variables, moved into their shardings (and back into the model) if needed."""
        params = nnx.state(self.model, self._trainable)
        placed = jax.tree.map(lambda x, s: x.sharding == s, params, self._param_shardings)
        if not all(jax.tree.leaves(placed)):
            params = jax.device_put(params, self._param_shardings)
            nnx.update(self.model, params)
        return params
