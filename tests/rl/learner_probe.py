"""What only the tests ask of a :class:`rl.learning.learner.Learner`: a bare SFT step and per-token log-probs.

The run never calls these (its SFT phase trains through ``train_step`` with ``objective="sft"``, and
the rollout records the sampler's log-probs), so they live here rather than on the learner's API.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl.learning import learner as learner_module
from rl.learning.batch import TrainBatch
from rl.learning.learner import Learner
from rl.learning.train_step import forward_logprobs


def sft_step(learner: Learner, batch: TrainBatch) -> dict[str, float]:
    """One optimizer step of masked cross-entropy on ``batch.loss_mask``, whatever the learner's objective.

    Shares the optimizer state, schedule and step counter with ``train_step``; ``old_logprobs`` and
    ``advantages`` are ignored.
    """
    return learner._update("sft", batch)


def logprobs(learner: Learner, batch: TrainBatch) -> np.ndarray:
    """The current policy's log-prob ``[B, T]`` of each token as a target (at ``config.temperature``).

    Aligned like ``TrainBatch.old_logprobs``: column ``t`` is the log-prob of ``tokens[:, t]`` given
    ``tokens[:, :t]``; column 0 and padding are 0. Compiled once per model and setting, in the
    learner's program cache.
    """
    c = learner.config
    programs: dict[tuple, Any] = learner_module._PROGRAMS
    key = ("logprobs", learner._graphdef, c.trainable, c.temperature, c.logits_chunk_mib, learner.mesh, learner.rules)
    if key not in programs:
        graphdef, temp, chunk = learner._graphdef, c.temperature, c.logits_chunk_mib

        def run(params, rest, tokens, input_mask, positions, segment_ids):
            logp = forward_logprobs(graphdef, params, rest, tokens, input_mask, temp, positions, segment_ids, chunk)[0]
            return jnp.where(input_mask, logp, 0.0)

        table = learner._batch_shardings()[0]
        shardings = (learner._param_shardings, learner._rest_shardings, table, table, table, table)
        programs[key] = jax.jit(run, in_shardings=shardings, out_shardings=learner._replicated)
    placed = learner._place_batch(batch, multiple=learner.batch_parallelism)
    params, rest = learner._params(), nnx.state(learner.model, nnx.Not(learner._trainable))
    with jax.set_mesh(learner.mesh):
        out = programs[key](params, rest, placed.tokens, placed.input_mask, placed.positions, placed.segment_ids)
    return np.asarray(jax.device_get(out))
