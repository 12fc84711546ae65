"""Shared fixtures for the policy tests: small random Hugging Face checkpoints and meshes.

Checkpoints are built with ``transformers`` from a config (no download) once per session and
saved with ``save_pretrained``; the tests then load them with our own loader.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rl.models import sharding

VOCAB = 300


def _randomise(model) -> None:
    """Non-trivial norms and biases (HF initialises them to 1 / 0, which would hide mapping bugs)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name or "norm" in name:
                p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=gen))


def build_hf_checkpoint(kind: str, path) -> object:
    """A small random Qwen2 (tied, QKV bias) or Llama (untied, GQA 4:1, Llama-3 RoPE) model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0 if kind == "qwen2" else 1)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2, initializer_range=0.1)
    if kind == "qwen2":
        config = Qwen2Config(
            **common, num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, tie_word_embeddings=True
        )
        model = Qwen2ForCausalLM(config)
    else:
        config = LlamaConfig(
            **common,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=16,
            tie_word_embeddings=False,
            max_position_embeddings=4096,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            rope_theta=500000.0,
        )
        model = LlamaForCausalLM(config)
    _randomise(model)
    model.eval()
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """{'qwen2': (path, torch model), 'llama': (path, torch model)}."""
    root = tmp_path_factory.mktemp("hf")
    return {kind: (root / kind, build_hf_checkpoint(kind, root / kind)) for kind in ("qwen2", "llama")}


@pytest.fixture(scope="session")
def single_mesh():
    return sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])


@pytest.fixture(scope="session")
def token_ids():
    return np.random.default_rng(0).integers(0, VOCAB, size=(2, 24)).astype(np.int32)
