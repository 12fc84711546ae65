"""The near-miss gate: generated mutants and authored near misses played through the real environment.

A near miss that is secretly the gold (the control: a gate that sees it pay) must fail the
task with its name; the real mutants of a shipped task must all score 0.
"""

from __future__ import annotations

import dataclasses

from envs.quality.hooks import NEAR_MISSES
from envs.quality.mutants import _comment_added, empty_files, gold_paths
from envs.quality.near_misses import check_mutants
from envs.quality.validate import play
from tests.envs.conftest import make_env


def test_comment_out_added_hides_moved_and_inserted_lines_only():
    assert _comment_added("a\nb\nc\n", "a\nc\nb\n") == "a\n# c\nb\n"  # a reordering is not the gold
    assert _comment_added("a\nb\n", "a\n    x = 1\nb\n") == "a\n    # x = 1\nb\n"  # indentation kept


def test_every_mutant_of_a_shipped_task_scores_zero_and_a_paying_one_is_named(bwrap_pool):
    env = make_env("agentrl/DataPipeline-v0", bwrap_pool)
    task = env.tasks.get("pipeline/top-products")
    assert gold_paths(task) == ["pipeline.yaml"]
    assert [m.name for m in empty_files(env, task)] == ["empty_files"]
    shipped = check_mutants(env, task, play)
    wrong = {"name": "gold in disguise", "why": "the control: it is the gold", "files": task.gold["files"]}
    disguised = dataclasses.replace(task, gold={**task.gold, NEAR_MISSES: [wrong]})
    control = check_mutants(env, disguised, play)
    env.close()
    assert shipped.problems == [] and shipped.killed == shipped.total >= 2, shipped
    assert control.killed == control.total - 1
    assert any("near miss 'gold in disguise' survives" in p for p in control.problems), control.problems
