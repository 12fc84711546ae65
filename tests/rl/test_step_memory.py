"""What keeps a learner step's memory down: low-precision projections without float32 weight
copies, and rematerialised layers (``LearnerConfig.remat``). Both must leave the numbers alone:
the same forward, the same gradients, the same step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.learning.batch import TrainBatch
from rl.learning.learner import Learner, LearnerConfig
from rl.learning.losses import PolicyLossConfig
from rl.learning.reward_learner import RewardLearner
from rl.learning.reward_model import RewardModel
from rl.models import Transformer, get_model_config, sharding
from rl.models.kv_cache import KVCache
from rl.models.projection import project
from tests.rl.learner_probe import logprobs
from tests.rl.test_lm_head import _batch as lm_head_batch
from tests.rl.test_lm_head import _model as lm_head_model

B, T = 4, 32
MODEL = get_model_config("tiny")
# Adam's first update is ~ lr * g / eps with eps far above |g|: equal parameters after one step
# mean equal gradients (clipping off for the same reason).
BASE = LearnerConfig(learning_rate=0.5, eps=0.5, grad_clip_norm=None, total_steps=10)


# -- project ----------------------------------------------------------------------------------------
def _operands(dtype: jnp.dtype) -> tuple[jax.Array, jax.Array, jax.Array]:
    k = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k[0], (2, 5, 64)).astype(dtype)
    w = (0.1 * jax.random.normal(k[1], (64, 48))).astype(dtype)
    return x, w, jax.random.normal(k[2], (2, 5, 48)).astype(dtype)


def test_low_precision_project_is_the_plain_matmul_forward_and_backward():
    x, w, g = _operands(jnp.bfloat16)
    exact = (x.astype(jnp.float32) @ w.astype(jnp.float32)).astype(jnp.bfloat16)  # exact products, one rounding
    np.testing.assert_array_equal(np.asarray(project(x, w), np.float32), np.asarray(exact, np.float32))

    def pulled(f):
        return jax.vjp(f, x, w)[1](g)

    got, want = pulled(project), pulled(lambda a, b: a @ b)  # autodiff of the bfloat16 matmul
    for name, a, b in zip(("dx", "dw"), got, want, strict=True):
        assert a.dtype == b.dtype == jnp.bfloat16, name
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-2, atol=1e-2)
        assert np.abs(np.asarray(a, np.float32)).max() > 0.1, name


def test_float32_project_is_exactly_the_matmul_and_mixed_dtypes_are_refused():
    x, w, _ = _operands(jnp.float32)
    np.testing.assert_array_equal(project(x, w), x @ w)
    with pytest.raises(TypeError, match="project: x and w must share a dtype"):
        project(x, w.astype(jnp.bfloat16))


def test_a_frozen_low_precision_weight_gets_no_float32_copy():
    """The reason for ``project``: XLA:CPU's bfloat16 matmul converts the weight to float32 and keeps
    the copy for the backward pass; ``project``'s step needs less scratch than that copy alone."""
    x = jnp.ones((16, 2048), jnp.bfloat16)
    w = jnp.ones((2048, 2048), jnp.bfloat16)  # frozen: only x is differentiated
    copy = w.size * 4

    def scratch(f) -> int:
        step = jax.jit(jax.grad(lambda x, w: jnp.sum(f(x, w).astype(jnp.float32) ** 2)))
        return step.lower(x, w).compile().memory_analysis().temp_size_in_bytes

    assert scratch(lambda a, b: a @ b) >= copy  # still true of XLA:CPU, else project could go
    assert scratch(project) < copy / 2


# -- remat ------------------------------------------------------------------------------------------
def _batch() -> TrainBatch:
    return lm_head_batch(MODEL.vocab_size, T)


def _model(lora: bool, dropout: float = 0.0, dtype: str = "float32") -> Transformer:
    config = MODEL.replace(dtype=dtype, param_dtype=dtype)
    return lm_head_model(lora, MODEL.tie_embeddings, config, dropout)


CASES = {
    "ppo+kl+entropy-sharded": dict(objective="policy", loss=PolicyLossConfig(kl_coef=0.1, entropy_coef=0.01)),
    "sft-packed": dict(objective="sft"),
    "lora+dropout": dict(objective="policy", trainable="lora"),
    "bf16": dict(objective="policy", loss=PolicyLossConfig(entropy_coef=0.01)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_rematerialised_step_trains_like_the_plain_one(case, single_mesh):
    config = dataclasses.replace(BASE, **CASES[case])
    lora, dropout = case.startswith("lora"), 0.2 if "dropout" in case else 0.0
    dtype = "bfloat16" if case == "bf16" else "float32"
    batch = _batch()
    if case == "sft-packed":  # two sequences in row 0: segment ids and per-segment positions
        segments = np.zeros((B, T), np.int32)
        segments[0, 16:] = 1
        positions = np.tile(np.arange(T, dtype=np.int32), (B, 1))
        positions[0, 16:] -= 16
        batch = batch.replace(segment_ids=segments, positions=positions)
    plain = Learner(_model(lora, dropout, dtype), single_mesh, config)
    batch = batch.replace(old_logprobs=logprobs(plain, batch) * batch.loss_mask)  # on-policy
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2}) if case.endswith("sharded") else single_mesh
    remat = Learner(_model(lora, dropout, dtype), mesh, dataclasses.replace(config, remat=True))

    start = jax.tree.map(np.asarray, plain.state()["params"])
    want, got = plain.train_step(batch), remat.train_step(batch)
    tol = 2e-2 if dtype == "bfloat16" else 1e-5
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=tol, abs=1e-6), key
    want_params, got_params = (jax.tree.map(np.asarray, x.state()["params"]) for x in (plain, remat))
    moved = jax.tree.map(lambda a, b: np.abs(a.astype(np.float32) - b.astype(np.float32)).max(), want_params, start)
    assert max(jax.tree.leaves(moved)) > 1e-3  # the step did train
    if dtype == "bfloat16":
        assert _steps_apart(got_params, want_params, start) == []
        assert _steps_apart(start, want_params, start)  # control: the check sees a step that did not happen
        return
    for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want_params), jax.tree.leaves(got_params), strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-6, err_msg=str(path))


def _steps_apart(got, want, start) -> list[str]:
    """The bfloat16 leaves where ``got`` did not take ``want``'s step from ``start``.

    In bfloat16 the two steps' gradients differ by rounding, so elements may differ by more than the
    step moved them (an element near 0 has tiny ulps); what must hold is per leaf: the difference is
    a small part of the step (10 %), give or take one rounding at the leaf's
    largest value (a norm scale that moved by one ulp)."""
    apart = []
    leaves = zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got), jax.tree.leaves(start), strict=True)
    for (path, w), g, s in leaves:
        ulp = float(np.spacing(np.abs(w).max()))
        w, g, s = (x.astype(np.float32) for x in (w, g, s))
        if np.linalg.norm(g - w) > 0.1 * np.linalg.norm(w - s) + ulp:
            apart.append(jax.tree_util.keystr(path))
    return apart


def test_a_rematerialised_reward_model_step_trains_like_the_plain_one(single_mesh):
    batch = _batch()
    rows = batch.replace(weights=np.array([1.0, 1.0, 0.0, 0.0], np.float32))
    learners = [
        RewardLearner(RewardModel(_model(False)), single_mesh, dataclasses.replace(BASE, remat=remat))
        for remat in (False, True)
    ]
    want, got = (learner.train_step(rows) for learner in learners)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    want_params, got_params = (jax.tree.map(np.asarray, learner.state()["params"]) for learner in learners)
    for w, g in zip(jax.tree.leaves(want_params), jax.tree.leaves(got_params), strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-6)


def test_remat_is_refused_where_it_has_no_meaning():
    with pytest.raises(ValueError, match=r"LearnerConfig\.remat: expected True or False"):
        LearnerConfig(remat="yes")
    model = _model(False)
    cache = KVCache.zeros(MODEL, 1, 8)
    with pytest.raises(ValueError, match="remat is for training forwards"):
        model.hidden_states(jnp.zeros((1, 2), jnp.int32), jnp.zeros((1, 2), jnp.int32), cache=cache, remat=True)
