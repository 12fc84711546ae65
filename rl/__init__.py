"""agentrl's policy side: JAX/Flax models, generation, learning and the experiment loop.

Read it top down; each package imports only the ones listed before it (and ``envs``):

  - :mod:`rl.models`: ``ModelConfig`` presets, the NNX ``Transformer``, sharding (meshes,
    logical-axis rules, models created sharded), Hugging Face weights and GGUF files.
  - :mod:`rl.generation`: chat format, tokenizers, token selection and the batched ``Sampler``.
  - :mod:`rl.learning`: advantage estimators, losses, batches, the pure train step, the
    ``Learner`` and SFT data.
  - :mod:`rl.config`: ``Settings``: the config read and checked once, before anything starts.
  - :mod:`rl.rollout`: task streams, rollouts (decode engine, lock-step, multi-process) and the
    episodes they return, scored into training batches.
  - :mod:`rl.phases`: SFT's stopping check, the preference and reward-model phases, a learned
    reward, held-out evaluation.
  - :mod:`rl.run`: one experiment: ``build()``, the ``Trainer`` loop, preflight, and what a run
    writes (metrics, checkpoints), multi-process jobs.
  - :mod:`rl.results`: a finished (or live) run read back as tables, without JAX.

The commands: ``python -m rl.train`` (:mod:`rl.train`), ``python -m rl.evaluate``
(:mod:`rl.evaluate`), ``python -m rl.export`` (:mod:`rl.export`) and ``python -m rl.replay`` (:mod:`rl.replay`).

Modules are imported explicitly (``from rl.generation.sampler import Sampler``) rather than
re-exported here, so that importing a light module (e.g. :mod:`rl.generation.tokenizer` or
:mod:`rl.results`, which need no JAX) does not pay for the rest.
"""
