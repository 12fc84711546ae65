"""Logit parity with `transformers`, sharded == unsharded, save/reload round trips, loader errors."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from flax import nnx

from rl.models import hf, sharding
from rl.models.hf import CheckpointError
from tests.conftest import import_or_skip

torch = import_or_skip("torch")
transformers = import_or_skip("transformers")

MESH_SHAPES = [{"data": 8}, {"fsdp": 4, "tensor": 2}, {"data": 2, "fsdp": 2, "tensor": 2}]


def _reference_logits(torch_model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return torch_model(torch.tensor(ids, dtype=torch.long)).logits.float().numpy()


@nnx.jit
def _forward(model, ids):
    return model(ids)[0]


def _logits(model, ids, mesh) -> np.ndarray:
    with jax.set_mesh(mesh):
        return np.asarray(_forward(model, jnp.asarray(ids)))


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_logits_match_transformers(hf_checkpoints, single_mesh, token_ids, kind):
    path, torch_model = hf_checkpoints[kind]
    model = hf.load_hf_model(path, mesh=single_mesh, dtype="float32")
    assert model.config.architecture == kind
    assert model.config.tie_embeddings == (kind == "qwen2")
    np.testing.assert_array_less(
        np.abs(_logits(model, token_ids, single_mesh) - _reference_logits(torch_model, token_ids)), 1e-4
    )


def test_padding_mask_and_positions_match_unpadded_rows(hf_checkpoints, single_mesh, token_ids):
    """A left-padded row with shifted positions gives the logits of the same row alone."""
    path, torch_model = hf_checkpoints["qwen2"]
    model = hf.load_hf_model(path, mesh=single_mesh)
    short = token_ids[:1, :10]
    padded = np.concatenate([np.zeros((1, 6), np.int32), short], axis=1)
    positions = np.maximum(np.arange(16) - 6, 0)[None]
    logits, _ = model(jnp.asarray(padded), jnp.asarray(positions), jnp.asarray(positions > 0) | (np.arange(16) == 6))
    reference = _reference_logits(torch_model, short)
    np.testing.assert_array_less(np.abs(np.asarray(logits)[:, 6:] - reference), 1e-4)


@pytest.mark.parametrize("shape", MESH_SHAPES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_sharded_equals_unsharded(hf_checkpoints, single_mesh, token_ids, shape):
    path, _ = hf_checkpoints["llama"]
    unsharded = _logits(hf.load_hf_model(path, mesh=single_mesh), token_ids, single_mesh)
    mesh = sharding.make_mesh(shape)
    model = hf.load_hf_model(path, mesh=mesh)
    # Parameters really are split as the rules say, not replicated.
    q = model.layers[0].attn.q[...]
    expected = sharding.logical_to_spec(
        ("embed", "q_heads", "head_dim"), sharding.DEFAULT_RULES, q.shape, dict(mesh.shape)
    )
    assert q.sharding.spec == expected
    if shape.get("tensor", 1) > 1:
        assert q.addressable_shards[0].data.shape[1] == q.shape[1] // shape["tensor"]
    batch = np.concatenate([token_ids] * 4)  # 8 rows: splits over data/fsdp
    np.testing.assert_allclose(_logits(model, batch, mesh), np.concatenate([unsharded] * 4), atol=2e-5, rtol=0)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_save_then_transformers_reload(hf_checkpoints, single_mesh, token_ids, tmp_path, kind):
    path, torch_model = hf_checkpoints[kind]
    model = hf.load_hf_model(path, mesh=single_mesh)
    out = tmp_path / "saved"
    hf.save_hf_model(model, out, max_shard_bytes=40_000)  # force several shards + an index
    assert (out / "model.safetensors.index.json").exists()
    cls = transformers.Qwen2ForCausalLM if kind == "qwen2" else transformers.LlamaForCausalLM
    reloaded = cls.from_pretrained(out)
    np.testing.assert_allclose(
        _reference_logits(reloaded, token_ids), _reference_logits(torch_model, token_ids), atol=1e-5, rtol=0
    )
    # ... and back into ours, sharded this time.
    mesh = sharding.make_mesh({"fsdp": 2, "tensor": 4})
    again = hf.load_hf_model(out, mesh=mesh)
    for (p1, a), (p2, b) in zip(nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(again)), strict=True):
        assert p1 == p2
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()))


def test_bfloat16_checkpoint_loads(hf_checkpoints, single_mesh, token_ids, tmp_path):
    path, torch_model = hf_checkpoints["qwen2"]
    bf16 = type(torch_model).from_pretrained(path, dtype=torch.bfloat16)
    bf16.save_pretrained(tmp_path / "bf16")
    model = hf.load_hf_model(tmp_path / "bf16", mesh=single_mesh)
    assert model.config.param_dtype == "bfloat16"
    assert model.embed[...].dtype == jnp.bfloat16
    f32 = hf.load_hf_model(tmp_path / "bf16", mesh=single_mesh, dtype="float32")
    # bf16 weights, f32 compute: close to the f32 reference up to the weights' rounding.
    ref = _reference_logits(torch_model, token_ids)
    assert np.abs(_logits(f32, token_ids, single_mesh) - ref).max() < 0.1


def test_config_from_hf_reads_both_rope_conventions(hf_checkpoints):
    path, _ = hf_checkpoints["llama"]
    raw = json.loads((path / "config.json").read_text())
    v5 = hf.config_from_hf(raw)
    legacy = {k: v for k, v in raw.items() if k != "rope_parameters"}
    legacy.update(
        rope_theta=500000.0, rope_scaling={k: v for k, v in raw["rope_parameters"].items() if k != "rope_theta"}
    )
    assert hf.config_from_hf(legacy) == v5
    assert v5.rope_scaling is not None and v5.rope_scaling.factor == 8.0 and v5.rope_theta == 500000.0
    assert hf.config_from_hf(hf.config_to_hf(v5)) == v5


def test_loader_errors_name_the_problem(hf_checkpoints, tmp_path):
    path, _ = hf_checkpoints["qwen2"]
    with pytest.raises(CheckpointError, match="not a directory"):
        hf.load_hf_model(tmp_path / "nope")
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    (bad / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json is missing"):
        hf.load_hf_model(bad)
    shutil.copy(path / "config.json", bad / "config.json")
    config = json.loads((path / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(CheckpointError, match="model_type 'gpt2'"):
        hf.load_hf_model(bad)
    (bad / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    with pytest.raises(CheckpointError, match=r"mlp\.gate_proj\.weight.*\(64, 160\).*\(64, 96\)"):
        hf.load_hf_model(bad)
    (bad / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(CheckpointError, match=r"model\.layers\.2\..* is missing"):
        hf.load_hf_model(bad)
    (bad / "config.json").write_text(json.dumps(config))
    for f in bad.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        hf.load_hf_model(bad)


def test_tied_config_with_its_own_lm_head_matches_transformers(hf_checkpoints, single_mesh, token_ids, tmp_path):
    """``tie_word_embeddings: true`` beside a different ``lm_head.weight``: transformers keeps them apart."""
    path, _ = hf_checkpoints["llama"]  # untied, with a random lm_head
    tied = tmp_path / "tied"
    shutil.copytree(path, tied)
    config = json.loads((tied / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    reference = transformers.LlamaForCausalLM.from_pretrained(tied)
    model = hf.load_hf_model(tied, mesh=single_mesh, dtype="float32")
    assert not model.config.tie_embeddings
    np.testing.assert_array_less(
        np.abs(_logits(model, token_ids, single_mesh) - _reference_logits(reference, token_ids)), 1e-4
    )


def test_tied_config_with_an_equal_lm_head_stays_tied(hf_checkpoints, single_mesh, token_ids, tmp_path):
    path, torch_model = hf_checkpoints["qwen2"]  # tied: save_pretrained writes no lm_head.weight
    both = tmp_path / "both"
    shutil.copytree(path, both)
    tensors = safetensors.numpy.load_file(both / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    safetensors.numpy.save_file(tensors, both / "model.safetensors", metadata={"format": "pt"})
    model = hf.load_hf_model(both, mesh=single_mesh, dtype="float32")
    assert model.config.tie_embeddings
    np.testing.assert_array_less(
        np.abs(_logits(model, token_ids, single_mesh) - _reference_logits(torch_model, token_ids)), 1e-4
    )


def test_llama3_rope_without_original_max_positions_matches_transformers(single_mesh, token_ids, tmp_path):
    """transformers falls back to ``max_position_embeddings`` (128 here), not Llama 3.1's 8192."""
    torch.manual_seed(2)
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    config = transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rope_theta=500000.0,
        rope_scaling=dict(rope), initializer_range=0.1, tie_word_embeddings=False,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    for key in ("rope_parameters", "rope_scaling"):  # save_pretrained filled the fallback in: take it out again
        if isinstance(raw.get(key), dict):
            raw[key].pop("original_max_position_embeddings", None)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    reference = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert reference.config.rope_parameters["original_max_position_embeddings"] == 128
    model = hf.load_hf_model(tmp_path, mesh=single_mesh, dtype="float32")
    assert model.config.rope_scaling.original_max_position_embeddings == 128
    np.testing.assert_array_less(
        np.abs(_logits(model, token_ids, single_mesh) - _reference_logits(reference, token_ids)), 1e-4
    )
