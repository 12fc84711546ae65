"""DPO against TRL's own: the same loss, gradient and reward metrics on the same log-probs.

TRL (a test-only reference, the ``hf`` extra) computes DPO inside ``DPOTrainer._compute_loss``
from a model's per-token log-probs. The model here is a stand-in returning fixed log-probs, so
both implementations see identical inputs; ``preference_loss`` is then checked value for value.
"""

from __future__ import annotations

import collections
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from trl import DPOTrainer

from rl.learning.preference import PreferenceConfig, preference_loss

P, T = 3, 12


def _inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-token log-probs of policy and reference ``[2P, T]`` (column 0 predicts nothing) and a
    completion mask of different lengths per row (chosen rows first)."""
    rng = np.random.default_rng(0)
    logp = -rng.uniform(0.1, 3.0, (2 * P, T)).astype(np.float32)
    ref = (logp + rng.normal(0, 0.3, logp.shape)).astype(np.float32)
    mask = np.zeros((2 * P, T), np.float32)
    for row, start in enumerate((4, 5, 3, 4, 6, 2)):
        mask[row, start : T - row % 3] = 1.0
    logp[:, 0] = ref[:, 0] = 0.0
    return logp, ref, mask


def _trl_loss(logp: torch.Tensor, ref: np.ndarray, mask: np.ndarray, beta: float) -> tuple[torch.Tensor, dict]:
    """TRL's DPO (``loss_type="sigmoid"``) on these log-probs: its trainer's loss with a model that
    returns them (TRL's ``log_probs[:, t]`` is our column ``t + 1``, already masked)."""
    shifted = logp[:, 1:] * torch.from_numpy(mask[:, 1:])
    zeros = torch.zeros_like(shifted)

    def model(**kwargs: object) -> types.SimpleNamespace:
        return types.SimpleNamespace(log_probs=shifted, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())

    model.training = True
    ref_sums = torch.from_numpy((ref[:, 1:] * mask[:, 1:]).sum(1))
    metrics = collections.defaultdict(lambda: collections.defaultdict(list))
    trainer = types.SimpleNamespace(
        model=model, accelerator=types.SimpleNamespace(device="cpu", gather=lambda x: x, gather_for_metrics=lambda x: x),
        aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True, f_divergence_type="reverse_kl",
        loss_types=["sigmoid"], loss_weights=[1.0], beta=beta, label_smoothing=0.0, use_weighting=False,
        _metrics=metrics, _total_train_tokens=0, _tp_size=1,
    )  # fmt: skip
    inputs = {
        "input_ids": torch.zeros((2 * P, T), dtype=torch.long),
        "attention_mask": torch.ones((2 * P, T), dtype=torch.long),
        "completion_mask": torch.from_numpy(mask).long(),
        "ref_chosen_logps": ref_sums[:P],
        "ref_rejected_logps": ref_sums[P:],
    }
    loss = DPOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)
    return loss, {k: v[-1] for k, v in metrics["train"].items()}


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_loss_gradient_and_rewards_equal_trl(beta):
    logp, ref, mask = _inputs()
    torch_logp = torch.from_numpy(logp).requires_grad_(True)
    trl_loss, trl_metrics = _trl_loss(torch_logp, ref, mask, beta)
    trl_loss.backward()

    config = PreferenceConfig(loss="dpo", beta=beta)
    ours = lambda lp: preference_loss(lp, jnp.asarray(ref), jnp.asarray(mask), jnp.ones(2 * P), config)  # noqa: E731
    (loss, metrics), grad = jax.value_and_grad(ours, has_aux=True)(jnp.asarray(logp))

    assert float(loss) == pytest.approx(trl_loss.item(), rel=1e-6)
    np.testing.assert_allclose(np.asarray(grad)[:, 1:], torch_logp.grad.numpy()[:, 1:], rtol=1e-5, atol=1e-7)
    assert np.abs(np.asarray(grad)).max() > 1e-3  # a real gradient, on the masked tokens only
    assert float(metrics["reward_margin"]) == pytest.approx(trl_metrics["rewards/margins"], rel=1e-5)
    assert float(metrics["accuracy"]) == pytest.approx(trl_metrics["rewards/accuracies"])
    assert float(metrics["chosen_reward"]) == pytest.approx(trl_metrics["rewards/chosen"], rel=1e-5)
    assert 0.0 < trl_metrics["rewards/accuracies"] < 1.0  # the pairs disagree: the comparison has teeth
