"""Learner behaviour: RL and SFT steps move the policy the right way, masks exclude what they should,
the step is the same on 1 or 8 devices and with or without micro-batches, and resume is bit-exact.

Every learner starts from the same host snapshot of the tiny preset (``load_state``), so two runs
differ only in what a test changes. Learners with equal (model, config, mesh) share compiled
programs, so the file compiles a handful of steps in all.
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl.learning.batch import TrainBatch
from rl.learning.learner import Learner, LearnerConfig
from rl.learning.losses import AGGREGATIONS, PolicyLossConfig
from rl.learning.train_step import lr_schedule, microbatch_shares
from rl.models import Transformer, get_model_config, sharding
from rl.run.checkpoint import Checkpointer
from tests.rl.learner_probe import logprobs, sft_step

B, T, PROMPT = 8, 64, 8
MODEL = get_model_config("tiny")
POLICY = LearnerConfig(objective="policy", learning_rate=1e-3, total_steps=50, grad_clip_norm=1.0)
# For "same update" comparisons: Adam divides by sqrt(v) + eps, so an entry whose gradient is
# ~0 (a rarely seen token's embedding row) turns float round-off into an lr-sized step of random
# sign. A larger eps bounds that amplification by lr / eps while keeping the optimizer the same.
EXACT = dataclasses.replace(POLICY, eps=1e-5, loss=PolicyLossConfig(kl_coef=0.05, entropy_coef=0.01))


def _model(seed: int = 0) -> Transformer:
    """Built eagerly on the default device; the Learner moves it into its mesh's shardings.

    (``create_sharded_model`` compiles an init program per call: seconds each on CPU.)
    """
    return Transformer(MODEL, nnx.Rngs(seed))


def _host(tree):
    return jax.tree.map(np.asarray, tree)


def _make_batch() -> TrainBatch:
    """8 rows: prompt (mask 0), sampled tokens (mask 1), a tool observation (mask 0) in the middle of
    some rows, and every row *ends* with an observation token; the last row is bucket padding."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, (B, T)).astype(np.int32)
    input_mask = np.zeros((B, T), bool)
    loss_mask = np.zeros((B, T), np.float32)
    for i, length in enumerate([64, 60, 52, 64, 48, 57, 62, 0]):
        input_mask[i, :length] = True
        loss_mask[i, PROMPT : length - 1] = 1.0  # the last real token is an observation
        if i % 2:
            loss_mask[i, 20:28] = 0.0  # a tool output inside the trajectory
    tokens[~input_mask] = 0
    advantages = np.array([1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 7.0], np.float32)
    weights = np.array([1.0] * 7 + [0.0], np.float32)
    old = np.zeros((B, T), np.float32)
    return TrainBatch(tokens, input_mask, loss_mask, old, advantages, weights)


@pytest.fixture(scope="module")
def learner(single_mesh):
    model = sharding.create_sharded_model(lambda: Transformer(MODEL, nnx.Rngs(0)), single_mesh)
    return Learner(model, single_mesh, POLICY)


@pytest.fixture(scope="module")
def init_state(learner):
    return _host(learner.state())


@pytest.fixture(scope="module")
def batch(learner, init_state):
    """On-policy: ``old_logprobs`` are the initial policy's log-probs of the sampled tokens."""
    learner.load_state(init_state)
    raw = _make_batch()
    return raw.replace(old_logprobs=logprobs(learner, raw) * raw.loss_mask)


def _run(learner, state, batches):
    learner.load_state(state)
    metrics = [learner.train_step(b) for b in batches]
    return _host(learner.state()["params"]), metrics


def _assert_trees_close(a, b, atol):
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, atol=atol, rtol=0, err_msg=jax.tree_util.keystr(path))


def test_positive_advantages_raise_logprob_negative_lower_it(learner, init_state, batch, caplog):
    learner.load_state(init_state)
    before = (logprobs(learner, batch) * batch.loss_mask).sum(1)
    learner.train_step(batch)
    with jax.log_compiles(), caplog.at_level("WARNING", logger="jax"):
        for _ in range(2):
            metrics = learner.train_step(batch)
    assert not [r for r in caplog.messages if "Compiling jit(step_fn)" in r]  # compiled once per shape
    after = (logprobs(learner, batch) * batch.loss_mask).sum(1)
    assert np.all(after[:4] > before[:4]), (before, after)
    assert np.all(after[4:7] < before[4:7]), (before, after)
    trained = batch.loss_mask[:, 1:] * batch.weights[:, None]
    assert metrics["train/tokens"] == (trained > 0).sum()
    assert learner.step == 3
    # The module the sampler holds carries the new weights: its own forward agrees.
    logits, _ = learner.model(batch.tokens, input_mask=batch.input_mask)
    logp = jax.nn.log_softmax(logits[:, :-1], -1)
    own = np.take_along_axis(np.asarray(logp), batch.tokens[:, 1:, None], -1)[..., 0] * batch.input_mask[:, 1:]
    np.testing.assert_allclose(own, logprobs(learner, batch)[:, 1:], atol=1e-5)


def test_first_on_policy_step_has_unit_ratio_and_no_clipping(learner, init_state, batch):
    (metrics,) = _run(learner, init_state, [batch])[1]
    assert metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["train/clip_fraction"] == 0.0
    assert metrics["train/approx_kl_old"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["train/learning_rate"] == pytest.approx(POLICY.learning_rate)
    assert metrics["train/grad_norm"] > 0 and metrics["train/entropy"] > 0


def test_masked_positions_do_not_change_the_update(learner, init_state, batch):
    base_params, base_metrics = _run(learner, init_state, [batch])
    off = batch.loss_mask == 0
    noise = np.random.default_rng(1).normal(0, 30, (B, T)).astype(np.float32)
    changed = batch.replace(
        old_logprobs=np.where(off, noise, batch.old_logprobs),  # garbage where nothing trains
        advantages=batch.advantages.copy(),
        tokens=batch.tokens.copy(),
    )
    changed.advantages[7] = -100.0  # the padding row (weight 0)
    changed.tokens[7] = 5
    last = batch.input_mask.sum(1) - 1
    for i in range(7):  # the final observation token: a mask-0 target no later target sees
        assert batch.loss_mask[i, last[i]] == 0
        changed.tokens[i, last[i]] = (batch.tokens[i, last[i]] + 17) % 256
    params, metrics = _run(learner, init_state, [changed])
    jax.tree.map(np.testing.assert_array_equal, base_params, params)
    assert metrics == base_metrics
    # Control: the same edit on a *trained* token does change the update.
    control = batch.replace(tokens=batch.tokens.copy())
    control.tokens[0, 30] = (control.tokens[0, 30] + 17) % 256
    params, _ = _run(learner, init_state, [control])
    assert not np.array_equal(params["layers"][0]["mlp"]["up"], base_params["layers"][0]["mlp"]["up"])


@pytest.fixture(scope="module")
def kl_reference(single_mesh, batch):
    """(start state, params and metrics after two steps) of the KL learner on one device."""
    reference = Learner(_model(), single_mesh, EXACT)
    start = _host(reference.state())
    return start, *_run(reference, start, [batch, batch])


@pytest.mark.parametrize("mesh_shape", [{"data": 2, "fsdp": 2, "tensor": 2}, {"data": 8}])
def test_sharded_step_equals_single_device(kl_reference, batch, mesh_shape):
    start, want_params, want_metrics = kl_reference
    mesh = sharding.make_mesh(mesh_shape)
    sharded = Learner(_model(), mesh, EXACT)
    assert sharded.state()["params"]["embed"].sharding.mesh == mesh
    params, metrics = _run(sharded, start, [batch, batch])
    _assert_trees_close(params, want_params, atol=1e-5)
    for got, want in zip(metrics, want_metrics, strict=True):
        assert got.keys() == want.keys()
        for key in got:
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-5), key
    assert want_metrics[0]["train/kl_ref"] == pytest.approx(0.0, abs=1e-7)
    assert want_metrics[1]["train/kl_ref"] > 0  # the policy has moved away from the reference
    # The model the sampler holds has the sharded, updated weights.
    np.testing.assert_array_equal(np.asarray(sharded.model.embed[...]), params["embed"])


def test_microbatches_equal_one_big_batch(kl_reference, single_mesh, batch):
    start, want_params, want_metrics = kl_reference
    learner = Learner(_model(), single_mesh, dataclasses.replace(EXACT, microbatches=4))
    params, metrics = _run(learner, start, [batch, batch])
    _assert_trees_close(params, want_params, atol=1e-6)
    for got, want in zip(metrics, want_metrics, strict=True):
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_microbatch_shares_recompose_every_aggregation(aggregation):
    """Summing share x micro-batch aggregate over interleaved micro-batches gives the batch aggregate."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(8, 16)).astype(np.float32)
    mask = (rng.random((8, 16)) < 0.5).astype(np.float32)
    mask[3] = 0.0  # a row with nothing to train
    agg = AGGREGATIONS[aggregation]
    totals = {"tokens": mask.sum(), "sequences": float((mask.sum(-1) > 0).sum()), "rows": 8.0}
    parts = [
        microbatch_shares(jnp.asarray(mask[m::4]), totals, aggregation)["agg"] * agg(x[m::4], mask[m::4], None)
        for m in range(4)
    ]
    np.testing.assert_allclose(sum(parts), agg(x, mask, None), rtol=1e-6)


def test_sft_steps_reduce_masked_nll(learner, init_state, batch):
    learner.load_state(init_state)
    mask = batch.loss_mask * batch.weights[:, None]

    def nll() -> float:
        return float(-(logprobs(learner, batch) * mask).sum() / mask.sum())

    start = nll()
    losses = [sft_step(learner, batch)["train/sft_nll"] for _ in range(5)]
    assert losses[0] == pytest.approx(start, rel=1e-5)  # the step's loss is the NLL before it
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert nll() < start - 0.1


@pytest.mark.parametrize(
    "field, value",
    [
        ("objective", "a2c"),
        ("learning_rate", 0.0),
        ("warmup_steps", 100),
        ("total_steps", 0),
        ("end_lr_ratio", 1.5),
        ("weight_decay", -1.0),
        ("b2", 1.0),
        ("eps", 0.0),
        ("grad_clip_norm", 0.0),
        ("microbatches", 0),
        ("temperature", 0.0),
        ("loss", {"clip_low": 0.2}),
    ],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"LearnerConfig\.{field}\b"):
        LearnerConfig(**{"total_steps": 50, field: value})


def test_batch_not_divisible_by_parallelism_times_microbatches(single_mesh, batch):
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    learner = Learner(_model(), mesh, dataclasses.replace(POLICY, microbatches=4))
    assert learner.batch_multiple == 16
    with pytest.raises(ValueError, match=r"B=8 .*divisible by 16.*microbatches=4"):
        learner.train_step(batch)
    bad = batch.replace(loss_mask=batch.loss_mask[:, :32])
    with pytest.raises(ValueError, match=r"TrainBatch\.loss_mask"):
        Learner(_model(), single_mesh, POLICY).train_step(bad)


def test_resume_through_checkpointer_is_bit_exact(single_mesh, batch, tmp_path):
    batches = [batch.replace(advantages=batch.advantages * s) for s in (1.0, -0.5, 2.0)]
    uninterrupted = Learner(_model(), single_mesh, EXACT)
    want = [uninterrupted.train_step(b) for b in batches]

    first = Learner(_model(), single_mesh, EXACT)
    first.train_step(batches[0])
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(first.step, first.state(), {"note": "after one step"})

    resumed = Learner(_model(seed=3), single_mesh, EXACT)  # other weights: all must be restored
    state, extra = checkpointer.restore(checkpointer.latest_step(), resumed.abstract_state())
    resumed.load_state(state)
    checkpointer.close()
    assert extra == {"note": "after one step"} and resumed.step == 1
    got = [resumed.train_step(b) for b in batches[1:]]
    assert got == want[1:]
    jax.tree.map(np.testing.assert_array_equal, _host(resumed.state()), _host(uninterrupted.state()))
    assert "ref_params" in resumed.state()


def test_lr_schedule_warms_up_then_decays_to_the_end_ratio():
    schedule = lr_schedule(1.0, warmup_steps=4, total_steps=14, end_lr_ratio=0.1)
    lrs = [float(schedule(s)) for s in range(16)]
    np.testing.assert_allclose(lrs[:5], [0.25, 0.5, 0.75, 1.0, 1.0], rtol=1e-6)  # step 0 already learns
    assert all(b < a for a, b in itertools.pairwise(lrs[4:15]))
    np.testing.assert_allclose(lrs[14:], [0.1, 0.1], rtol=1e-6)
