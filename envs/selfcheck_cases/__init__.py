"""The self-check set: known-correct and known-incorrect samples for every registered verifier.

Each :class:`Case` is a sample with the verdict a sound verifier must reach.
Sandbox verifiers are exercised end to end: the sample is a scripted agent
(the replies it sends), played through the domain's real environment. The
incorrect samples include the known reward hacks, each of which must score
as a failure:

* exiting early with status 0 (``sys.exit(0)`` / ``os._exit(0)`` at import);
* patching the test runner or its reports (a ``conftest.py`` hook, a patched
  ``TestReport``, bytecode of a fixed module planted under ``__pycache__``,
  ``sitecustomize``/``.pth`` hooks, a daemon rewriting reports);
* objects that compare equal to anything; patched builtins;
* deleting or skipping tests; printing fake PASS lines;
* for state and pipeline tasks: a cron entry that does nothing, a tampered
  pipeline runner, a copied expected output.
"""

from envs.selfcheck_cases.common import MATH_SAMPLES, SUBMIT, Case, bash, gold_and_noop_cases, write
from envs.selfcheck_cases.functions import function_cases, function_controls
from envs.selfcheck_cases.repair import (
    ALWAYS_EQUAL,
    BUGGY,
    CONFTEST_FORCE_PASS,
    FIXED_SOURCE,
    MODULE,
    REPAIR_TASK,
    STALE_BYTECODE,
    repair_cases,
)
from envs.selfcheck_cases.state import pipeline_cases, state_cases

__all__ = [
    "ALWAYS_EQUAL",
    "BUGGY",
    "CONFTEST_FORCE_PASS",
    "FIXED_SOURCE",
    "MATH_SAMPLES",
    "MODULE",
    "REPAIR_TASK",
    "STALE_BYTECODE",
    "SUBMIT",
    "Case",
    "bash",
    "function_cases",
    "function_controls",
    "gold_and_noop_cases",
    "pipeline_cases",
    "repair_cases",
    "state_cases",
    "write",
]
