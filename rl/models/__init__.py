"""Llama / Qwen2-family policy models: configs and presets, the NNX transformer, sharding, Hugging Face I/O."""

from rl.models.config import PRESETS, ModelConfig, RopeScaling, get_model_config
from rl.models.transformer import KVCache, Transformer

__all__ = ["PRESETS", "KVCache", "ModelConfig", "RopeScaling", "Transformer", "get_model_config"]
