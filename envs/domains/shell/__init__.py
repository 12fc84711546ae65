"""Shell operations, ``agentrl/ShellOps-v0``: files, permissions, services and cron entries, checked as state.

* :mod:`~envs.domains.shell.env`: the environment, and the ``shell`` compiler (goal checks).
* :mod:`~envs.domains.shell.rules`: what each check type means, judged on the host.
* :mod:`~envs.domains.shell.verifier`: ``sandbox_state``, the checker run after the agent's processes are gone.
* :mod:`~envs.domains.shell.selfcheck`: the self-check set (hacks on the checker).
* ``in_sandbox/state_checker.py``: what looks at the sandbox (it reports, the host judges).
"""

from envs.domains.shell import mutants, selfcheck, verifier  # noqa: F401 - registers the verifier, self-check and mutators
from envs.domains.shell.env import ShellOpsEnv

__all__ = ["ShellOpsEnv"]
