"""From episodes to parameter updates: advantages, batches, losses and the learner.

  - :mod:`rl.learning.advantages`: the advantage-estimator registry (GRPO, Dr. GRPO, RLOO, batch).
  - :mod:`rl.learning.batch`: ``TrainBatch`` and packing trajectories into static shapes.
  - :mod:`rl.learning.losses`: the policy-loss registry (PPO-clip), aggregations, KL, SFT loss.
  - :mod:`rl.learning.learner_config`: ``LearnerConfig``, the settings both sides of a step read.
  - :mod:`rl.learning.train_step`: the pure step (forward, loss, accumulated gradients, AdamW).
  - :mod:`rl.learning.learner`: its host side (``Learner``: shardings, placement, state).
  - :mod:`rl.learning.sft`: conversations into token-exact SFT sequences, and their datasets.

Modules are imported explicitly; this file imports none of them.
"""
