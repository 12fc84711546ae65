"""agentrl's JAX side: models, sharding, tokenizer, sampler, losses, learner and the train loop.

Modules are imported explicitly (``from rl import sampler``) rather than re-exported here, so
that importing one light module (e.g. :mod:`rl.tokenizer`, which needs no JAX) does not pay for
compiling or importing the rest.

Map of the policy side:
  - :mod:`rl.models`: ``ModelConfig`` presets, the Flax NNX ``Transformer`` and Hugging Face I/O.
  - :mod:`rl.sharding`: mesh from config, logical-axis rules, models created already sharded.
  - :mod:`rl.distributed`: ``jax.distributed.initialize()`` when the environment asks for it.
  - :mod:`rl.tokenizer` and :mod:`rl.chat_format`: byte-level / HF tokenizers and the ChatML +
    Hermes tool-call format, encodable turn by turn.
  - :mod:`rl.sampler`: jitted, bucketed, batch-invariant generation with per-token log-probs.
"""
