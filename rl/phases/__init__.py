"""The phases of a run besides RL's own step, and held-out evaluation.

  - :mod:`rl.phases.sft_data`: the SFT conversations a config names (a domain's demonstrations, or JSONL).
  - :mod:`rl.phases.sft_check`: ending the SFT warm start when the skill has arrived.
  - :mod:`rl.phases.preference`: the preference phase (DPO / SimPO) between SFT and RL.
  - :mod:`rl.phases.reward_model`: training a Bradley-Terry reward model on preference pairs.
  - :mod:`rl.phases.learned_reward`: a saved reward model used as a judge in an RL run.
  - :mod:`rl.phases.evaluation`: held-out evaluation (``Evaluator``), for the loop and the CLI.

Modules are imported explicitly and this file imports none of them.
"""
