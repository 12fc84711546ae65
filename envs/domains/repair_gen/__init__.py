"""Generated repository repair, ``agentrl/RepairGen-v0``: a tiny module, one injected bug, hidden tests.

The flagship agentic task for a from-scratch model: the prompt does not show the bug, so a good
episode runs the check, reads the module, edits one line, checks again (and edits again if it
still fails) and submits. Built only through the public extension API:

* :mod:`~envs.domains.repair_gen.families`: the bug families and the templates they break;
* :mod:`~envs.domains.repair_gen.tasks`: the task loader ``repair_gen:SPLIT[:N]`` (seeded, disjoint splits);
* :mod:`~envs.domains.repair_gen.env`: the environment (a :class:`RepoRepairEnv` subclass, the same
  ``hidden_tests`` judge) and the ``replace`` tool;
* :mod:`~envs.domains.repair_gen.demos`: SFT demonstrations that are right only by luck.
"""

from envs.domains.repair_gen import demos, env, tasks  # noqa: F401 - each registers itself on import
