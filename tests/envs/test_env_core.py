"""The gymnasium contract of every registered environment, and what an episode records."""

from __future__ import annotations

import copy
import importlib
import sys
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import envs.domains
from envs import DOMAINS, AgentEnv, Task, TaskError, env_for_domain, format_tool_call, write_jsonl
from envs.parsing import OPEN_TAG
from tests.envs.conftest import kill_underneath, make_env

AGENT_IDS = sorted(cls.env_id for cls in DOMAINS.values())  # every environment the domain packages registered


def test_every_domain_package_registers_its_environment():
    packages = {module.__name__ for module in envs.domains.DOMAIN_PACKAGES}
    assert packages == {
        f"envs.domains.{name}"
        for name in ("arithmetic", "function", "math", "pipeline", "repair", "repair_gen", "shell", "template")
    }
    for package in packages:  # each package holds (at least) one environment, under its own name
        assert any(cls.__module__.startswith(package + ".") for cls in DOMAINS.values()), package
    assert sorted(k for k in gym.registry if k.startswith("agentrl/")) == AGENT_IDS
    for domain, cls in DOMAINS.items():
        assert env_for_domain(domain) is cls and gym.spec(cls.env_id).entry_point is cls
    assert env_for_domain("repair").env_id == "agentrl/RepoRepair-v0" and set(DOMAINS) >= {"math", "shell"}
    with pytest.raises(KeyError, match="no environment registered for domain 'chess'"):
        env_for_domain("chess")


@pytest.mark.parametrize("env_id", AGENT_IDS)
def test_check_env(env_id, bwrap_pool):
    env = gym.make(env_id, sandbox_factory=bwrap_pool.acquire, sandbox_release=bwrap_pool.release)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any checker warning fails the test
        check_env(env.unwrapped)
    env.close()


def test_seeded_reset_and_scripted_steps_reproduce(bwrap_pool):
    def run(seed):
        env = make_env("agentrl/RepoRepair-v0", bwrap_pool)
        obs, info = env.reset(seed=seed)
        steps = [env.step(format_tool_call("bash", {"command": "ls; cat tests/*.py | head -3"}))]
        steps.append(env.step(format_tool_call("submit")))
        env.close()

        def strip(info):  # timings and sandbox ids are measurements, not state
            return {k: v for k, v in info.items() if k not in ("tool_calls", "episode", "verification")}

        return obs, info, [(o, r, te, tr, strip(i), i["tool_calls"][0]["output"]) for o, r, te, tr, i in steps]

    first, again, other = run(7), run(7), run(8)
    assert first == again
    assert first[1]["task_id"] != other[1]["task_id"] or first[0] == other[0]


def test_episode_messages_tools_and_records(bwrap_pool):
    env = make_env("agentrl/RepoRepair-v0", bwrap_pool, max_turns=5)
    obs, info = env.reset(options={"task": "repair/leap-years"})
    assert obs == env.task.prompt
    assert [m["role"] for m in info["messages"]] == ["system", "user"]
    assert [t["function"]["name"] for t in info["tools"]] == list(env.tool_names)
    reply = "Let me look.\n" + format_tool_call("bash", {"command": "cat calendarx/leap.py"})
    obs, reward, terminated, truncated, info = env.step(reply)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert obs.startswith("<tool_response>\ndef is_leap(year):") and obs.endswith("[exit code: 0]\n</tool_response>")
    assert info["messages"][-2] == {"role": "assistant", "content": reply}
    assert info["new_messages"][0]["role"] == "tool" and info["new_messages"][0]["name"] == "bash"
    record = info["tool_calls"][0]
    assert record["name"] == "bash" and record["arguments"] == {"command": "cat calendarx/leap.py"}
    assert record["exit_code"] == 0 and record["duration_s"] > 0 and not record["malformed"]
    assert record["sandbox"] == {"backend": "bwrap", "image": env.spec_for_sandbox.image}
    obs, reward, terminated, truncated, info = env.step(
        format_tool_call("apply_patch", {"patch": env.task.gold["patch"]})
    )
    obs, reward, terminated, truncated, info = env.step(format_tool_call("submit"))
    assert terminated and not truncated and reward == 1.0
    verification = info["verification"]
    assert verification["passed"] and verification["anomaly"] is None
    assert verification["details"]["outcome"]["details"]["total"] == len(env.task.hidden["manifest"])
    episode = info["episode"]
    assert episode["end_reason"] == "submit" and episode["turns"] == 3 and episode["submitted"]
    assert [c["name"] for c in episode["tool_calls"]] == ["bash", "apply_patch", "submit"]
    assert episode["sandbox"]["image"] == env.spec_for_sandbox.image and episode["tool_time_s"] > 0
    assert env.sandbox is None  # released as soon as the episode ended
    with pytest.raises(RuntimeError, match="the episode ended"):
        env.step("more")
    env.close()


def test_malformed_and_unknown_calls_are_observations(bwrap_pool):
    env = make_env("agentrl/ShellOps-v0", bwrap_pool)
    env.reset(seed=0)
    text = f'{OPEN_TAG}{{"name": "bash", "arguments": {{"command": "echo hi"}}}} {OPEN_TAG}{{nope}}</tool_call>'
    obs, _reward, terminated, _truncated, info = env.step(text)
    assert "not valid JSON" in obs and not terminated
    obs, *_, info = env.step(format_tool_call("launch_rockets", {}) + format_tool_call("bash", {"command": "echo ok"}))
    assert "unknown tool 'launch_rockets'; available: bash, read_file, write_file, submit" in obs
    assert "ok\n[exit code: 0]" in obs
    assert [c["malformed"] for c in info["tool_calls"]] == [True, False]
    obs, *_ = env.step(format_tool_call("write_file", {"path": "a.txt"}))
    assert "missing required argument(s) 'content'" in obs
    obs, *_ = env.step("I think I'm done.")
    assert obs.startswith("No tool call found in your reply")
    env.close()


def test_turn_budget_truncates_and_still_verifies(bwrap_pool):
    env = make_env("agentrl/ShellOps-v0", bwrap_pool, max_turns=2)
    env.reset(options={"task": "shell/env-from-json"})
    env.step(format_tool_call("bash", {"command": "true"}))
    _obs, reward, terminated, truncated, info = env.step(format_tool_call("bash", {"command": env.task.gold["script"]}))
    assert truncated and not terminated
    assert info["episode"]["end_reason"] == "max_turns" and info["verification"]["passed"] and reward == 1.0
    env.close()


def test_token_budget_truncates(bwrap_pool):
    env = make_env("agentrl/ShellOps-v0", bwrap_pool, max_episode_tokens=600, token_counter=lambda s: len(s) // 2)
    env.reset(options={"task": "shell/env-from-json"})
    _obs, _reward, _terminated, truncated, info = env.step(format_tool_call("bash", {"command": "seq 1 2000"}))
    assert truncated and info["episode"]["end_reason"] == "token_budget" and info["tokens"] >= 600
    env.close()


def test_final_answer_domains_end_on_a_plain_reply(bwrap_pool):
    env = make_env("agentrl/Math-v0", bwrap_pool)
    env.reset(options={"task": "math/029-f-x-x"})
    obs, _, terminated, _, _ = env.step(format_tool_call("python", {"code": "print(2*4**2-3*4+1)"}))
    assert "21" in obs and not terminated
    obs, reward, terminated, _truncated, info = env.step("f(4) = 32 - 12 + 1, so the answer is \\boxed{21}.")
    assert terminated and reward == 1.0 and info["episode"]["end_reason"] == "final_answer"
    env.reset(options={"task": "math/029-f-x-x"})
    *_, info = env.step(format_tool_call("submit", {"answer": "22"}))
    assert info["verification"]["passed"] is False and info["verification"]["anomaly"] is None
    env.close()


def test_reset_options_and_seeded_draws(bwrap_pool):
    env = make_env("agentrl/Math-v0", bwrap_pool)
    by_id = env.reset(options={"task": "math/000-bakery-sells-muffins"})[1]["task_id"]
    task = env.tasks.get("math/001-train-travels-km")
    assert env.reset(options={"task": task})[1]["task_id"] == task.id
    assert env.reset(options={"task": task.to_dict()})[1]["task_id"] == task.id
    assert by_id == "math/000-bakery-sells-muffins"
    draws = [env.reset(seed=s)[1]["task_id"] for s in (1, 2, 1)]
    assert draws[0] == draws[2]
    with pytest.raises(KeyError, match="no task with id 'math/none'"):
        env.reset(options={"task": "math/none"})
    with pytest.raises(TypeError, match=r"options\['task'\]"):
        env.reset(options={"task": 3})
    env.close()


def test_constructor_errors_name_the_argument():
    with pytest.raises(ValueError, match="max_turns"):
        gym.make("agentrl/Math-v0", max_turns=1)
    with pytest.raises(ValueError, match="sandbox_release"):
        gym.make("agentrl/Math-v0", sandbox_release=lambda sb: None)
    with pytest.raises(TaskError, match="holds no tasks"):
        gym.make("agentrl/Math-v0", split="test")
    with pytest.raises(KeyError, match="neither a role of this environment"):
        gym.make("agentrl/Math-v0", verifier={"outcome": 1.0, "speed": 0.5})


def test_injected_factory_and_release_are_used(bwrap_pool):
    acquired, released = [], []

    def factory(spec):
        sandbox = bwrap_pool.acquire(spec)
        acquired.append(sandbox.id)
        return sandbox

    def release(sandbox):
        released.append(sandbox.id)
        bwrap_pool.release(sandbox)

    env = gym.make("agentrl/ShellOps-v0", sandbox_factory=factory, sandbox_release=release).unwrapped
    env.reset(seed=0)
    env.reset(seed=1)  # the first episode's sandbox goes back before the next is taken
    assert len(acquired) == 2 and released == acquired[:1]
    env.close()
    assert released == acquired


def test_default_factory_creates_and_closes_sandboxes():
    env = gym.make("agentrl/ShellOps-v0", backend="bwrap").unwrapped
    env.reset(seed=0)
    sandbox = env.sandbox
    assert sandbox.healthy
    env.close()
    assert sandbox.closed


def test_sandbox_failure_mid_episode_is_an_anomaly(backend_name, pool):
    env = make_env("agentrl/ShellOps-v0", pool)
    env.reset(seed=0)
    kill_underneath(env.sandbox)
    _obs, reward, terminated, truncated, info = env.step(format_tool_call("bash", {"command": "ls"}))
    assert truncated and not terminated and reward == 0.0
    assert info["verification"]["anomaly"].startswith("sandbox_")
    assert info["episode"]["end_reason"] == "sandbox_error"
    env.reset(seed=0)  # the broken sandbox was discarded; a healthy one replaces it
    assert env.sandbox.healthy
    env.close()


SQL_DOMAIN = '''
import json
from envs import AgentEnv, Verifier, register_domain, register_verifier, format_tool_call


@register_verifier("sql_rows")
class SqlRowsVerifier(Verifier):
    """1.0 if the submitted query returns the expected rows."""

    def check(self, ctx):
        result = ctx.sandbox.exec(["sqlite3", "-json", "shop.db", ctx.answer or ""], timeout=10)
        rows = json.loads(result.stdout_text or "[]") if result.ok else None
        return self.result(float(rows == ctx.task.hidden["rows"]), details={"rows": rows})


@register_domain("Sql")
class SqlEnv(AgentEnv):
    domain = "sql"
    tool_names = ("bash", "submit")
    verifier_roles = {"outcome": "sql_rows"}
    default_tasks = "builtin:sql"
    system_prompt = "Answer with one SQLite query over /workspace/shop.db; call submit(answer=<query>)."

    def setup_sandbox(self, sandbox, task):
        super().setup_sandbox(sandbox, task)
        sandbox.exec(["sqlite3", "shop.db", task.metadata["schema"]], timeout=10)

    def gold_actions(self, task):  # lets envs.quality.validate prove each task solvable
        return [format_tool_call("submit", {"answer": task.gold["query"]})]
'''
SQL_TASKS = [
    Task(
        id="sql/top-customer",
        domain="sql",
        prompt="Which customer spent the most? Return name and total.",
        hidden={"rows": [{"name": "ada", "total": 30}]},
        gold={"query": "SELECT name, SUM(amount) AS total FROM orders GROUP BY name ORDER BY total DESC LIMIT 1"},
        metadata={
            "schema": "CREATE TABLE orders(name TEXT, amount INT); "
            "INSERT INTO orders VALUES ('ada', 10), ('bob', 25), ('ada', 20);"
        },
    )
]


@pytest.fixture
def sql_domain(tmp_path, monkeypatch):
    """The README's worked example as what adding a domain is: one package (here outside the tree) and its tasks."""
    root = tmp_path / "domains"
    (root / "sql").mkdir(parents=True)
    (root / "sql" / "__init__.py").write_text(SQL_DOMAIN)
    write_jsonl(SQL_TASKS, tmp_path / "sql.jsonl")
    monkeypatch.setattr(envs.domains, "__path__", [*envs.domains.__path__, str(root)])
    yield tmp_path / "sql.jsonl"
    sys.modules.pop("envs.domains.sql", None)
    DOMAINS.pop("sql", None)
    gym.registry.pop("agentrl/Sql-v0", None)
    envs.VERIFIERS.pop("sql_rows", None)


def test_a_domain_is_one_package_of_under_50_lines(sql_domain, bwrap_pool):
    """The README's worked example: verifier + subclass in one package, found by ``envs.domains.discover``."""
    assert len(SQL_DOMAIN.strip().splitlines()) < 50
    assert "agentrl/Sql-v0" not in gym.registry
    found = envs.domains.discover()
    assert importlib.import_module("envs.domains.sql") in found and "envs.domains.sql" in sys.modules
    assert "sql_rows" in envs.VERIFIERS and env_for_domain("sql").env_id == "agentrl/Sql-v0"
    pool = {"sandbox_factory": bwrap_pool.acquire, "sandbox_release": bwrap_pool.release}
    env = gym.make("agentrl/Sql-v0", tasks=str(sql_domain), **pool).unwrapped
    assert isinstance(env, AgentEnv) and env.default_tasks == "builtin:sql"
    env.reset(seed=0)
    *_, info = env.step(env.gold_actions(env.task)[0])
    assert info["verification"]["passed"] and info["verification"]["reward"] == 1.0
    env.reset(seed=0)
    *_, info = env.step(format_tool_call("submit", {"answer": "SELECT 'bob' AS name, 25 AS total"}))
    assert not info["verification"]["passed"]
    env.close()
    task = copy.deepcopy(env.tasks[0])
    assert task.domain == "sql" and type(env) is env_for_domain("sql")
