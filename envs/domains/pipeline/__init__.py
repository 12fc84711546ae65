"""Data pipelines, ``agentrl/DataPipeline-v0``: fix a pipeline config so its output matches, on hidden data too.

* :mod:`~envs.domains.pipeline.env`: the environment, and the ``pipeline`` compiler (expected outputs).
* :mod:`~envs.domains.pipeline.verifier`: ``pipeline_output``, the config rerun by the judge on hidden datasets.
* :mod:`~envs.domains.pipeline.selfcheck`: the self-check set (hacks on the grader).
* ``in_sandbox/runner.py``: the pipeline runner (config as data, never as code).
"""

from envs.domains.pipeline import selfcheck, verifier  # noqa: F401 - registers the verifier and the self-check
from envs.domains.pipeline.env import DataPipelineEnv

__all__ = ["DataPipelineEnv"]
