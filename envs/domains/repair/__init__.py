"""Repository repair, ``agentrl/RepoRepair-v0``: fix a small repository until its hidden tests pass.

* :mod:`~envs.domains.repair.env`: the environment (a git repository with one squashed commit).
* :mod:`~envs.domains.repair.verifier`: ``hidden_tests``, scored fail-to-pass by default.
* :mod:`~envs.domains.repair.workspace`: hygiene before judging (steering files and bytecode go).
* :mod:`~envs.domains.repair.split_judge`: the hidden tests in a judge process, the repository behind a proxy.
* :mod:`~envs.domains.repair.authoring`: the ``repair`` compiler (gold patch, manifest, fail-to-pass).
* :mod:`~envs.domains.repair.selfcheck` and :mod:`~envs.domains.repair.exploits`: the self-check set.
* ``in_sandbox/``: the judge, the proxy, the repository server and their wire.
"""

from envs.domains.repair import authoring, selfcheck, verifier  # noqa: F401 - registers compiler, verifier, self-check
from envs.domains.repair.env import RepoRepairEnv

__all__ = ["RepoRepairEnv"]
