"""Sequence packing: several trajectories per row must train exactly like one per row."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from rl.learning.batch import pack
from rl.learning.learner import Learner, LearnerConfig
from rl.learning.losses import PolicyLossConfig
from rl.models import Transformer, get_model_config, sharding
from tests.rl.learner_probe import logprobs

MODEL = get_model_config("tiny", num_layers=1)


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = [40, 12, 25, 9, 30, 17]
    seqs = [list(rng.integers(0, 256, n)) for n in lengths]
    masks = [[0] * (n // 3) + [1] * (n - n // 3) for n in lengths]
    old = [[float(-rng.random()) * m for m in mask] for mask in masks]
    adv = list(rng.normal(size=len(lengths)))
    return seqs, masks, old, adv


def test_first_fit_packs_and_keeps_every_token():
    seqs, masks, old, adv = _data()
    batch = pack(seqs, masks, old, adv, pad_id=263, pack_sequences=True, length_buckets=(64,), batch_buckets=None)
    assert batch.shape == (3, 64)  # 133 tokens in 3 rows of 64 instead of 6
    assert int(batch.input_mask.sum()) == sum(len(s) for s in seqs)
    for row in range(batch.shape[0]):
        segs = batch.segment_ids[row][batch.input_mask[row]]
        for k in np.unique(segs):
            where = np.flatnonzero(batch.segment_ids[row] == k)
            assert batch.positions[row, where].tolist() == list(range(len(where)))
            assert batch.loss_mask[row, where[0]] == 0.0  # no target at a sequence start
    # every sequence is there, token for token
    rows = [
        batch.tokens[r, batch.segment_ids[r] == k].tolist()
        for r in range(batch.shape[0])
        for k in range(1, batch.segment_ids[r].max() + 1)
    ]
    assert sorted(rows) == sorted(s for s in seqs)


@pytest.fixture(scope="module")
def learner(single_mesh):
    model = sharding.create_sharded_model(lambda: Transformer(MODEL, nnx.Rngs(0)), single_mesh)
    config = LearnerConfig(learning_rate=1e-3, warmup_steps=0, total_steps=10, eps=1e-5, loss=PolicyLossConfig())
    return Learner(model, single_mesh, config)


def test_packed_logprobs_and_update_equal_unpacked(learner):
    seqs, masks, old, adv = _data(1)
    kw = {"pad_id": 263, "length_buckets": (64,), "batch_buckets": None}
    flat = pack(seqs, masks, old, adv, **kw)
    packed = pack(seqs, masks, old, adv, pack_sequences=True, **kw)
    state = jax.tree.map(np.asarray, learner.state())
    lp_flat, lp_packed = logprobs(learner, flat), logprobs(learner, packed)
    for r, s in enumerate(seqs):
        row, k = next(
            (row, k)
            for row in range(packed.shape[0])
            for k in range(1, packed.segment_ids[row].max() + 1)
            if packed.tokens[row, packed.segment_ids[row] == k].tolist() == s
        )
        got = lp_packed[row, packed.segment_ids[row] == k][1:]
        np.testing.assert_allclose(got, lp_flat[r, 1 : len(s)], atol=2e-5)
    m_flat = learner.train_step(flat)
    p_flat = jax.tree.map(np.asarray, learner.state()["params"])
    learner.load_state(state)
    m_packed = learner.train_step(packed)
    p_packed = jax.tree.map(np.asarray, learner.state()["params"])
    assert m_packed["train/tokens"] == m_flat["train/tokens"]
    assert m_packed["train/loss"] == pytest.approx(m_flat["train/loss"], rel=1e-4)
    for a, b in zip(jax.tree.leaves(p_flat), jax.tree.leaves(p_packed), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
