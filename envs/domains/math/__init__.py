"""Math, ``agentrl/Math-v0``: final-answer problems graded by value (``math_answer``).

* :mod:`~envs.domains.math.env`: the environment, the ``gsm8k:PATH`` and ``math:PATH`` specs, the ``math`` compiler.
* :mod:`~envs.domains.math.answers`: ``math_answer``, the final answer extracted and compared by value.
* :mod:`~envs.domains.math.selfcheck`: the self-check samples (notations that agree, near misses that do not).
"""

from envs.domains.math import answers, selfcheck  # noqa: F401 - registers the verifier and the self-check
from envs.domains.math.env import MathEnv

__all__ = ["MathEnv"]
