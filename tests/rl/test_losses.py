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
    with pytest.raises(ValueError, match=r"PolicyLossConfig\.name: expected one of \['ppo_clip'\]"):
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
