"""SFT demonstration sources: found by name, seeded, and showing exactly what the environment shows."""

from __future__ import annotations

import pytest

from envs.demonstrations import DEMONSTRATIONS, demonstrations, register_demonstrations
from envs.domains.arithmetic import arithmetic_tasks
from tests.envs.conftest import make_env


def test_sources_are_registered_by_name_and_errors_name_what_is_wrong():
    assert "arithmetic" in DEMONSTRATIONS
    first = demonstrations("arithmetic", {"num_tasks": 20, "seed": 4})
    assert first == demonstrations("arithmetic", {"num_tasks": 20, "seed": 4}) and len(first) == 20
    assert first != demonstrations("arithmetic", {"num_tasks": 20, "seed": 5})
    with pytest.raises(KeyError, match=r"unknown source 'chess'; registered: \[.*'arithmetic'"):
        demonstrations("chess")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['num_task'\]"):
        demonstrations("arithmetic", {"num_task": 3})
    with pytest.raises(ValueError, match="already registered"):
        register_demonstrations("arithmetic")(lambda options: [])
    with pytest.raises(ValueError, match="expected an identifier"):
        register_demonstrations("two words")


def test_arithmetic_demonstrations_are_what_an_episode_looks_like(bwrap_pool):
    """A tool demonstration's turns are the env's own; a direct answer is a plausible wrong number."""
    tasks = {t.prompt: t for t in arithmetic_tasks("train", 6, seed=2)}
    with_tool = demonstrations("arithmetic", {"num_tasks": 6, "tool_fraction": 1.0, "seed": 2})
    direct = demonstrations("arithmetic", {"num_tasks": 6, "tool_fraction": 0.0, "seed": 2})
    assert [len(c) for c in with_tool] == [4] * 6 and [len(c) for c in direct] == [2] * 6
    env = make_env("agentrl/Arithmetic-v0", bwrap_pool)
    for conversation in with_tool[:2]:
        user, call, tool, answer = conversation
        _, info = env.reset(options={"task": tasks[user["content"]]})
        assert info["messages"] == [user]
        *_, info = env.step(call["content"])
        assert info["new_messages"] == [tool]
        _, reward, terminated, _, info = env.step(answer["content"])
        assert terminated and reward == 1.0 and info["verification"]["passed"]
    for user, guess in direct[:2]:
        env.reset(options={"task": tasks[user["content"]]})
        _, reward, terminated, _, info = env.step(guess["content"])
        assert terminated and reward == 0.0 and not info["verification"]["passed"]
    env.close()
