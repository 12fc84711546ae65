"""The shipped domains; importing this package registers their gymnasium ids.

=========================  ====================  ===================================
id                         domain                outcome verifier
=========================  ====================  ===================================
agentrl/Math-v0            math                  math_answer
agentrl/CodeCompletion-v0  function              function_tests (HumanEval format)
agentrl/RepoRepair-v0      repair                hidden_tests
agentrl/ShellOps-v0        shell                 sandbox_state
agentrl/DataPipeline-v0    pipeline              pipeline_output
agentrl/Arithmetic-v0      arithmetic            math_answer (the quickstart; python tool)
=========================  ====================  ===================================
"""

from envs.domains.arithmetic import ArithmeticEnv
from envs.domains.coding import CodeCompletionEnv, RepoRepairEnv
from envs.domains.math import MathEnv
from envs.domains.ops import DataPipelineEnv, ShellOpsEnv

__all__ = ["ArithmeticEnv", "CodeCompletionEnv", "DataPipelineEnv", "MathEnv", "RepoRepairEnv", "ShellOpsEnv"]
