"""Arithmetic, ``agentrl/Arithmetic-v0``: the quickstart's domain, multi-digit arithmetic with a ``python`` tool.

* :mod:`~envs.domains.arithmetic.env`: the environment and its generated tasks (``arithmetic:SPLIT[:N][:FORMS]``).
* :mod:`~envs.domains.arithmetic.demos`: the ``arithmetic`` SFT demonstrations (:mod:`envs.demonstrations`).

Graded by ``math_answer`` (:mod:`envs.domains.math.answers`): the exact integer.
"""

from envs.domains.arithmetic.demos import demonstrations  # registers the demonstration source too
from envs.domains.arithmetic.env import ArithmeticEnv, arithmetic_tasks

__all__ = ["ArithmeticEnv", "arithmetic_tasks", "demonstrations"]
