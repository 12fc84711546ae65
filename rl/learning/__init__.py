"""From episodes to parameter updates: advantages, batches, losses and the learner.

  - :mod:`rl.learning.advantages`: the advantage-estimator registry (GRPO, Dr. GRPO, RLOO, batch).
  - :mod:`rl.learning.batch`: ``TrainBatch`` and packing trajectories into static shapes.
  - :mod:`rl.learning.losses`: the policy-loss registry (PPO-clip), aggregations, KL, SFT loss.
  - :mod:`rl.learning.learner_config`: ``LearnerConfig``, the settings both sides of a step read.
  - :mod:`rl.learning.train_step`: the pure step (forward, loss, accumulated gradients, AdamW).
  - :mod:`rl.learning.learner`: its host side (``Learner``: shardings, placement, state).
  - :mod:`rl.learning.sft`: conversations into token-exact SFT sequences, and their datasets.
  - :mod:`rl.learning.lm_head`: log-probs and entropies of target tokens, a chunk of positions at a time.
  - :mod:`rl.learning.trained_state`: what every learner holds on the host (variables, AdamW state,
    shardings) and checkpoints.
  - :mod:`rl.learning.preference`: DPO / SimPO losses and preference pairs.
  - :mod:`rl.learning.reward_model` and :mod:`rl.learning.reward_learner`: a Bradley-Terry reward
    model (the backbone with a scalar head) and its learner.

Modules are imported explicitly; this file imports none of them.
"""
