"""Experiment configs: one file per experiment, each with ``get_config(arg=None)``.

Configs import only ``ml_collections`` and :mod:`configs.common`, and name code by
string (model preset, env domain, task source, sandbox backend, algorithm),
resolved by registries at run time. Run one with::

    python -m rl.train --config=configs/quickstart.py --workdir=runs/q --config.rollout.group_size=8
"""
