"""Losses and advantage estimators against hand-computed values, plus a gradient check."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.learning import advantages, losses

jax.config.update("jax_enable_x64", False)


def test_grpo_advantages_by_hand():
    rewards = jnp.array([[1.0, 0.0, 0.0, 1.0]])
    valid = jnp.ones_like(rewards, dtype=bool)
    # mean 0.5, unbiased std sqrt(1/3)
    expected = (np.array([1, 0, 0, 1]) - 0.5) / np.sqrt(1 / 3)
    np.testing.assert_allclose(advantages.grpo_advantages(rewards, valid)[0], expected, rtol=1e-5)


def test_anomalies_are_excluded_from_group_stats():
    rewards = jnp.array([[1.0, 0.0, 123.0]])  # the third is an anomaly: its reward is meaningless
    valid = jnp.array([[True, True, False]])
    adv = advantages.grpo_advantages(rewards, valid)[0]
    np.testing.assert_allclose(adv[:2], [0.5 / np.sqrt(0.5), -0.5 / np.sqrt(0.5)], rtol=1e-5)
    assert adv[2] == 0.0


def test_groups_with_fewer_than_two_valid_episodes_get_no_signal():
    rewards = jnp.array([[1.0, 0.0], [1.0, 1.0]])
    valid = jnp.array([[True, False], [True, True]])
    group_estimators = {n: e for n, e in advantages.ESTIMATORS.items() if e.min_valid >= 2}
    assert set(group_estimators) == {"grpo", "dr_grpo", "rloo"}
    for name, estimator in group_estimators.items():
        adv = estimator.fn(rewards, valid)
        assert float(jnp.abs(adv[0]).sum()) == 0.0, name


def test_batch_estimator_uses_every_valid_episode_of_the_batch():
    rewards = np.array([[1.0, 0.0], [1.0, 9.0]], np.float32)
    valid = np.array([[True, False], [True, True]])
    adv = advantages.ESTIMATORS["batch"].fn(rewards, valid)
    flat = np.array([1.0, 1.0, 9.0], np.float32)  # the anomaly's reward is no sample
    expected = (rewards - flat.mean()) / (flat.std() + 1e-6)
    np.testing.assert_allclose(adv, np.where(valid, expected, 0.0), rtol=1e-6)
    result = advantages.group_advantages(rewards, valid, estimator="batch")
    assert result.kept.tolist() == [True, True]  # one valid episode is enough for a batch baseline
    with pytest.raises(ValueError, match=r"algorithm\.advantage: expected one of .*'rloo'"):
        advantages.group_advantages(rewards, valid, estimator="gae")


def test_policy_losses_are_chosen_by_name():
    assert losses.POLICY_LOSSES["ppo_clip"] is losses.ppo_clip_loss
    assert losses.POLICY_LOSSES["gspo"] is losses.gspo_loss
    with pytest.raises(ValueError, match=r"PolicyLossConfig\.name: expected one of \['gspo', 'ppo_clip'\]"):
        losses.PolicyLossConfig(name="reinforce")


def test_dr_grpo_and_rloo_by_hand():
    rewards = jnp.array([[3.0, 1.0, 2.0]])
    valid = jnp.ones_like(rewards, dtype=bool)
    np.testing.assert_allclose(advantages.dr_grpo_advantages(rewards, valid)[0], [1.0, -1.0, 0.0])
    # RLOO: 3 - mean(1,2)=1.5 ; 1 - mean(3,2)=-1.5 ; 2 - mean(3,1)=0
    np.testing.assert_allclose(advantages.rloo_advantages(rewards, valid)[0], [1.5, -1.5, 0.0])


def test_informative_groups():
    rewards = jnp.array([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 1.0, 5.0]])
    valid = jnp.array([[True] * 3, [True] * 3, [True, False, False]])
    assert advantages.informative_groups(rewards, valid).tolist() == [False, True, False]


def test_aggregations_by_hand():
    x = jnp.array([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert float(losses.token_mean(x, mask)) == pytest.approx(10 / 4)
    assert float(losses.sequence_mean(x, mask)) == pytest.approx((2.0 + 4.0) / 2)
    assert float(losses.constant_normalizer(x, mask, 8)) == pytest.approx(10 / (2 * 8))


def test_policy_loss_clipping_by_hand():
    old = jnp.log(jnp.array([[0.5, 0.5]]))
    new = jnp.log(jnp.array([[0.8, 0.3]]))  # ratios 1.6 and 0.6
    mask = jnp.ones((1, 2))
    cfg = losses.PolicyLossConfig(clip_low=0.2, clip_high=0.28)
    loss, m = losses.ppo_clip_loss(new, old, jnp.array([1.0]), mask, cfg)
    # A>0: min(1.6, 1.28) = 1.28 ; min(0.6, 0.8) = 0.6 -> loss = -(1.28 + 0.6) / 2
    assert float(loss) == pytest.approx(-(1.28 + 0.6) / 2, rel=1e-5)
    assert float(m["clip_fraction"]) == pytest.approx(1.0)
    loss, _ = losses.ppo_clip_loss(new, old, jnp.array([-1.0]), mask, cfg)
    # A<0: -min(-1.6, -1.28) = 1.6 ; -min(-0.6, -0.8) = 0.8
    assert float(loss) == pytest.approx((1.6 + 0.8) / 2, rel=1e-5)


def test_kl_k3_and_entropy_terms():
    lp = jnp.log(jnp.array([[0.5, 0.25]]))
    ref = jnp.log(jnp.array([[0.25, 0.25]]))
    k3 = losses.kl_k3(lp, ref)
    np.testing.assert_allclose(k3[0], [0.5 - np.log(0.5) - 1, 0.0], atol=1e-6)
    cfg = losses.PolicyLossConfig(kl_coef=0.1, entropy_coef=0.01)
    mask = jnp.ones((1, 2))
    loss, m = losses.ppo_clip_loss(
        lp, lp, jnp.array([0.0]), mask, cfg, ref_logprobs=ref, entropy=jnp.array([[1.0, 3.0]])
    )
    assert float(m["pg_loss"]) == pytest.approx(0.0, abs=1e-7)
    assert float(loss) == pytest.approx(0.1 * float(k3.mean()) - 0.01 * 2.0, rel=1e-5)


def test_masked_tokens_do_not_affect_the_loss_or_its_gradient():
    key = jax.random.PRNGKey(0)
    new = jax.random.normal(key, (2, 5)) * 0.1 - 1.0
    old = new + 0.05
    mask = jnp.array([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], jnp.float32)
    adv = jnp.array([1.0, -0.5])
    cfg = losses.PolicyLossConfig()

    def f(lp):
        return losses.ppo_clip_loss(lp, old, adv, mask, cfg)[0]

    g = jax.grad(f)(new)
    assert np.all(np.asarray(g)[np.asarray(mask) == 0] == 0.0)
    garbage = new.at[:, 3:].set(100.0)  # observation tokens: any value
    assert float(f(garbage)) == pytest.approx(float(f(new)))


def test_gradient_matches_finite_differences():
    key = jax.random.PRNGKey(1)
    lp = jax.random.normal(key, (3, 4)) * 0.1 - 1.0
    old = lp + 0.03 * jax.random.normal(jax.random.PRNGKey(2), (3, 4))
    ref = lp - 0.1
    mask = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], jnp.float32)
    adv = jnp.array([0.7, -1.2, 0.4])
    for agg in losses.AGGREGATIONS:
        cfg = losses.PolicyLossConfig(kl_coef=0.05, aggregation=agg, clip_high=0.5)

        def f(x, cfg=cfg):
            return losses.ppo_clip_loss(x, old, adv, mask, cfg, ref_logprobs=ref)[0]

        with jax.enable_x64(True):
            x64 = lp.astype(jnp.float64)
            g = np.asarray(jax.grad(f)(x64))
            eps = 1e-6
            for i, j in [(0, 0), (1, 1), (2, 3)]:
                e = jnp.zeros_like(x64).at[i, j].set(eps)
                fd = (f(x64 + e) - f(x64 - e)) / (2 * eps)
                assert g[i, j] == pytest.approx(float(fd), rel=1e-4, abs=1e-8), (agg, i, j)


def test_sft_loss_and_token_logprobs():
    logits = jnp.log(jnp.array([[[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]]))
    targets = jnp.array([[0, 2]])
    lp, ent = losses.token_logprobs_and_entropy(logits, targets)
    np.testing.assert_allclose(lp[0], np.log([0.7, 0.8]), rtol=1e-5)
    p = np.array([0.7, 0.2, 0.1])
    assert float(ent[0, 0]) == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-5)
    loss, _ = losses.sft_loss(lp, jnp.array([[1.0, 0.0]]))
    assert float(loss) == pytest.approx(-np.log(0.7), rel=1e-5)


@pytest.mark.parametrize(("field", "value"), [("clip_low", -0.1), ("kl_coef", -1.0), ("aggregation", "median")])
def test_bad_loss_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        losses.PolicyLossConfig(**{field: value})


def test_sequence_mean_counts_packed_segments_one_by_one():
    x = jnp.array([[1.0, 2.0, 3.0, 5.0], [4.0, 0.0, 0.0, 0.0]])
    mask = jnp.array([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    segments = jnp.array([[1, 1, 2, 2], [1, 0, 0, 0]])  # row 0 holds two sequences
    assert float(losses.sequence_mean(x, mask, segment_ids=segments)) == pytest.approx((1.5 + 4.0 + 4.0) / 3)
    assert float(losses.count_sequences(mask, segments)) == 3.0
    assert float(losses.count_sequences(mask)) == 2.0


# -- GSPO --------------------------------------------------------------------------
# Row 0: one sequence, 3 sampled tokens. Row 1: two packed sequences, 2 and 4 sampled tokens.
GSPO_SEGMENTS = np.array([[1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 2, 2, 2, 2, 2]], np.int32)
GSPO_MASK = np.array([[0, 1, 1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 1, 1, 1, 1]], np.float32)
GSPO_ADV = np.array([[0.8] * 8, [-0.5] * 3 + [1.2] * 5], np.float32)  # per token, as pack() writes it
GSPO_SEQS = [(0, 1), (1, 1), (1, 2)]  # (row, segment)


def _gspo_inputs():
    rng = np.random.default_rng(3)
    old = (-1.0 - rng.random((2, 8))).astype(np.float32)
    new = old + np.float32(0.02) * rng.standard_normal((2, 8)).astype(np.float32)
    new[1, 4:] += 0.3  # the long sequence's ratio leaves the clip range (and its advantage is > 0)
    new[GSPO_MASK == 0] = 50.0  # prompt / padding hold garbage: it must not matter
    return new, old


def _gspo_by_hand(new, old, clip_low, clip_high, aggregation):
    """(loss, d loss / d new, clipped token fraction) in numpy, one sequence at a time."""
    losses_, lengths, grads_, clipped = [], [], [], []
    for row, seg in GSPO_SEQS:
        on = (GSPO_SEGMENTS[row] == seg) & (GSPO_MASK[row] > 0)
        n, a = on.sum(), GSPO_ADV[row, on][0]
        s = np.exp((new[row, on] - old[row, on]).mean())
        c = np.clip(s, 1 - clip_low, 1 + clip_high)
        losses_.append(-min(s * a, c * a))
        lengths.append(n)
        unclipped = s * a <= c * a  # the min takes the ratio's own term: it has a gradient
        g = np.zeros((2, 8))
        g[row, on] = -a * s / n if unclipped else 0.0
        grads_.append(g)
        clipped.append(float(s != c))
    w = np.ones(3) / 3 if aggregation == "sequence" else np.array(lengths) / sum(lengths)
    loss = float(np.dot(w, losses_))
    grad = sum(wi * g for wi, g in zip(w, grads_, strict=True))
    return loss, grad, float(np.dot(np.array(lengths) / sum(lengths), clipped))


@pytest.mark.parametrize("aggregation", ["sequence", "token"])
def test_gspo_loss_and_gradient_by_hand(aggregation):
    new, old = _gspo_inputs()
    cfg = losses.PolicyLossConfig(name="gspo", clip_low=0.1, clip_high=0.15, aggregation=aggregation)
    want_loss, want_grad, want_clip = _gspo_by_hand(new, old, 0.1, 0.15, aggregation)
    assert 0.0 < want_clip < 1.0  # one sequence clipped, the others not: both branches are checked

    def f(lp):
        return losses.gspo_loss(lp, jnp.asarray(old), jnp.asarray(GSPO_ADV), jnp.asarray(GSPO_MASK), cfg,
                                segment_ids=jnp.asarray(GSPO_SEGMENTS))  # fmt: skip

    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(new))
    assert float(loss) == pytest.approx(want_loss, rel=1e-5)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-5, atol=1e-7)
    assert float(metrics["clip_fraction"]) == pytest.approx(want_clip, rel=1e-6)
    assert float(metrics["pg_loss"]) == pytest.approx(want_loss, rel=1e-5)


def test_gspo_packed_row_equals_one_sequence_per_row():
    """The packed row's two segments are two sequences: the same loss, metrics and gradient as unpacked."""
    new, old = _gspo_inputs()
    ref = old - 0.1
    unpacked = {}
    for name, x in (("new", new), ("old", old), ("ref", ref), ("adv", GSPO_ADV), ("mask", GSPO_MASK)):
        rows = [np.where(GSPO_SEGMENTS[r] == k, x[r], 0.0 if name != "new" else 50.0) for r, k in GSPO_SEQS]
        unpacked[name] = jnp.asarray(np.stack(rows).astype(np.float32))
    cfg = losses.PolicyLossConfig(name="gspo", clip_low=0.1, clip_high=0.15, aggregation="sequence", kl_coef=0.1)

    def f(lp, old, adv, mask, ref, segment_ids):
        return losses.gspo_loss(lp, old, adv, mask, cfg, ref_logprobs=ref, segment_ids=segment_ids)

    packed = jax.value_and_grad(f, has_aux=True)(
        *map(jnp.asarray, (new, old, GSPO_ADV, GSPO_MASK, ref)), jnp.asarray(GSPO_SEGMENTS)
    )
    flat = jax.value_and_grad(f, has_aux=True)(
        unpacked["new"], unpacked["old"], unpacked["adv"], unpacked["mask"], unpacked["ref"], None
    )
    for key in packed[0][1]:
        assert float(packed[0][1][key]) == pytest.approx(float(flat[0][1][key]), rel=1e-5, abs=1e-7), key
    flat_grad = np.asarray(flat[1])
    for i, (r, k) in enumerate(GSPO_SEQS):
        here = GSPO_SEGMENTS[r] == k
        np.testing.assert_allclose(np.asarray(packed[1])[r, here], flat_grad[i, here], rtol=1e-5, atol=1e-8)


def test_gspo_on_policy_ratio_is_one_and_gradient_is_the_sequence_mean():
    """At ``new == old`` every ratio is 1: nothing is clipped and each token gets ``-A_i / (|y_i| * n_seq)``."""
    _, old = _gspo_inputs()
    cfg = losses.PolicyLossConfig(name="gspo", clip_low=3e-4, clip_high=4e-4, aggregation="sequence")
    adv, mask, seg = jnp.asarray(GSPO_ADV), jnp.asarray(GSPO_MASK), jnp.asarray(GSPO_SEGMENTS)
    (loss, metrics), grad = jax.value_and_grad(
        lambda lp: losses.gspo_loss(lp, jnp.asarray(old), adv, mask, cfg, segment_ids=seg), has_aux=True
    )(jnp.asarray(old))
    assert float(metrics["clip_fraction"]) == 0.0 and float(metrics["ratio_mean"]) == pytest.approx(1.0)
    assert float(loss) == pytest.approx(-(0.8 - 0.5 + 1.2) / 3, rel=1e-6)
    assert float(grad[1, 4]) == pytest.approx(-1.2 / (4 * 3), rel=1e-6)
    assert float(grad[0, 1]) == pytest.approx(-0.8 / (3 * 3), rel=1e-6)


def test_gspo_trains_packed_rows_like_unpacked_and_splits_into_microbatches(single_mesh):
    """Through the learner: packing and micro-batches leave a GSPO update unchanged."""
    import dataclasses

    from flax import nnx

    from rl.learning.batch import pack
    from rl.learning.learner import Learner, LearnerConfig
    from rl.models import Transformer, get_model_config

    rng = np.random.default_rng(4)
    lengths = [40, 12, 25, 9, 30, 17]
    seqs = [list(rng.integers(0, 256, n)) for n in lengths]
    masks = [[0] * (n // 3) + [1] * (n - n // 3) for n in lengths]
    old = [[float(-rng.random()) * m for m in mask] for mask in masks]
    adv = list(rng.normal(size=len(lengths)))
    kw = {"pad_id": 263, "length_buckets": (64,), "batch_buckets": None}
    flat, packed = pack(seqs, masks, old, adv, **kw), pack(seqs, masks, old, adv, pack_sequences=True, **kw)
    assert packed.shape[0] < flat.shape[0]
    model_config = get_model_config("tiny", num_layers=1)
    loss = losses.PolicyLossConfig(name="gspo", clip_low=0.02, clip_high=0.03, aggregation="sequence", kl_coef=0.0)
    config = LearnerConfig(learning_rate=1e-3, total_steps=10, eps=1e-5, loss=loss)
    learners = {
        m: Learner(Transformer(model_config, nnx.Rngs(0)), single_mesh, dataclasses.replace(config, microbatches=m))
        for m in (1, 2)
    }
    start = jax.tree.map(np.asarray, learners[1].state())
    results = []
    for batch, microbatches in ((flat, 1), (packed, 1), (flat, 2)):
        learners[microbatches].load_state(start)
        metrics = learners[microbatches].train_step(batch)
        results.append((metrics, jax.tree.map(np.asarray, learners[microbatches].state()["params"])))
    (want, want_params), *others = results
    assert want["train/clip_fraction"] > 0  # the sampler's log-probs are not the policy's: some clipping
    for got, params in others:
        for key in ("train/loss", "train/pg_loss", "train/clip_fraction", "train/ratio_mean"):
            assert got[key] == pytest.approx(want[key], rel=1e-4), key
        for a, b in zip(jax.tree.leaves(want_params), jax.tree.leaves(params), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6)
