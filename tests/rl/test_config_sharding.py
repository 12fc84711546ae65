"""Model presets and validation, mesh construction, logical-axis rules, distributed detection."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, PartitionSpec

from rl.models import PRESETS, ModelConfig, Transformer, get_model_config, sharding
from rl.models.config import RopeScaling
from rl.run.distributed import distributed_requested

# Published parameter counts of the real checkpoints (embeddings included).
PUBLISHED = {
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-7b": 7_615_616_512,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3.1-8b": 8_030_261_248,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_have_the_real_shapes(name):
    assert get_model_config(name).num_params == PUBLISHED[name]


@pytest.mark.parametrize("name", ["tiny", "qwen2.5-0.5b", "llama-3.2-1b"])
def test_abstract_model_matches_the_count(name):
    config = get_model_config(name)
    _, state = sharding.abstract_model(lambda: Transformer(config, nnx.Rngs(0)))
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(state)) == config.num_params


def test_tiny_preset_is_cpu_sized():
    config = get_model_config("tiny")
    assert 400_000 <= config.num_params <= 1_000_000 and config.num_layers == 2
    assert set(PRESETS) >= {"tiny", *PUBLISHED}
    assert get_model_config("Qwen2.5-0.5B", dtype="float32").dtype == "float32"


def test_config_errors_name_the_field():
    base = get_model_config("tiny")
    with pytest.raises(ValueError, match=r"ModelConfig\.num_kv_heads"):
        base.replace(num_kv_heads=3)
    with pytest.raises(ValueError, match=r"ModelConfig\.hidden_size"):
        base.replace(hidden_size=0)
    with pytest.raises(ValueError, match=r"ModelConfig\.dtype"):
        base.replace(dtype="float8")
    with pytest.raises(ValueError, match=r"ModelConfig\.head_dim"):
        base.replace(head_dim=33)
    with pytest.raises(ValueError, match=r"ModelConfig\.initializer_range"):
        base.replace(initializer_range=0.0)
    with pytest.raises(ValueError, match=r"RopeScaling\.factor"):
        RopeScaling(factor=0.5)
    with pytest.raises(KeyError, match=r"unknown model preset 'gpt-5'.*tiny"):
        get_model_config("gpt-5")
    assert isinstance(hash(base), int)  # frozen and hashable: usable as a static jit argument


def test_initializer_range_sets_the_weights_spread():
    """Every weight matrix and the embedding start normal with ``initializer_range`` as std."""
    names = {"embed", "q", "k", "v", "o", "gate", "up", "down"}
    for std in (0.02, 0.088):
        model = Transformer(get_model_config("tiny", initializer_range=std), nnx.Rngs(0))
        weights = [(p, v) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param)) if p[-1] in names]
        assert len(weights) == 1 + 2 * 7  # the embedding; q k v o gate up down in each of 2 layers
        for path, w in weights:
            assert abs(float(np.std(np.asarray(w[...]))) - std) < 0.1 * std, path


def test_make_mesh_resolves_the_rest_and_uses_auto_axes():
    mesh = sharding.make_mesh({"data": 2, "fsdp": -1, "tensor": 2})
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert all(t == AxisType.Auto for t in mesh.axis_types)
    assert dict(sharding.make_mesh(sharding.ShardingConfig()).shape) == {"data": 1, "fsdp": 8, "tensor": 1}
    with pytest.raises(ValueError, match="does not divide the 8 devices"):
        sharding.make_mesh({"data": 3, "fsdp": -1})
    with pytest.raises(ValueError, match="uses 4 devices but 8 are available"):
        sharding.make_mesh({"data": 4})
    with pytest.raises(ValueError, match=r"mesh_shape\['tensor'\]"):
        sharding.ShardingConfig(mesh_shape={"tensor": 0})
    with pytest.raises(ValueError, match="unknown axes"):
        sharding.ShardingConfig(mesh_shape={"model": 2})
    with pytest.raises(ValueError, match=r"rules\['embed'\]: unknown mesh axes"):
        sharding.ShardingConfig(rules=(("embed", "pipeline"),))


def test_logical_rules_map_divide_and_use_each_axis_once():
    sizes = {"data": 2, "fsdp": 2, "tensor": 2}
    rules = sharding.DEFAULT_RULES
    spec = sharding.logical_to_spec(("batch", "seq", "embed"), rules, (8, 5, 64), sizes)
    assert spec == PartitionSpec(("data", "fsdp"))  # embed's fsdp is taken by batch already
    assert sharding.logical_to_spec(("embed", "mlp"), rules, (64, 128), sizes) == PartitionSpec("fsdp", "tensor")
    # 3 KV heads do not split over tensor=2: replicated instead of failing.
    assert sharding.logical_to_spec(("embed", "kv_heads", "head_dim"), rules, (64, 3, 16), sizes) == PartitionSpec(
        "fsdp"
    )
    # A batch of 2 keeps the leading axis that divides it.
    assert sharding.logical_to_spec(("batch",), rules, (2,), sizes) == PartitionSpec("data")
    custom = (("embed", ("fsdp", "tensor")), ("mlp", None))
    assert sharding.logical_to_spec(("embed", "mlp"), custom, (64, 128), sizes) == PartitionSpec(("fsdp", "tensor"))


def test_a_7b_model_is_planned_sharded_without_allocating():
    """Shardings come from the abstract model; each device would hold 1/8 of the weights."""
    config = get_model_config("qwen2.5-7b")
    mesh = sharding.make_mesh({"fsdp": 4, "tensor": 2})
    _, state = sharding.abstract_model(lambda: Transformer(config, nnx.Rngs(0)))
    shardings = sharding.state_shardings(state, mesh)
    per_device = sum(
        math.prod(s.shard_shape(x.shape))
        for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(shardings), strict=True)
    )
    assert per_device <= config.num_params / 8 * 1.01


def test_created_model_is_sharded_and_deterministic():
    config = get_model_config("tiny")
    mesh = sharding.make_mesh({"fsdp": 4, "tensor": 2})
    model = sharding.create_sharded_model(lambda: Transformer(config, nnx.Rngs(3)), mesh)
    gate = model.layers[1].mlp.gate[...]
    assert gate.sharding.spec == PartitionSpec("fsdp", "tensor")
    assert gate.addressable_shards[0].data.shape == (128 // 4, 384 // 2)
    plain = Transformer(config, nnx.Rngs(3))
    # Same random bits as an eager build (jit may round the normal transform 1 ulp differently).
    np.testing.assert_allclose(np.asarray(gate), np.asarray(plain.layers[1].mlp.gate[...]), rtol=1e-6, atol=1e-8)


def test_distributed_is_requested_only_by_the_environment():
    assert not distributed_requested({})
    assert not distributed_requested({"SLURM_NTASKS": "1", "SLURM_JOB_ID": "7"})
    assert distributed_requested({"SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"})
    assert distributed_requested({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"})
    assert distributed_requested({"TPU_WORKER_HOSTNAMES": "a,b"})
    assert not distributed_requested({"TPU_WORKER_HOSTNAMES": "a"})
    assert not distributed_requested({"AGENTRL_DISTRIBUTED": "0", "OMPI_COMM_WORLD_SIZE": "8"})
    with pytest.raises(ValueError, match="AGENTRL_DISTRIBUTED"):
        distributed_requested({"AGENTRL_DISTRIBUTED": "yes"})


def test_model_config_is_a_plain_frozen_dataclass():
    config = get_model_config("tiny")
    with pytest.raises(AttributeError):
        config.num_layers = 3  # type: ignore[misc]
    assert isinstance(config, ModelConfig)
