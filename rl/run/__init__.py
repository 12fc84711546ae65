"""One experiment, end to end: settings, the parts built from them, the loop, and what it writes.

  - :mod:`rl.run.settings`: the config read and checked once into frozen ``Settings``;
    :mod:`rl.run.config_errors` (``ConfigError`` and the checks, a leaf module) and
    :mod:`rl.run.registry_checks` (``rollout.env_kwargs`` and ``sft.options`` against their registries).
  - :mod:`rl.run.task_stream`: each task source loaded once (``TaskCatalog``); the training stream.
  - :mod:`rl.run.experiment`: ``build()``: mesh, model, tokenizer, sampler, sandbox pool, rollout.
  - :mod:`rl.run.preflight`: before step 1, a sandbox and a gold episode per domain.
  - :mod:`rl.run.engine_rollout`: the default rollout: episodes moving independently, turns on the
    decode engine (KV cache kept across turns), resets and tool steps through the sandbox scheduler.
  - :mod:`rl.run.rollout`: the lock-step group rollout (``rollout.engine=False``) and the shared types;
    :mod:`rl.run.split_rollout`: a rollout shared among the processes of a job.
  - :mod:`rl.run.producer`: asynchronous RL: the next steps sampled while the learner updates
    (``loop.max_staleness`` > 0; at 0 the trainer samples inline, with no thread), with exact resume.
  - :mod:`rl.run.episodes`: a rollout's episodes into advantages, a training batch and metrics.
  - :mod:`rl.run.evaluation`: held-out evaluation (``Evaluator``), for the loop and the CLI.
  - :mod:`rl.run.trainer`: the loop (``Trainer``): SFT, preference and RL steps, evaluation, checkpoints;
    the phases' own parts: :mod:`rl.run.sft_check`, :mod:`rl.run.preference_phase`,
    :mod:`rl.run.reward_model_phase`, :mod:`rl.run.learned_reward`.
  - :mod:`rl.run.trajectory`, :mod:`rl.run.metrics`, :mod:`rl.run.checkpoint`,
    :mod:`rl.run.config_file`: what a run writes (the first, second and last need no JAX).
  - :mod:`rl.run.distributed` and :mod:`rl.run.job_guard`: multi-process jobs, one fate for all
    their processes; :mod:`rl.run.replay`: re-running an episode.

Modules are imported explicitly and this file imports none of them: :mod:`rl.results` reads
``trajectory``, ``metrics`` and ``config_file`` without JAX.
"""
