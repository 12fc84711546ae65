"""The learned reward model: Bradley-Terry loss and gradient by hand, training, save/load, the accuracy
gate, the ``learned`` verifier weighed with the outcome, the learned-only flag, and
``configs/reward_model.py:test`` through the CLI whose saved judge then rewards a tiny RL run."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from envs import Task, VerifyContext, build_verifier
from envs.episode import Episode
from envs.verifiers.learned import register_scorer, unregister_scorer
from rl.config.settings import ConfigError, load_settings
from rl.learning.learner_config import LearnerConfig
from rl.learning.preference import Pair, PairData, pair_batch
from rl.learning.reward_learner import RewardLearner
from rl.learning.reward_model import (
    RewardHead,
    RewardModel,
    RewardModelInfo,
    bradley_terry_loss,
    load_reward_model,
    read_heldout,
    read_info,
    save_reward_model,
)
from rl.models import Transformer, get_model_config, sharding
from rl.phases.learned_reward import (
    Judge,
    LearnedRewardSettings,
    install_judge,
    judge_metrics,
    learned_only_domains,
    uninstall_judge,
)
from rl.rollout.trajectory import read_step, step_files
from rl.run.metrics import read_metrics, without_timing
from tests.rl.test_train import _assert_resumed, _cli
from tests.sandbox.conftest import backend_or_skip

CONFIG = get_model_config("tiny", hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=2, head_dim=16)
PAD = 0


def _model(seed: int = 0, mesh=None) -> RewardModel:
    if mesh is None:
        return RewardModel(Transformer(CONFIG, rngs=nnx.Rngs(seed)))
    return RewardModel(sharding.create_sharded_model(lambda: Transformer(CONFIG, rngs=nnx.Rngs(seed)), mesh))


def _synthetic_pairs(n: int, rng: np.random.Generator) -> list[Pair]:
    """Easy pairs: the same random prefix, ending in 'A' (chosen) or 'B' (rejected)."""
    out = []
    for _ in range(n):
        prefix = [int(t) for t in rng.integers(97, 123, int(rng.integers(4, 24)))]
        mask = [0] * len(prefix) + [1]
        out.append(Pair(([*prefix, 65], mask), ([*prefix, 66], mask)))
    return out


def _accuracy(learner: RewardLearner, pairs: list[Pair]) -> float:
    scores = learner.scores([p.chosen[0] for p in pairs] + [p.rejected[0] for p in pairs], pad_id=PAD)
    n = len(pairs)
    return float(np.mean((scores[:n] > scores[n:]) + 0.5 * (scores[:n] == scores[n:])))


def _info(accuracy: float, scores: np.ndarray) -> RewardModelInfo:
    return RewardModelInfo(
        model_config=dataclasses.asdict(CONFIG), tokenizer="byte", max_len=64, heldout_accuracy=accuracy,
        heldout_pairs=16, score_mean=float(np.mean(scores)), score_std=float(np.std(scores)),
    )  # fmt: skip


# -- the loss --------------------------------------------------------------------------------------
def test_bradley_terry_loss_and_gradient_match_a_hand_computation():
    model = _model()
    w = np.asarray(jax.random.normal(jax.random.key(1), (CONFIG.hidden_size,)), np.float32)
    model.head.kernel[...] = jnp.asarray(w)
    model.head.bias[...] = jnp.asarray(0.3, jnp.float32)
    rng = np.random.default_rng(0)
    pairs = _synthetic_pairs(3, rng)
    batch = pair_batch(pairs, pad_id=PAD, pair_multiple=4)  # 3 pairs + 1 weight-0 padding pair
    tokens, mask, weights = batch.tokens, batch.input_mask, batch.weights

    # By hand: the final hidden state at each row's last real token, r = h . w + b.
    positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
    hidden = np.asarray(model.backbone.hidden_states(tokens, positions, mask)[0])
    last = mask.sum(1) - 1
    h = hidden[np.arange(len(tokens)), np.maximum(last, 0)].astype(np.float64)
    r = h @ w + 0.3
    p = len(tokens) // 2
    m = r[:3] - r[p : p + 3]  # the three real pairs
    loss = np.mean(np.log1p(np.exp(-m)))
    sig = 1 / (1 + np.exp(-m))
    grad_w = np.mean(-(1 - sig)[:, None] * (h[:3] - h[p : p + 3]), axis=0)

    graphdef, head, rest = nnx.split(model, nnx.All(nnx.Param, nnx.PathContains("head")), ...)

    def loss_of_head(head):
        return bradley_terry_loss(nnx.merge(graphdef, head, rest)(tokens, mask), weights)

    (got, metrics), grads = jax.value_and_grad(loss_of_head, has_aux=True)(head)
    np.testing.assert_allclose(float(got), loss, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grads["head"]["kernel"][...]), grad_w, rtol=1e-4, atol=1e-7)
    assert abs(float(grads["head"]["bias"][...])) < 1e-6  # a shared offset cancels in the difference
    np.testing.assert_allclose(float(metrics["margin"]), m.mean(), rtol=1e-5)
    assert float(metrics["accuracy"]) == pytest.approx(np.mean((m > 0) + 0.5 * (m == 0)))
    # The score reads the last real token: padding after it changes nothing.
    garbled = np.where(mask, tokens, 77)
    real = [0, 1, 2, p, p + 1, p + 2]
    np.testing.assert_allclose(np.asarray(model(garbled, mask))[real], r[real], rtol=1e-5, atol=1e-6)
    # An untrained (zero) head has no opinion: loss log 2, accuracy at chance (ties count half).
    zero, zero_metrics = bradley_terry_loss(jnp.zeros(len(tokens)), jnp.asarray(weights))
    assert float(zero) == pytest.approx(np.log(2)) and float(zero_metrics["accuracy"]) == 0.5


# -- training, files, the gate ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A reward model trained on easy pairs (2 devices, 2 micro-batches), saved; with its held-out pairs."""
    mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "tensor": 1}, devices=jax.devices()[:2])
    rng = np.random.default_rng(0)
    train, heldout = _synthetic_pairs(64, rng), _synthetic_pairs(16, rng)
    config = LearnerConfig(learning_rate=2e-3, total_steps=20, microbatches=2, objective="sft")
    learner = RewardLearner(_model(mesh=mesh), mesh, config)
    before = _accuracy(learner, heldout)
    data = PairData(train, seed=0)
    losses = [
        learner.train_step(pair_batch(data.batch(8), pad_id=PAD, pair_multiple=learner.batch_multiple))["train/loss"]
        for _ in range(20)
    ]
    after = _accuracy(learner, heldout)
    seqs = [p.chosen[0] for p in heldout] + [p.rejected[0] for p in heldout]
    scores = learner.scores(seqs, pad_id=PAD)
    path = save_reward_model(
        learner.model, tmp_path_factory.mktemp("rm") / "reward_model", _info(after, scores), heldout
    )
    return types.SimpleNamespace(learner=learner, before=before, after=after, losses=losses, path=path,
                                 heldout=heldout, seqs=seqs, scores=scores, mesh=mesh)  # fmt: skip


def test_training_on_easy_pairs_raises_heldout_accuracy(trained):
    assert trained.before == 0.5  # the zero head: every score 0
    assert trained.after >= 0.9
    assert trained.losses[0] == pytest.approx(np.log(2), abs=1e-5) and trained.losses[-1] < 0.5 * trained.losses[0]


def test_save_then_load_gives_identical_scores(trained):
    model, info = load_reward_model(trained.path)  # one device: another sharding than the learner's
    assert info == read_info(trained.path) and info.heldout_accuracy == trained.after
    assert read_heldout(trained.path) == trained.heldout
    judge = Judge(model, info, clip=2.0)
    np.testing.assert_array_equal(judge.raw_scores(trained.seqs), trained.scores)
    sharded, _ = load_reward_model(trained.path, trained.mesh)
    np.testing.assert_allclose(Judge(sharded, info, 2.0).raw_scores(trained.seqs), trained.scores, rtol=1e-5)
    # Normalized by the held-out mean / std, clipped to [-2, 2], mapped to [0, 1].
    z, score = judge.bounded(info.score_mean + info.score_std)
    assert z == pytest.approx(1.0) and score == pytest.approx(0.75)
    assert judge.bounded(info.score_mean + 50 * info.score_std)[1] == 1.0
    assert judge.bounded(info.score_mean - 50 * info.score_std)[1] == 0.0


def _settings(path: Path, min_accuracy: float, verifier: dict) -> types.SimpleNamespace:
    rollout = types.SimpleNamespace(env_kwargs={"arithmetic": {"verifier": verifier}})
    return types.SimpleNamespace(learned_reward=LearnedRewardSettings(str(path), min_accuracy), rollout=rollout)


def test_the_accuracy_gate_refuses_a_bad_model(trained, tmp_path):
    model = trained.learner.model
    sabotaged = RewardModel(model.backbone, RewardHead(CONFIG.hidden_size))
    sabotaged.head.kernel[...] = -np.asarray(model.head.kernel[...])  # prefers every rejected sequence
    bad = save_reward_model(sabotaged, tmp_path / "bad", _info(0.0, trained.scores), trained.heldout)
    with pytest.raises(ConfigError) as err:
        install_judge(_settings(bad, 0.75, {"outcome": 1.0, "learned": 0.2}))
    message = str(err.value)
    assert message.startswith("config.learned_reward.min_accuracy:")
    assert "accuracy 0.000" in message and "threshold 0.750" in message and "16 held-out pairs" in message
    judge = install_judge(_settings(trained.path, 0.75, {"outcome": 1.0, "learned": 0.2}))
    try:
        assert judge.measured_accuracy == trained.after
        assert build_verifier({"learned": 1.0}).parts[0].verifier.options["scorer"] == "default"
    finally:
        uninstall_judge(judge)
    with pytest.raises(LookupError, match="no scorer registered"):
        build_verifier({"learned": 1.0})


# -- the verifier and the flag ---------------------------------------------------------------------
def _ctx(answer: str) -> VerifyContext:
    task = Task(id="v/math", domain="math", prompt="2+2?", hidden={"answer": "4"})
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": answer}]
    episode = Episode(env_id="t", task_id=task.id, domain="math", messages=messages, answer=answer, turns=1)
    return VerifyContext(task=task, episode=episode, max_turns=4)


def test_the_learned_component_combines_with_the_outcome_as_weighted():
    seen = []

    def scorer(messages):
        seen.append(messages)
        return {"score": 0.8, "raw": 1.5}

    register_scorer("default", scorer)
    try:
        verifier = build_verifier({"outcome": 1.0, "learned": 0.2}, roles={"outcome": "math_answer"})
        right, wrong = verifier.verify(_ctx("\\boxed{4}")), verifier.verify(_ctx("\\boxed{5}"))
        assert right.components == {"outcome": 1.0, "learned": 0.8} and right.reward == pytest.approx(1.16)
        assert right.passed and not wrong.passed  # the outcome decides passed, not the judge
        assert wrong.reward == pytest.approx(0.16) and right.details["learned"]["details"] == {"raw": 1.5}
        assert seen[0] == [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "\\boxed{4}"}]
        seen[0][1]["content"] = "tampered"  # the scorer holds a copy of the text, not the episode
        assert _ctx("\\boxed{4}").episode.messages[1]["content"] == "\\boxed{4}"
        for broken in (lambda m: 1 / 0, lambda m: float("nan"), lambda m: 1.5, lambda m: "high"):
            register_scorer("default", broken)
            result = verifier.verify(_ctx("\\boxed{4}"))
            assert result.is_anomaly and result.anomaly.startswith("learned: verifier_error") and result.reward == 0
    finally:
        unregister_scorer("default")


def test_a_learned_only_reward_is_flagged(trained, caplog):
    assert learned_only_domains({"a": {"verifier": {"learned": 1.0}}}) == ["a"]
    assert learned_only_domains({"a": {"verifier": {"outcome": 0.0, "learned": {"weight": 0.5}}}}) == ["a"]
    assert learned_only_domains({"a": {"verifier": {"outcome": 1.0, "learned": 0.2}}}) == []
    assert learned_only_domains({"a": {"verifier": {"math_answer": 1.0, "learned": 0.2}}}) == []  # an outcome verifier
    assert learned_only_domains({"a": {"verifier": {"outcome": 1.0}}, "b": {}}) == []
    alone = _settings(trained.path, 0.75, {"learned": 1.0})
    with caplog.at_level(logging.WARNING, logger="rl.phases.learned_reward"):
        judge = install_judge(alone)
    uninstall_judge(judge)
    assert any("LEARNED-ONLY REWARD" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    episode = types.SimpleNamespace(anomaly=None, verification={"components": {"learned": 0.25}})
    assert judge_metrics(alone, [episode]) == {"reward/learned_only": 1.0, "reward/learned_mean": 0.25}
    mixed = _settings(trained.path, 0.75, {"outcome": 1.0, "learned": 0.2})
    assert judge_metrics(mixed, [episode])["reward/learned_only"] == 0.0
    assert judge_metrics(types.SimpleNamespace(learned_reward=None), [episode]) == {}


def test_config_mistakes_name_the_field(trained):
    import configs.quickstart
    import configs.reward_model

    def error(config) -> str:
        with pytest.raises(ConfigError) as err:
            load_settings(config)
        return str(err.value)

    config = configs.reward_model.get_config("test")
    config.loop.steps = 2
    assert error(config).startswith("config.loop.steps: expected 0 in a reward-model run")
    config = configs.reward_model.get_config("test")
    config.reward_model.heldout_fraction = 1.5
    assert error(config).startswith("config.reward_model.heldout_fraction: expected a fraction in (0, 1)")
    config.reward_model.heldout_fraction, config.reward_model.steps_ = 0.25, 1
    assert error(config) == "config.reward_model.steps_: no such field; did you mean steps?"
    config = configs.quickstart.get_config("test")
    config.rollout.env_kwargs = {"arithmetic": {"verifier": {"outcome": 1.0, "learned": 0.2}}}
    assert error(config).startswith("config.rollout.env_kwargs.arithmetic.verifier: a 'learned' part needs a judge")
    config.learned_reward = {"path": str(trained.path.parent / "nowhere"), "min_accuracy": 0.75, "clip": 3.0}
    assert error(config).startswith("config.learned_reward.path: expected a reward model saved by")
    config.learned_reward.update({"path": str(trained.path), "min_accuracy": 1.5})
    assert error(config).startswith("config.learned_reward.min_accuracy: expected a fraction in (0, 1]")
    config.learned_reward.min_accuracy = 0.75
    assert load_settings(config).learned_reward == LearnedRewardSettings(str(trained.path), 0.75, 3.0)


# -- end to end --------------------------------------------------------------------------------------
RM_CONFIG = "configs/reward_model.py:test"


@pytest.fixture(scope="module")
def rm_run(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("rm_runs") / "full"
    proc = _cli("rl.train", f"--config={RM_CONFIG}", f"--workdir={workdir}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return workdir


@pytest.mark.slow
def test_reward_model_config_trains_saves_and_resumes_via_the_cli(rm_run, tmp_path):
    metrics = read_metrics(rm_run)
    assert [m["phase"] for m in metrics] == ["reward_model"] * 4
    assert (
        metrics[0]["rm/loss"] == pytest.approx(np.log(2), abs=1e-5) and metrics[-1]["rm/loss"] < metrics[0]["rm/loss"]
    )
    assert "rm/heldout_accuracy" in metrics[1] and "rm/heldout_accuracy" not in metrics[2]
    info = read_info(rm_run / "reward_model")
    assert info.heldout_accuracy == metrics[-1]["rm/heldout_accuracy"] and info.heldout_pairs == 8
    assert info.train_pairs == 24 and info.score_std == pytest.approx(metrics[-1]["rm/score_std"])
    resumed = tmp_path / "resumed"  # killed after checkpoint 2: the same batches, the same judge
    shutil.copytree(rm_run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "4")
    shutil.rmtree(resumed / "reward_model")
    proc = _cli("rl.train", f"--config={RM_CONFIG}", f"--workdir={resumed}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    _assert_resumed(proc, 2)
    assert without_timing(read_metrics(resumed)) == without_timing(metrics)
    assert read_info(resumed / "reward_model") == info


JUDGED_RL = """
from configs import common, quickstart


def get_config(arg=None):
    config = quickstart.get_config("test")
    config.sft.steps = 0
    config.loop.steps = 1
    config.eval = common.evaluation({{}})
    config.learned_reward = common.learned_reward({path!r}, min_accuracy=0.75)
    config.rollout.env_kwargs = {{"arithmetic": {{"verifier": {{"outcome": 1.0, "learned": 0.2}}}}}}
    return config
"""


@pytest.mark.slow
def test_the_saved_judge_rewards_an_rl_run_with_the_outcome(rm_run, tmp_path):
    backend_or_skip("bwrap")
    config = tmp_path / "judged_rl.py"
    config.write_text(JUDGED_RL.format(path=str(rm_run)))
    workdir = tmp_path / "rl"
    proc = _cli("rl.train", f"--config={config}", f"--workdir={workdir}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "passes its check" in proc.stdout + proc.stderr
    metrics = {m["step"]: m for m in read_metrics(workdir) if m.get("phase") == "rl"}
    assert sorted(metrics) == [1] and all(m["reward/learned_only"] == 0.0 for m in metrics.values())
    learned = []
    for step, path in step_files(workdir):
        scores = []
        for e in read_step(path, arrays=False):
            v = e["verification"]
            if v["anomaly"] is None:
                parts = v["components"]
                assert 0.0 <= parts["learned"] <= 1.0
                assert v["reward"] == pytest.approx(parts["outcome"] + 0.2 * parts["learned"])
                scores.append(parts["learned"])
        assert metrics[step]["reward/learned_mean"] == pytest.approx(np.mean(scores))
        learned += scores
    assert len(learned) >= 6 and len(set(learned)) > 1  # the judge tells transcripts apart
