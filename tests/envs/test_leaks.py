"""Split-leak detection and the oracle-reachability probes (before, during and after a turn) on real sandboxes."""

from __future__ import annotations

import dataclasses
import json
import secrets
import time

import pytest

from envs.quality.leak_probes import needle_spec
from envs.quality.leaks import (
    find_split_leaks,
    jaccard,
    minhash,
    normalise,
    play_watched,
    probe_oracle,
    secret_lines,
    shingles,
    summarise_leaks,
    watch_oracle,
)
from envs.tasks import Task, load_tasks
from tests.envs.conftest import make_env

GIT = "git -c user.name=x -c user.email=x@y"


def test_shipped_sets_have_no_split_leaks():
    tasks = [t for name in ("math", "repair", "shell", "pipeline") for t in load_tasks(f"builtin:{name}")]
    assert find_split_leaks(tasks) == []


def test_exact_and_near_duplicates_across_splits_are_found():
    source = list(load_tasks("builtin:repair"))
    train = next(t for t in source if t.split == "train")
    reworded = train.prompt.replace("\n", "  ").upper().replace(".", " !")  # formatting changes only
    near = train.prompt.replace("Fix it", "Please repair the function")
    copies = [
        dataclasses.replace(train, id="copy/exact", split="eval", hidden={}),
        dataclasses.replace(train, id="copy/reworded", split="test", hidden={}),
        dataclasses.replace(train, id="copy/near", split="eval", prompt=near, hidden={}),
        dataclasses.replace(train, id="copy/tests", split="eval", prompt="An unrelated prompt about something else."),
    ]
    copies[1] = dataclasses.replace(copies[1], prompt=reworded)
    leaks = {(leak.eval_id, leak.field): leak for leak in find_split_leaks([*source, *copies])}
    assert leaks[("copy/exact", "prompt")].exact and leaks[("copy/reworded", "prompt")].exact
    assert not leaks[("copy/near", "prompt")].exact and leaks[("copy/near", "prompt")].similarity >= 0.8
    assert leaks[("copy/tests", "hidden")].train_id == train.id
    assert all(leak.train_id == train.id for leak in leaks.values())


def test_minhash_estimates_jaccard():
    a = shingles("the quick brown fox jumps over the lazy dog " * 3)
    b = shingles("the quick brown fox leaps over the lazy cat " * 3)
    estimate = sum(x == y for x, y in zip(minhash(a), minhash(b), strict=True)) / len(minhash(a))
    assert abs(estimate - jaccard(a, b)) < 0.2
    assert normalise("Hello,   WORLD!\n") == "hello world"


def test_secret_lines_exclude_what_is_visible():
    task = load_tasks("builtin:repair").get("repair/fahrenheit-precedence")
    secrets = secret_lines(task)
    assert "return (f - 32) * 5 / 9" in secrets
    assert "return c * 9 / 5 + 32" not in secrets  # in the visible module already
    assert any("test_round_trip" in line for line in secrets)


def test_probe_finds_planted_leaks(pool):
    env = make_env("agentrl/RepoRepair-v0", pool)
    task = env.tasks.get("repair/fahrenheit-precedence")
    env.reset(options={"task": task})
    assert probe_oracle(env.sandbox, task) == []  # a fresh repository reveals nothing
    # A careless task author: the fix committed, then reset away (still in the reflog and objects).
    env.sandbox.exec(
        f"sed -i 's|f - 32 \\* 5 / 9|(f - 32) * 5 / 9|' units/temperature.py && {GIT} commit -qam fix "
        "&& git reset -q --hard HEAD~1",
        timeout=30,
    )
    assert env.sandbox.exec("grep -c '(f - 32)' units/temperature.py", timeout=10).stdout_text.strip() == "0"
    findings = probe_oracle(env.sandbox, task)
    assert any("return (f - 32) * 5 / 9" in f and ".git" in f for f in findings)
    env.reset(options={"task": task})
    hidden = task.hidden["tests"]["test_temperature.py"]
    env.sandbox.write_files({"/tmp/cache/t.py": hidden})
    env.sandbox.exec("nohup env LEAK='assert f_to_c(32) == 0' sleep 30 >/dev/null 2>&1 &\nsleep 0.3", timeout=10)
    findings = probe_oracle(env.sandbox, task)
    assert any("/tmp/cache/t.py" in f for f in findings)
    assert any("environment of pid" in f for f in findings)
    env.close()


def test_probe_on_a_task_without_secrets_is_clean(bwrap_pool):
    task = Task(id="p/none", domain="shell", prompt="Just look around.", gold={"script": "ls"})
    env = make_env("agentrl/ShellOps-v0", bwrap_pool, tasks=[task])
    env.reset(seed=0)
    assert probe_oracle(env.sandbox, task) == []
    env.close()


def test_secret_lines_cover_hidden_checks_and_datasets():
    switch = load_tasks("builtin:shell").get("shell/switch-release")
    assert 'test "$(readlink -f current)" = /workspace/releases/v1.3.0' in secret_lines(switch)
    assert not any(line in secret_lines(switch) for line in ("current is a symlink", "releases intact"))  # names
    pipeline = load_tasks("builtin:pipeline").get("pipeline/revenue-by-product")
    hidden = pipeline.hidden["datasets"][1]
    rows = {line for text in [hidden["expected"], *hidden["files"].values()] for line in text.splitlines()}
    visible = {line for text in pipeline.files.values() for line in text.splitlines()}
    assert {line for line in rows - visible if len(line) >= 16} <= set(secret_lines(pipeline))
    assert set(secret_lines(pipeline)) & rows
    assert hidden["expected"].strip() in secret_lines(pipeline)  # short rows, searched for as a block


def test_the_scanner_is_told_hashes_never_the_secrets():
    task = load_tasks("builtin:shell").get("shell/git-initial-import")
    lines = secret_lines(task)
    spec = json.dumps(needle_spec(lines, secrets.token_bytes(16)))
    assert lines and not any(line[:12] in spec or json.dumps(line)[1:13] in spec for line in lines)


def test_a_watcher_sees_what_a_leftover_process_could_read(pool):
    """A checker of the agent's uid holding its request in a pipe: the exposure the original hack used."""
    env = make_env("agentrl/ShellOps-v0", pool)
    task = env.tasks.get("shell/switch-release")
    env.reset(options={"task": task})
    watch = watch_oracle(env.sandbox, task)
    hold = "import os, sys, time; r, w = os.pipe(); os.write(w, sys.stdin.buffer.read()); time.sleep(2)"
    env.sandbox.exec(["python3", "-c", hold], stdin=json.dumps({"checks": task.hidden["checks"]}), timeout=10)
    findings = watch.findings()
    env.close()
    assert any("readlink -f current" in f and "descriptor" in f for f in findings), findings


def test_a_verifier_that_leaves_hidden_data_readable_is_caught(bwrap_pool):
    env = make_env("agentrl/DataPipeline-v0", bwrap_pool)
    task = env.tasks.get("pipeline/revenue-by-product")
    verify = env.verifier.verify

    def careless(ctx):  # stages a hidden dataset where the agent's uid can read it, then grades
        dataset = task.hidden["datasets"][1]
        ctx.sandbox.write_files(
            {"/tmp/stage/in.csv": dataset["files"]["data/orders.csv"], "/tmp/stage/out.csv": dataset["expected"]}
        )
        time.sleep(0.5)
        return verify(ctx)

    env.verifier.verify = careless
    verification, findings = play_watched(env, task, env.noop_actions(task))
    env.close()
    assert verification["anomaly"] is None and not verification["passed"]
    assert any(f.startswith("during the turn or its verification") and "/tmp/stage" in f for f in findings)
    assert any(f.startswith("after verification") and "/tmp/stage/in.csv" in f for f in findings), findings
    assert any(f.startswith("after verification") and "/tmp/stage/out.csv" in f for f in findings), findings


@pytest.mark.parametrize(
    "env_id,task_id",
    [
        ("agentrl/ShellOps-v0", "shell/switch-release"),
        ("agentrl/ShellOps-v0", "shell/cron-backup"),
        ("agentrl/ShellOps-v0", "shell/static-site-service"),
        ("agentrl/DataPipeline-v0", "pipeline/revenue-by-product"),
    ],
)
def test_no_hidden_material_is_reachable_during_or_after_a_turn(env_id, task_id, pool):
    env = make_env(env_id, pool)
    task = env.tasks.get(task_id)
    verification, findings = play_watched(env, task, env.noop_actions(task))
    env.close()
    assert verification["anomaly"] is None and not verification["passed"]
    assert findings == []


def _log_task(task_id: str, split: str, log: str) -> Task:
    """A template-made prompt whose content is in its file, as the template domain's tasks are."""
    return Task(
        id=task_id, domain="template", prompt="How many lines of app.log have the level ERROR?",
        files={"app.log": log}, hidden={"count": 1}, split=split,
    )  # fmt: skip


def test_same_prompt_with_different_files_is_not_a_leak_and_same_files_is_with_its_reason():
    logs = [f"ERROR request {n} took {n * 7 % 900}ms\nINFO request {n + 1} took 3ms\n" for n in range(3)]
    apart = [_log_task("t/0", "train", logs[0]), _log_task("e/0", "eval", logs[1])]
    assert find_split_leaks(apart) == []
    # Control: the same file under the same prompt is flagged, and it says which fields and how much.
    copied = [_log_task("t/0", "train", logs[2]), _log_task("e/0", "eval", logs[2])]
    (leak,) = find_split_leaks(copied)
    assert leak.field == "prompt" and "prompt identical" in leak.why and "files (app.log)" in leak.why
    assert "Jaccard 1.00" in leak.why and leak.why in summarise_leaks([leak])


def test_a_prompt_only_leak_says_why():
    prompt = "Compute the sum of the first one hundred odd numbers and explain each step."
    tasks = [Task(id=f"{s}/0", domain="math", prompt=prompt, split=s) for s in ("train", "eval")]
    (leak,) = find_split_leaks(tasks)
    assert leak.why == "prompt identical after normalisation"
