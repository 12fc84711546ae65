"""The phases of a run (each a ``Phase``: its steps, learner and checkpoint keys), and held-out evaluation.

  - :mod:`rl.phases.phase`: the interface the trainer loops over.
  - :mod:`rl.phases.sft`: the SFT warm start; :mod:`rl.phases.sft_data`: the SFT conversations a config
    names (a domain's demonstrations, or JSONL).
  - :mod:`rl.phases.sft_check`: ending the SFT warm start when the skill has arrived.
  - :mod:`rl.phases.rl_phase`: RL steps: sampled episodes, advantages, the policy update;
    :mod:`rl.phases.time_split`: where an RL step's wall time went (decode, tools, judge, learner, waiting).
  - :mod:`rl.phases.preference`: the preference phase (DPO / SimPO) between SFT and RL.
  - :mod:`rl.phases.reward_model`: training a Bradley-Terry reward model on preference pairs.
  - :mod:`rl.phases.learned_reward`: a saved reward model used as a judge in an RL run.
  - :mod:`rl.phases.evaluation`: held-out evaluation (``Evaluator``), for the loop and the CLI.

Modules are imported explicitly and this file imports none of them.
"""
