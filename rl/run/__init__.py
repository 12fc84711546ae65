"""One experiment, end to end: the parts built from its settings, the loop, and what it writes.

  - :mod:`rl.run.experiment`: ``build()``: mesh, model, tokenizer, sampler, sandbox pool, rollout.
  - :mod:`rl.run.preflight`: before step 1, a sandbox and a gold episode per domain.
  - :mod:`rl.run.trainer`: the loop (``Trainer``) over the run's phases, evaluation, checkpoints.
  - :mod:`rl.run.metrics`, :mod:`rl.run.checkpoint`: what a run writes (metrics need no JAX);
    :mod:`rl.run.console`: log lines above the progress bar, printed once.
  - :mod:`rl.run.distributed` and :mod:`rl.run.job_guard`: multi-process jobs, one fate for all
    their processes; :mod:`rl.run.replay`: re-running an episode.

Settings live in :mod:`rl.config`, rollouts in :mod:`rl.rollout`, the phases in :mod:`rl.phases`.
Modules are imported explicitly and this file imports none of them: :mod:`rl.results` reads
``trajectory``, ``metrics`` and ``config_file`` without JAX.
"""
