"""Preference optimisation: DPO / SimPO losses and gradients against hand computations on a tiny model,
the pair layout, JSONL pairs, and pairs mined from trajectories (anomalies left out)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl.generation.tokenizer import ByteTokenizer
from rl.learning.preference import Pair, PairData, PreferenceConfig, load_pairs, mine_pairs, pair_batch, preference_loss
from rl.learning.train_step import forward_logprobs
from rl.rollout.trajectory import EpisodeRecord
from tests.rl.test_sampler import _make_model


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@pytest.fixture(scope="module")
def tok():
    return ByteTokenizer()


@pytest.fixture(scope="module")
def pairs(tok):
    def seq(prompt: str, answer: str):
        p, a = tok.encode(prompt), tok.encode(answer)
        return (p + a, [0] * len(p) + [1] * len(a))

    return [
        Pair(seq("Q: 2+2? ", "4."), seq("Q: 2+2? ", "five, I think."), "t0"),
        Pair(seq("Q: name? ", "agentrl"), seq("Q: name? ", "no"), "t1"),
        Pair(seq("x", "yes"), seq("x", "nope"), "t2"),
    ]


def _per_token(model, batch):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    logp, _ = forward_logprobs(graphdef, params, rest, jnp.asarray(batch.tokens), jnp.asarray(batch.input_mask), 1.0)
    return np.asarray(logp, np.float64)


def test_pair_batch_layout_keeps_pairs_together(pairs, tok):
    batch = pair_batch(pairs, pad_id=tok.pad_id, pair_multiple=4)
    p = batch.tokens.shape[0] // 2
    assert p == 4 and batch.weights.tolist() == [1, 1, 1, 0, 1, 1, 1, 0]
    for i, pair in enumerate(pairs):
        ids, mask = pair.chosen
        assert batch.tokens[i, : len(ids)].tolist() == ids and batch.loss_mask[i, : len(mask)].tolist() == mask
        ids, mask = pair.rejected
        assert batch.tokens[p + i, : len(ids)].tolist() == ids
    # The learner's interleaved micro-batch split (row b -> b % M) keeps each pair in one micro-batch.
    for m in (1, 2, 4):
        rows = np.arange(2 * p)
        for i in range(p):
            assert rows[i] % m == rows[p + i] % m


@pytest.mark.parametrize("loss", ["dpo", "simpo"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_loss_and_gradient_equal_a_hand_computation(single_mesh, pairs, tok, loss, smoothing):
    policy = _make_model(single_mesh)
    reference = _make_model(single_mesh)
    nnx.update(reference, jax.tree.map(lambda x: x * 0.97, nnx.state(reference, nnx.Param)))
    batch = pair_batch(pairs, pad_id=tok.pad_id, pair_multiple=4)
    logp, ref = _per_token(policy, batch), _per_token(reference, batch)
    mask = np.asarray(batch.loss_mask, np.float64)
    mask[:, 0] = 0.0
    config = PreferenceConfig(loss=loss, beta=0.7, label_smoothing=smoothing, gamma=0.3)

    # By hand, pair by pair.
    p, n = batch.tokens.shape[0] // 2, len(pairs)
    expected_loss, expected_grad, margins, correct = 0.0, np.zeros_like(logp), [], []
    for i in range(n):
        c, r = i, p + i
        if loss == "dpo":
            sc, sr = ((logp[c] - ref[c]) * mask[c]).sum(), ((logp[r] - ref[r]) * mask[r]).sum()
            dc, dr = mask[c], mask[r]
        else:
            sc, sr = (logp[c] * mask[c]).sum() / mask[c].sum(), (logp[r] * mask[r]).sum() / mask[r].sum()
            dc, dr = mask[c] / mask[c].sum(), mask[r] / mask[r].sum()
        z = 0.7 * (sc - sr) - (0.3 if loss == "simpo" else 0.0)
        expected_loss += (-(1 - smoothing) * np.log(_sigmoid(z)) - smoothing * np.log(_sigmoid(-z))) / n
        dz = (-(1 - smoothing) * _sigmoid(-z) + smoothing * _sigmoid(z)) / n  # d loss / d z
        expected_grad[c] += dz * 0.7 * dc
        expected_grad[r] -= dz * 0.7 * dr
        margins.append(0.7 * (sc - sr))
        correct.append(float(sc > sr))

    weights = jnp.asarray(batch.weights)
    ref_in = jnp.asarray(ref, jnp.float32) if loss == "dpo" else None
    got, metrics = preference_loss(jnp.asarray(logp, jnp.float32), ref_in, jnp.asarray(mask), weights, config)
    np.testing.assert_allclose(float(got), expected_loss, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["reward_margin"]), np.mean(margins), rtol=1e-4, atol=1e-5)
    assert float(metrics["accuracy"]) == pytest.approx(np.mean(correct))
    grad = jax.grad(lambda lp: preference_loss(lp, ref_in, jnp.asarray(mask), weights, config)[0])(
        jnp.asarray(logp, jnp.float32)
    )
    np.testing.assert_allclose(np.asarray(grad), expected_grad, atol=1e-6)


def test_gradient_through_the_model_matches_a_finite_difference(single_mesh, pairs, tok):
    model = _make_model(single_mesh)
    batch = pair_batch(pairs, pad_id=tok.pad_id, pair_multiple=2)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens, input_mask = jnp.asarray(batch.tokens), jnp.asarray(batch.input_mask)
    mask = jnp.asarray(batch.loss_mask).at[:, 0].set(0.0)
    ref = forward_logprobs(graphdef, jax.tree.map(lambda x: x * 0.95, params), rest, tokens, input_mask, 1.0)[0]
    config = PreferenceConfig(loss="dpo", beta=0.5)

    def loss_of(p):
        logp = forward_logprobs(graphdef, p, rest, tokens, input_mask, 1.0)[0]
        return preference_loss(logp, ref, mask, jnp.asarray(batch.weights), config)[0]

    grads = jax.grad(loss_of)(params)
    direction = jax.tree.map(lambda x: jax.random.normal(jax.random.key(1), x.shape, x.dtype), params)
    along = sum(jnp.vdot(g, d) for g, d in zip(jax.tree.leaves(grads), jax.tree.leaves(direction), strict=True))
    h = 1e-3
    shifted = lambda s: loss_of(jax.tree.map(lambda x, d: x + s * h * d, params, direction))  # noqa: E731
    finite = (shifted(1.0) - shifted(-1.0)) / (2 * h)
    np.testing.assert_allclose(float(along), float(finite), rtol=2e-2)


def test_jsonl_pairs_share_the_prompt_and_mask_only_assistant_tokens(tmp_path, tok):
    prompt = [{"role": "user", "content": "2+2?"}]
    path = tmp_path / "pairs.jsonl"
    path.write_text(
        json.dumps({"prompt": prompt, "chosen": [{"role": "assistant", "content": "4"}],
                    "rejected": [{"role": "assistant", "content": "5"}]}) + "\n\n"
    )  # fmt: skip
    (pair,) = load_pairs(path, tok)
    shared = len(tok.encode_messages(prompt, add_generation_prompt=True))
    assert pair.chosen[0][:shared] == pair.rejected[0][:shared]
    assert pair.chosen[1][:shared] == [0] * shared and sum(pair.chosen[1]) > 0
    assert Pair.from_dict(json.loads(json.dumps(pair.to_dict()))) == pair
    path.write_text(json.dumps({"chosen": []}) + "\n")
    with pytest.raises(ValueError, match=r"pairs.jsonl:1: expected an object with 'chosen' and 'rejected'"):
        load_pairs(path, tok)


def _episode(task, index, passed, anomaly=None):
    e = EpisodeRecord(1, task, "arithmetic", 0, index, seed=index)
    e.append([1, 2, 3], sampled=False)
    e.append([4 + index, 5], sampled=True)
    e.verification = {"reward": float(passed), "passed": passed, "anomaly": anomaly}
    return e


def test_mined_pairs_pass_against_fail_per_task_without_anomalies():
    episodes = [
        _episode("a", 0, True),
        _episode("a", 1, False, anomaly="sandbox_died"),  # an environment failure: never a rejected
        _episode("a", 2, False),
        _episode("a", 3, True),
        _episode("b", 0, True),  # no failing episode: no pair
        _episode("c", 0, False),
        _episode("c", 1, True),
    ]
    pairs = mine_pairs(episodes)
    assert [(p.source, p.chosen[0][3], p.rejected[0][3]) for p in pairs] == [("a", 4, 6), ("c", 5, 4)]
    assert all(p.chosen[1] == [0, 0, 0, 1, 1] for p in pairs)
    assert len(mine_pairs(episodes * 3, max_pairs_per_task=2)) == 4


def test_pair_data_resumes_exactly_and_config_errors_name_the_field():
    data = PairData([Pair(([i], [1]), ([i + 10], [1])) for i in range(5)], seed=3)
    data.batch(3)
    state = json.loads(json.dumps(data.state()))
    expected = [data.batch(4) for _ in range(3)]
    again = PairData([Pair(([i], [1]), ([i + 10], [1])) for i in range(5)], seed=99)
    again.load_state(state)
    assert [again.batch(4) for _ in range(3)] == expected
    with pytest.raises(ValueError, match=r"PreferenceConfig\.loss"):
        PreferenceConfig(loss="ipo")
    with pytest.raises(ValueError, match=r"PreferenceConfig\.beta"):
        PreferenceConfig(beta=0)
    with pytest.raises(ValueError, match="no preference pairs"):
        PairData([])


def test_the_learner_trains_pairs_keeps_its_reference_and_splits_pairs_exactly(single_mesh, pairs, tok):
    from rl.learning.learner import Learner, LearnerConfig

    def run(microbatches: int, loss: str = "dpo"):
        model = _make_model(single_mesh)
        config = LearnerConfig(
            objective="preference", learning_rate=3e-3, total_steps=10, microbatches=microbatches,
            preference=PreferenceConfig(loss=loss, beta=0.5),
        )  # fmt: skip
        learner = Learner(model, single_mesh, config)
        batch = pair_batch(pairs, pad_id=tok.pad_id, pair_multiple=learner.batch_multiple)
        history = [learner.train_step(batch) for _ in range(4)]
        return learner, history

    learner, history = run(1)
    assert set(learner.state()) == {"params", "opt_state", "step", "ref_params"}
    assert history[0]["train/loss"] == pytest.approx(np.log(2.0), abs=1e-6)  # policy == reference at start
    assert history[0]["train/reward_margin"] == pytest.approx(0.0, abs=1e-6)
    assert history[-1]["train/loss"] < history[0]["train/loss"] and history[-1]["train/accuracy"] == 1.0
    split, history2 = run(2)
    for a, b in zip(history, history2, strict=True):
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4, abs=1e-6)
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)
    a, b = nnx.state(learner.model, nnx.Param), nnx.state(split.model, nnx.Param)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):  # Adam magnifies float rounding
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-4)
    simpo, history3 = run(1, "simpo")
    assert "ref_params" not in simpo.state() and history3[-1]["train/loss"] < history3[0]["train/loss"]
