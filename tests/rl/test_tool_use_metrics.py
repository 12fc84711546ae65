"""Held-out tool use (rl.phases.evaluation.tool_use_metrics) and its config fields."""

from __future__ import annotations

import pytest

from configs import quickstart
from rl.config.errors import ConfigError
from rl.config.settings import load_settings
from rl.phases.evaluation import tool_use_metrics
from rl.rollout.trajectory import EpisodeRecord


def _episode(passed: bool, *names: str, anomaly: str | None = None) -> EpisodeRecord:
    verification = {"reward": float(passed), "passed": passed}
    if anomaly:
        verification["anomaly"] = anomaly
    record = EpisodeRecord(step=1, task_id="t", domain="d", group=0, index=0, seed=0, verification=verification)
    record.tool_calls = [{"name": n} for n in names]
    return record


WORKFLOW = {"check_tool": "run_tests", "edit_tools": ("replace",)}


def test_counts_by_name_and_the_passing_share_that_rechecked():
    episodes = [
        _episode(True, "run_tests", "read_file", "replace", "run_tests", "submit"),  # re-checked
        _episode(True, "run_tests", "read_file", "replace", "submit"),  # checked only before the edit
        _episode(False, "submit"),
        _episode(True, "run_tests", "replace", "run_tests", anomaly="env_error"),  # not counted at all
    ]
    episodes[2].tool_calls.append({"name": ""})  # malformed: counted as "invalid"
    out = tool_use_metrics(episodes, "eval_greedy", **WORKFLOW)
    assert out["eval_greedy/tool_calls/invalid_mean"] == pytest.approx(1 / 3)
    assert out["eval_greedy/tool_calls/run_tests_mean"] == pytest.approx(3 / 3)
    assert out["eval_greedy/tool_calls/replace_mean"] == pytest.approx(2 / 3)
    assert out["eval_greedy/tool_calls/submit_mean"] == pytest.approx(1.0)
    assert out["eval_greedy/passing_tool_calls_mean"] == pytest.approx(4.5)
    assert out["eval_greedy/passing_rechecked"] == pytest.approx(0.5)


def test_a_check_without_an_edit_is_not_a_recheck():
    # control: the same calls with the edit before the last check count; with no edit they do not
    assert tool_use_metrics([_episode(True, "replace", "run_tests")], "e", **WORKFLOW)["e/passing_rechecked"] == 1.0
    assert tool_use_metrics([_episode(True, "run_tests", "run_tests")], "e", **WORKFLOW)["e/passing_rechecked"] == 0.0


def test_no_workflow_no_share_and_no_passing_no_passing_metrics():
    assert "e/passing_rechecked" not in tool_use_metrics([_episode(True, "replace", "run_tests")], "e")
    out = tool_use_metrics([_episode(False, "replace")], "e", **WORKFLOW)
    assert out == {"e/tool_calls/replace_mean": 1.0}


def test_config_fields_are_optional_and_checked():
    config = quickstart.get_config("test")
    assert load_settings(config).eval.check_tool == ""
    config.eval.edit_tools = ["replace"]
    assert load_settings(config).eval.edit_tools == ("replace",)
    config = config.to_dict()
    config["eval"]["edit_tools"] = "replace"
    with pytest.raises(ConfigError, match=r"config\.eval\.edit_tools"):
        load_settings(config)
