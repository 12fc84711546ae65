"""Verifiers: multi-dimensional, anomaly-aware grading of finished episodes.

    from envs.verifiers import build_verifier, VerifyContext
    verifier = build_verifier({"outcome": 1.0, "efficiency": 0.1}, roles={"outcome": "hidden_tests"})
    result = verifier.verify(VerifyContext(task, sandbox, episode, max_turns))
    result.reward, result.passed, result.components, result.anomaly

The machinery every domain shares lives here: what a verifier returns and sees
(:mod:`~envs.verifiers.base`), weighted composition from a config
(:mod:`~envs.verifiers.compose`), and the process and efficiency verifiers any
domain can compose with its outcome (:mod:`~envs.verifiers.process`:
``tool_format``, ``turn_efficiency``, ``code_compiles``), and ``learned``, whose
score comes from a judge registered from outside (:mod:`~envs.verifiers.learned`). Outcome verifiers
belong to their domain package (``math_answer``, ``function_tests``,
``hidden_tests``, ``sandbox_state``, ``pipeline_output``: see
:mod:`envs.domains`); all of them are in :data:`VERIFIERS` once ``envs`` is
imported.
"""

from envs.verifiers.base import (
    ROLES,
    VERIFIERS,
    Verification,
    Verifier,
    VerifyContext,
    make_verifier,
    register_verifier,
)
from envs.verifiers.compose import Part, WeightedVerifier, build_verifier
from envs.verifiers.learned import LearnedVerifier, register_scorer, unregister_scorer
from envs.verifiers.process import CodeCompilesVerifier, ToolFormatVerifier, TurnEfficiencyVerifier

__all__ = [
    "ROLES",
    "VERIFIERS",
    "CodeCompilesVerifier",
    "LearnedVerifier",
    "Part",
    "ToolFormatVerifier",
    "TurnEfficiencyVerifier",
    "Verification",
    "Verifier",
    "VerifyContext",
    "WeightedVerifier",
    "build_verifier",
    "make_verifier",
    "register_scorer",
    "register_verifier",
    "unregister_scorer",
]
