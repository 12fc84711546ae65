"""Function completion, ``agentrl/CodeCompletion-v0``: HumanEval-format tasks graded on recorded calls.

* :mod:`~envs.domains.function.env`: the environment; the ``humaneval`` and ``mbpp:PATH`` specs.
* :mod:`~envs.domains.function.instrument`: a task's asserts rewritten for recording (AST, on the host).
* :mod:`~envs.domains.function.records`: recording in a sandbox, the disk cache, the shipped HumanEval records.
* :mod:`~envs.domains.function.verifier`: ``function_tests``, the candidate run on recorded arguments.
* :mod:`~envs.domains.function.selfcheck`: the self-check set (hacks and controls).
* ``in_sandbox/``: the driver, the recorder and the check evaluator.

    python -m envs.domains.function --write-humaneval   # re-record envs/data/function_calls/humaneval.json.gz
"""

from envs.domains.function import selfcheck, verifier  # noqa: F401 - registers the verifier and the self-check
from envs.domains.function.env import CodeCompletionEnv

__all__ = ["CodeCompletionEnv"]
