"""The shipped domains, one package each; importing this package imports every one of them.

=========================  ====================  ===================================
id                         domain                outcome verifier
=========================  ====================  ===================================
agentrl/Math-v0            math                  math_answer
agentrl/CodeCompletion-v0  function              function_tests (HumanEval format)
agentrl/RepoRepair-v0      repair                hidden_tests
agentrl/ShellOps-v0        shell                 sandbox_state
agentrl/DataPipeline-v0    pipeline              pipeline_output
agentrl/Arithmetic-v0      arithmetic            math_answer (the quickstart; python tool)
agentrl/Template-v0        template              template_count (the one to copy: README)
=========================  ====================  ===================================

A domain package holds everything of its domain: the :class:`~envs.core.AgentEnv`
subclass, its verifiers, its task loaders and compiler, its self-check samples,
its SFT demonstrations if any, and the programs it runs inside sandboxes
(``in_sandbox/``). It plugs into the rest through registration hooks, run when
the package is imported:

* :func:`envs.core.register_domain` — the environment, as ``agentrl/<Name>-v0``;
* :func:`envs.verifiers.register_verifier` — its verifiers;
* :func:`envs.tasks.register_loader` — task specs ``PREFIX:ARG``;
* :func:`envs.quality.hooks.register_compiler` — ``envs/data/src/<name>.yaml`` -> ``envs/data/<name>.jsonl``;
* :func:`envs.quality.hooks.register_selfcheck` — its self-check samples;
* :func:`envs.demonstrations.register_demonstrations` — SFT demonstrations.

Every package (or module) in this directory is imported by :func:`discover`,
so adding a domain is one new package here plus its task file
(``envs/data/<name>.jsonl``, or its YAML source under ``envs/data/src/``); no
other file names it.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def discover() -> list[ModuleType]:
    """Imports every domain package on this package's path (in name order); returns them."""
    return [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)]


DOMAIN_PACKAGES = discover()
