"""One experiment, end to end: settings, the parts built from them, the loop, and what it writes.

  - :mod:`rl.run.settings`: the config read and checked once into frozen ``Settings``.
  - :mod:`rl.run.task_stream`: each task source loaded once (``TaskCatalog``); the training stream.
  - :mod:`rl.run.experiment`: ``build()``: mesh, model, tokenizer, sampler, sandbox pool, rollout.
  - :mod:`rl.run.rollout`: multi-turn group rollouts against the environments, in lock step.
  - :mod:`rl.run.engine_rollout`: the same episodes moving independently: turns on the decode
    engine (KV cache kept across turns), resets and tool steps through the sandbox scheduler.
  - :mod:`rl.run.producer`: asynchronous RL: the next steps sampled while the learner updates
    (``loop.max_staleness``), with exact resume.
  - :mod:`rl.run.episodes`: a rollout's episodes into advantages, a training batch and metrics.
  - :mod:`rl.run.evaluation`: held-out evaluation (``Evaluator``), for the loop and the CLI.
  - :mod:`rl.run.trainer`: the loop (``Trainer``): SFT then RL steps, evaluation, checkpoints.
  - :mod:`rl.run.trajectory`, :mod:`rl.run.metrics`, :mod:`rl.run.checkpoint`,
    :mod:`rl.run.config_file`: what a run writes (the first, second and last need no JAX).
  - :mod:`rl.run.distributed`: multi-host start-up; :mod:`rl.run.replay`: re-running an episode.

Modules are imported explicitly and this file imports none of them: :mod:`rl.results` reads
``trajectory``, ``metrics`` and ``config_file`` without JAX.
"""
