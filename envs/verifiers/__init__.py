"""Verifiers: multi-dimensional, anomaly-aware grading of finished episodes.

    from envs.verifiers import build_verifier, VerifyContext
    verifier = build_verifier({"outcome": 1.0, "efficiency": 0.1}, roles={"outcome": "hidden_tests"})
    result = verifier.verify(VerifyContext(task, sandbox, episode, max_turns))
    result.reward, result.passed, result.components, result.anomaly

Registered: ``hidden_tests`` (repository tasks), ``math_answer``,
``function_tests`` (HumanEval-format completion), ``sandbox_state`` (shell
tasks), ``pipeline_output`` (data pipelines), ``tool_format``,
``turn_efficiency``, ``code_compiles``.
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
from envs.verifiers.functions import FunctionTestsVerifier, run_function_tests
from envs.verifiers.hidden_tests import HiddenTestsVerifier
from envs.verifiers.math import MathAnswerVerifier, answers_match, extract_answer
from envs.verifiers.pipeline import PipelineOutputVerifier
from envs.verifiers.process import CodeCompilesVerifier, ToolFormatVerifier, TurnEfficiencyVerifier
from envs.verifiers.state import SandboxStateVerifier, run_state_checks

__all__ = [
    "ROLES",
    "VERIFIERS",
    "CodeCompilesVerifier",
    "FunctionTestsVerifier",
    "HiddenTestsVerifier",
    "MathAnswerVerifier",
    "Part",
    "PipelineOutputVerifier",
    "SandboxStateVerifier",
    "ToolFormatVerifier",
    "TurnEfficiencyVerifier",
    "Verification",
    "Verifier",
    "VerifyContext",
    "WeightedVerifier",
    "answers_match",
    "build_verifier",
    "extract_answer",
    "make_verifier",
    "register_verifier",
    "run_function_tests",
    "run_state_checks",
]
