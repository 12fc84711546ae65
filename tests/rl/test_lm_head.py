"""The chunked LM head (``LearnerConfig.logits_chunk_mib``): the same log-probs, entropies, losses and
gradients as computing all logits at once, for every objective, with LoRA, and on a sharded mesh.

A vocabulary of 8192 makes the 1 MiB budget cut a 64-token row into several chunks (of uneven
fit: the last one is padded), which the tiny preset's 272 would not.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from rl.learning.batch import TrainBatch
from rl.learning.learner import Learner, LearnerConfig
from rl.learning.lm_head import chunk_positions, token_logprobs
from rl.learning.losses import PolicyLossConfig
from rl.learning.preference import PreferenceConfig
from rl.models import ModelConfig, Transformer, get_model_config, sharding
from rl.models.lora import LoRAConfig, LoRAParam, apply_lora
from tests.rl.learner_probe import logprobs

VOCAB, B, T = 8192, 4, 64
MODEL = get_model_config("tiny").replace(vocab_size=VOCAB)
# Adam's first update is lr * g / (|g| + eps): with eps far above |g| it is ~ lr * g / eps, so equal
# parameters after one step mean equal gradients (clipping and decay off for the same reason).
BASE = LearnerConfig(learning_rate=0.5, eps=0.5, grad_clip_norm=None, total_steps=10)


def _random_head(tied: bool, e: int = 16, v: int = 4096) -> tuple[jax.Array, ...]:
    k = jax.random.split(jax.random.key(0), 5)
    hidden = jax.random.normal(k[0], (2, 77, e))
    head = 0.5 * jax.random.normal(k[1], (v, e) if tied else (e, v))
    targets = jax.random.randint(k[2], (2, 77), 0, v)
    return hidden, head, targets, jax.random.normal(k[3], (2, 77)), jax.random.normal(k[4], (2, 77))


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("use_entropy", [True, False])
def test_chunked_head_equals_all_logits_at_once(tied, use_entropy):
    hidden, head, targets, g_logp, g_ent = _random_head(tied)
    assert chunk_positions(2, 77, 4096, 1) == 32  # 1 MiB / (2 rows x 4096 x 4 B): three chunks, one padded

    def loss(hidden, head, budget):
        logp, entropy = token_logprobs(hidden, head, targets, 0.7, budget, (), tied)
        return (logp * g_logp).sum() + ((entropy * g_ent).sum() if use_entropy else 0.0), (logp, entropy)

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True), static_argnums=2)
    (want, want_aux), want_grads = grad(hidden, head, 0)
    (got, got_aux), got_grads = grad(hidden, head, 1)
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    for g, w in zip((*got_aux, *got_grads), (*want_aux, *want_grads), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(want_grads[1])).max() > 1e-2  # the head's gradient is not trivially 0


def test_chunk_length_follows_the_rows_each_device_holds():
    assert chunk_positions(8, 512, 151_936, 0) == 512  # 0: off
    assert chunk_positions(1, 512, 151_936, 64) == 110  # 64 MiB of float32 logits: 110 positions
    assert chunk_positions(8, 512, 272, 64) == 512  # a small vocabulary fits in one chunk
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    assert chunk_positions(8, 512, 151_936, 64) == 13
    with jax.set_mesh(mesh):  # 8 rows over data x fsdp = 4 devices: 2 rows each
        assert chunk_positions(8, 512, 151_936, 64) == 55


def _batch(vocab: int = VOCAB, t: int = T) -> TrainBatch:
    """Two pairs (rows 0-1 chosen, 2-3 rejected: the preference layout) that also serve as RL rows:
    a shared prompt of ``t // 4`` tokens, rows 1 and 3 padded at the end."""
    rng = np.random.default_rng(0)
    prompt = t // 4
    tokens = rng.integers(0, vocab, (B, t)).astype(np.int32)
    tokens[2:, :prompt] = tokens[:2, :prompt]  # a pair shares its prompt
    input_mask = np.ones((B, t), bool)
    input_mask[1, t - 14 :] = input_mask[3, t - 7 :] = False
    loss_mask = np.zeros((B, t), np.float32)
    loss_mask[:, prompt:] = 1.0
    loss_mask *= input_mask
    zeros = np.zeros((B, t), np.float32)
    return TrainBatch(tokens, input_mask, loss_mask, zeros, np.array([1.0, -0.5, 0.5, -1.0], np.float32), np.ones(B))


def _model(lora: bool, tied: bool, config: ModelConfig = MODEL, dropout: float = 0.0) -> Transformer:
    model = Transformer(config.replace(tie_embeddings=tied), nnx.Rngs(0))
    if lora:  # nonzero B too, else the adapters' A would get no gradient
        model = apply_lora(model, LoRAConfig(rank=4, alpha=8.0, dropout=dropout))
        state = nnx.state(model, LoRAParam)
        keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(state))))
        nnx.update(model, jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), state))
    return model


CASES = {
    "ppo+kl+entropy": dict(objective="policy", loss=PolicyLossConfig(kl_coef=0.1, entropy_coef=0.01)),
    "gspo": dict(objective="policy", loss=PolicyLossConfig(name="gspo", aggregation="sequence")),
    "sft": dict(objective="sft"),
    "dpo": dict(objective="preference", preference=PreferenceConfig(loss="dpo", beta=0.5)),
    "simpo": dict(objective="preference", preference=PreferenceConfig(loss="simpo", beta=2.0)),
    "lora-untied": dict(objective="policy", trainable="lora", loss=PolicyLossConfig(entropy_coef=0.01)),
    "sharded": dict(objective="policy", loss=PolicyLossConfig(kl_coef=0.1, entropy_coef=0.01)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_learner_step_is_the_same_with_a_chunked_head(case, single_mesh):
    lora, tied = case.startswith("lora"), not case.endswith("untied")
    config = dataclasses.replace(BASE, **CASES[case])
    batch = _batch()
    plain = Learner(_model(lora, tied), single_mesh, dataclasses.replace(config, logits_chunk_mib=0))
    batch = batch.replace(old_logprobs=logprobs(plain, batch) * batch.loss_mask)  # on-policy
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2}) if case == "sharded" else single_mesh
    chunked = Learner(_model(lora, tied), mesh, dataclasses.replace(config, logits_chunk_mib=1))
    np.testing.assert_allclose(logprobs(chunked, batch), logprobs(plain, batch), rtol=1e-6, atol=2e-6)

    start = jax.tree.map(np.asarray, plain.state()["params"])
    want, got = plain.train_step(batch), chunked.train_step(batch)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    want_params, got_params = (jax.tree.map(np.asarray, x.state()["params"]) for x in (plain, chunked))
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), want_params, start)
    assert max(jax.tree.leaves(moved)) > 1e-3  # the step did train
    for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want_params), jax.tree.leaves(got_params), strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-6, err_msg=jax.tree_util.keystr(path))
