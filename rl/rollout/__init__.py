"""Rollouts: tasks in, scored episodes out, as the learner and the notebooks see them.

  - :mod:`rl.rollout.task_stream`: each task source loaded once (``TaskCatalog``); the training stream.
  - :mod:`rl.rollout.engine_rollout`: the default runner: episodes moving independently, turns on the
    decode engine (KV cache kept across turns), resets and tool steps through the sandbox scheduler;
    :mod:`rl.rollout.admission`: episodes that hold a sandbox start only while the pool has one.
  - :mod:`rl.rollout.episode_driver`: what every rollout does with an episode (``EpisodeDriver``: record,
    reset, turn settings, step, end), the runner protocol (``RolloutRunner``) and the shared types.
  - :mod:`rl.rollout.lockstep`: the lock-step group rollout (``rollout.engine=False``), a driver's runner;
    :mod:`rl.rollout.split`: a rollout shared among the processes of a job.
  - :mod:`rl.rollout.producer`: asynchronous RL: the next steps sampled while the learner updates
    (``loop.max_staleness`` > 0; at 0 the trainer samples inline, with no thread), with exact resume.
  - :mod:`rl.rollout.episodes`: a rollout's episodes into advantages, a training batch and metrics.
  - :mod:`rl.rollout.trajectory`: episodes and their on-disk format (no JAX: :mod:`rl.results` reads it).

The lock-step rollout stays a user option (``rollout.engine=False``): it is the plain reference the
engine rollout is checked against and the simplest path to read; a run builds its ``Sampler`` only
when it takes that path, so the default engine run holds no idle sampler.

Modules are imported explicitly and this file imports none of them.
"""
