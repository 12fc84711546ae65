"""Llama / Qwen2-family policy models: configs and presets, the NNX transformer, sharding, Hugging Face I/O.

  - :mod:`rl.models.config`: ``ModelConfig`` (shapes and numerics, checked on construction) and presets.
  - :mod:`rl.models.transformer`: the NNX decoder (``Transformer``).
  - :mod:`rl.models.kv_cache`: its KV caches: ``KVCache`` (the sampler's batch), ``SlotCache`` (the engine's slots).
  - :mod:`rl.models.causal_attention`: training attention in query blocks that skip the masked upper triangle.
  - :mod:`rl.models.rope`: rotary position embedding, as the Hugging Face reference computes it.
  - :mod:`rl.models.projection`: the weight matmuls, in the compute dtype with float32 accumulation.
  - :mod:`rl.models.lora`: low-rank adapters: attach, merge, save, load.
  - :mod:`rl.models.sharding`: meshes, logical-axis rules, models created in their shardings.
  - :mod:`rl.models.hf`: Hugging Face checkpoints to and from the sharded model, tensor by tensor.
  - :mod:`rl.models.gguf`: GGUF files (llama.cpp's, e.g. the packaged SmolLM2) dequantized into it.

``ModelConfig``, the presets, ``Transformer`` and ``KVCache`` are re-exported here.
"""

from rl.models.config import PRESETS, ModelConfig, RopeScaling, get_model_config
from rl.models.kv_cache import KVCache
from rl.models.transformer import Transformer

__all__ = ["PRESETS", "KVCache", "ModelConfig", "RopeScaling", "Transformer", "get_model_config"]
