"""LoRA: an adapted model starts as its base, only adapters train (and only they have optimizer state),
sampler and engine run the adapted forward, merged checkpoints load in ``transformers``, adapter files
round-trip, and one config field turns it on."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import common, quickstart
from rl.config.settings import ConfigError, load_settings
from rl.generation.engine import DecodeEngine
from rl.generation.engine_config import EngineConfig
from rl.generation.sampler import Sampler, SamplerConfig, SamplingParams
from rl.generation.tokenizer import ByteTokenizer
from rl.learning.batch import TrainBatch
from rl.learning.learner import Learner, LearnerConfig
from rl.models import Transformer, get_model_config, hf, sharding
from rl.models.lora import (
    LoRAConfig,
    LoRAParam,
    apply_lora,
    has_lora,
    load_adapters,
    merge_lora,
    read_adapter_config,
    save_adapters,
)
from rl.run.experiment import make_model
from tests.conftest import import_or_skip
from tests.rl.learner_probe import sft_step
from tests.rl.test_sampler import _make_model

MODEL = get_model_config("tiny")
LORA = LoRAConfig(rank=4, alpha=8.0)
B, T = 4, 32


def _host(tree):
    return jax.tree.map(np.asarray, tree)


def _randomise_adapters(model, seed: int = 0, std: float = 0.05) -> None:
    """Nonzero ``A`` and ``B`` (``B`` starts at zero, which would hide every bug downstream)."""
    state = nnx.state(model, LoRAParam)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [
        jax.device_put(x + std * jax.random.normal(k, x.shape, x.dtype), x.sharding)
        for x, k in zip(leaves, keys, strict=True)
    ]
    nnx.update(model, jax.tree.unflatten(treedef, noisy))


def _batch() -> TrainBatch:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, (B, T)).astype(np.int32)
    input_mask = np.ones((B, T), bool)
    loss_mask = np.zeros((B, T), np.float32)
    loss_mask[:, 8:] = 1.0
    zeros = np.zeros((B, T), np.float32)
    return TrainBatch(tokens, input_mask, loss_mask, zeros, np.ones((B,), np.float32), np.ones((B,), np.float32))


# -- the adapted forward ---------------------------------------------------------------------------
def test_adapted_model_equals_base_at_init_and_merge_equals_adapted():
    model = Transformer(MODEL, nnx.Rngs(0))
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 24)), jnp.int32)
    base = np.asarray(model(ids)[0])
    apply_lora(model, LORA)
    assert has_lora(model)
    np.testing.assert_array_equal(np.asarray(model(ids)[0]), base)  # B = 0: exactly the base model
    _randomise_adapters(model)
    adapted = np.asarray(model(ids)[0])
    assert np.abs(adapted - base).max() > 1e-2
    merged = merge_lora(model)
    assert not has_lora(merged) and has_lora(model)
    np.testing.assert_allclose(np.asarray(merged(ids)[0]), adapted, atol=1e-5, rtol=0)
    # Only the targeted weights were replaced; the rest are shared, not copied.
    assert merged.embed[...] is model.embed[...]


def test_adapters_carry_logical_axes_and_respect_targets():
    model = apply_lora(Transformer(MODEL, nnx.Rngs(0)), LoRAConfig(rank=2, target_modules=("q", "down")))
    flat = dict(nnx.to_flat_state(nnx.state(model, LoRAParam)))
    assert {p[4] for p in flat} == {"q", "down"}
    assert flat["layers", 0, "attn", "lora", "q", "a"].get_metadata()["out_sharding"] == ("embed", "lora_rank")
    assert flat["layers", 0, "attn", "lora", "q", "b"].get_metadata()["out_sharding"] == (
        "lora_rank",
        "q_heads",
        "head_dim",
    )
    assert flat["layers", 0, "mlp", "lora", "down", "a"].shape == (MODEL.intermediate_size, 2)


@pytest.mark.parametrize(
    ("field", "value"), [("rank", 0), ("alpha", -1.0), ("dropout", 1.0), ("target_modules", ("q_proj",))]
)
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"LoRAConfig\.{field}: expected"):
        LoRAConfig(**{field: value})


def test_dropout_only_in_the_training_view():
    model = apply_lora(Transformer(MODEL, nnx.Rngs(0)), LoRAConfig(rank=4, dropout=0.5))
    _randomise_adapters(model)
    ids = jnp.arange(16, dtype=jnp.int32)[None]
    first, second = np.asarray(model(ids)[0]), np.asarray(model(ids)[0])
    np.testing.assert_array_equal(first, second)  # the module itself (sampler, engine) never drops
    train = nnx.view(model, only=nnx.Dropout, deterministic=False)
    assert np.abs(np.asarray(train(ids)[0]) - first).max() > 1e-3


# -- the learner -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lora_learner(single_mesh):
    model = sharding.create_sharded_model(lambda: Transformer(MODEL, nnx.Rngs(0)), single_mesh)
    apply_lora(model, LORA, mesh=single_mesh)
    config = LearnerConfig(objective="sft", learning_rate=1e-2, total_steps=10, trainable="lora")
    return Learner(model, single_mesh, config)


def test_only_adapters_train_and_have_optimizer_state(lora_learner):
    learner, model = lora_learner, lora_learner.model
    adapters = _host(nnx.state(model, LoRAParam))
    base = _host(nnx.state(model, nnx.Not(LoRAParam)))
    adapter_leaves = jax.tree.leaves(adapters)
    adapter_size = sum(x.size for x in adapter_leaves)
    # Optimizer state: AdamW's mu and nu of the adapters, plus scalar counters; nothing of the base.
    opt_leaves = [x for x in jax.tree.leaves(learner.state()["opt_state"]) if x.ndim > 0]
    assert len(opt_leaves) == 2 * len(adapter_leaves)
    assert sum(x.size for x in opt_leaves) == 2 * adapter_size
    assert sum(x.size for x in jax.tree.leaves(learner.state()["params"])) == adapter_size
    assert adapter_size < MODEL.num_params // 5
    losses = [sft_step(learner, _batch())["train/loss"] for _ in range(3)]
    assert losses[-1] < losses[0], losses
    after_base = _host(nnx.state(model, nnx.Not(LoRAParam)))
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(base), jax.tree.leaves(after_base), strict=True):
        np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))  # bit-for-bit
    after = _host(nnx.state(model, LoRAParam))
    assert all(np.abs(a - b).max() > 0 for a, b in zip(adapter_leaves, jax.tree.leaves(after), strict=True))


def test_lora_learner_needs_adapters(single_mesh):
    with pytest.raises(ValueError, match=r"trainable='lora' needs a model with adapters"):
        Learner(Transformer(MODEL, nnx.Rngs(0)), single_mesh, LearnerConfig(trainable="lora"))
    with pytest.raises(ValueError, match=r"LearnerConfig\.trainable: expected one of"):
        LearnerConfig(trainable="adapters")


def test_dropout_learner_steps_and_keeps_the_sampler_deterministic(single_mesh):
    model = apply_lora(Transformer(MODEL, nnx.Rngs(0)), LoRAConfig(rank=4, dropout=0.3), mesh=single_mesh)
    learner = Learner(model, single_mesh, LearnerConfig(objective="sft", learning_rate=1e-2, trainable="lora"))
    metrics = [sft_step(learner, _batch()) for _ in range(2)]
    assert all(np.isfinite(m["train/loss"]) for m in metrics)
    ids = jnp.arange(16, dtype=jnp.int32)[None]
    np.testing.assert_array_equal(np.asarray(model(ids)[0]), np.asarray(model(ids)[0]))


# -- sampler and decode engine ---------------------------------------------------------------------
def test_sampler_and_engine_run_the_adapted_model_like_its_merge(single_mesh):
    tok = ByteTokenizer()
    adapted = apply_lora(_make_model(single_mesh), LORA, mesh=single_mesh)
    _randomise_adapters(adapted, std=0.1)
    merged = merge_lora(adapted)
    prompts = [tok.encode(t) for t in ["Hello, world", "The quick brown fox", "a", "2+2="]]
    params = [SamplingParams(temperature=t, max_new_tokens=12) for t in (0.0, 1.0, 0.7, 1.0)]
    seeds = [1, 2, 3, 4]
    buckets = SamplerConfig(batch_buckets=(4,), prompt_buckets=(32,), new_token_buckets=(16,))
    expected = Sampler(merged, tok, single_mesh, buckets).generate(prompts, params, seeds=seeds)
    got = Sampler(adapted, tok, single_mesh, buckets).generate(prompts, params, seeds=seeds)
    engine = DecodeEngine(
        adapted, tok, single_mesh, EngineConfig(slots=4, max_len=64, prefill_buckets=(32,), window_min=64)
    )
    for i, (p, s, seed) in enumerate(zip(prompts, params, seeds, strict=True)):
        engine.add(i, p, s, seed)
    from_engine = {}
    while not engine.idle:
        from_engine.update(dict(engine.step()))
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        for c in (g, from_engine[i]):
            assert c.token_ids == e.token_ids
            np.testing.assert_allclose(c.raw_logprobs, e.raw_logprobs, atol=1e-5, rtol=0)
    # The adapters do change the policy (the test would be vacuous otherwise).
    base = apply_lora(_make_model(single_mesh), LORA, mesh=single_mesh)
    plain = Sampler(base, tok, single_mesh, buckets).generate(prompts, params, seeds=seeds)
    assert any(
        np.abs(np.subtract(a.raw_logprobs[:3], b.raw_logprobs[:3])).max() > 1e-3
        for a, b in zip(plain, got, strict=True)
    )


# -- checkpoints -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_merged_checkpoint_loads_in_transformers(hf_checkpoints, single_mesh, token_ids, tmp_path, kind):
    torch = import_or_skip("torch")
    transformers = import_or_skip("transformers")
    path, _ = hf_checkpoints[kind]
    model = apply_lora(hf.load_hf_model(path, mesh=single_mesh, dtype="float32"), LORA, mesh=single_mesh)
    _randomise_adapters(model, std=0.1)
    ours = np.asarray(model(jnp.asarray(token_ids))[0])
    hf.save_merged_hf_model(model, tmp_path / "merged")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", torch_dtype=torch.float32)
    with torch.no_grad():
        theirs = reloaded(torch.tensor(token_ids, dtype=torch.long)).logits.float().numpy()
    np.testing.assert_array_less(np.abs(ours - theirs), 1e-4)
    base = np.asarray(hf.load_hf_model(path, mesh=single_mesh, dtype="float32")(jnp.asarray(token_ids))[0])
    assert np.abs(ours - base).max() > 1e-2  # the merged weights are not the base weights


def test_adapter_file_round_trip(single_mesh, tmp_path):
    config = LoRAConfig(rank=3, alpha=6.0, target_modules=("q", "v", "up"))
    model = apply_lora(Transformer(MODEL, nnx.Rngs(0)), config, mesh=single_mesh)
    _randomise_adapters(model)
    file = save_adapters(model, tmp_path, config)
    assert file.stat().st_size < 4 * sum(x.size for x in jax.tree.leaves(nnx.state(model, LoRAParam))) + 8192
    assert read_adapter_config(tmp_path) == config
    fresh = apply_lora(Transformer(MODEL, nnx.Rngs(0)), read_adapter_config(tmp_path), mesh=single_mesh)
    load_adapters(fresh, tmp_path)
    for x, y in zip(
        jax.tree.leaves(nnx.state(model, LoRAParam)), jax.tree.leaves(nnx.state(fresh, LoRAParam)), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    ids = jnp.arange(12, dtype=jnp.int32)[None]
    np.testing.assert_array_equal(np.asarray(fresh(ids)[0]), np.asarray(model(ids)[0]))
    other = apply_lora(Transformer(MODEL, nnx.Rngs(0)), LoRAConfig(rank=3, target_modules=("q",)))
    with pytest.raises(ValueError, match=r"adapter tensors differ from the model's"):
        load_adapters(other, tmp_path)


# -- config -------------------------------------------------------------------------------------------
def test_one_config_field_turns_lora_on(single_mesh):
    config = quickstart.get_config("test")
    config.model.lora = common.lora(8, alpha=16.0, target_modules=("q", "v"))
    settings = load_settings(config)
    assert settings.model.lora == LoRAConfig(rank=8, alpha=16.0, target_modules=("q", "v"))
    assert {c.trainable for c in settings.learners.values()} == {"lora"}
    model = make_model(settings.model, settings.seed, single_mesh)
    assert has_lora(model)
    assert {p[4] for p, _ in nnx.to_flat_state(nnx.state(model, LoRAParam))} == {"q", "v"}
    config.model.lora.rank = 0
    with pytest.raises(ConfigError, match=r"config\.model\.lora\.rank: expected an int >= 1"):
        load_settings(config)
    off = load_settings(quickstart.get_config("test"))
    assert off.model.lora is None and {c.trainable for c in off.learners.values()} == {"all"}
