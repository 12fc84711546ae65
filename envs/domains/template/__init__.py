"""The template domain: copy this folder to start a new one (README, "Adding a domain").

A complete small domain, every part a domain can have, each in its own module:

* ``env.py``: the environment (tools, system prompt, gold and no-op solutions) and its verifier;
* ``tasks.py``: the task loader ``NAME:SEED`` (tasks whose content is in files: :attr:`envs.Task.files`);
* ``selfcheck.py``: cases the verifier must grade right (``python -m envs.quality.validate``);
* ``demos.py``: SFT demonstrations (``config.sft.data = NAME``).

The task: count the lines of a log file in the workspace that carry a level (``ERROR``...). The
agent must read the file (``bash``) and ``submit`` the count; the prompt alone does not hold it.
A copy changes :data:`NAME` and :data:`ENV_NAME` in ``env.py`` and writes its own tasks.
"""

from envs.domains.template import demos, env, selfcheck, tasks  # noqa: F401 - each registers itself on import
