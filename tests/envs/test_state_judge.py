"""The state and pipeline judges stay out of the agent's reach, on both backends.

The self-check hacks (``envs.domains.shell.selfcheck`` and
``envs.domains.pipeline.selfcheck``) are all played by ``test_reward_hacks``;
here each class of attack is checked for *why* it
fails (the forged answer never arrives, the git hook never runs, the trap
fails alone and in time), the attacks are shown to be real against a judge
without these defences, and gold controls pass under the same hostile
conditions (a forger left running, full disks, a service task's live processes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import time

import pytest

from envs.domains.pipeline.verifier import run_pipeline, stage
from envs.domains.shell.selfcheck import FSMONITOR_KILLS_GIT, HOOK_KILLS_GIT, gold
from envs.domains.shell.verifier import run_state_checks
from envs.parsing import format_tool_call
from envs.quality.exploits import FORGER
from envs.quality.hooks import SUBMIT, bash, leave_running, write
from envs.quality.validate import play
from envs.tasks import Task, TaskError, load_tasks
from envs.verifiers import VerifyContext, make_verifier
from sandbox import SandboxSpec
from tests.envs.conftest import make_env

SHELL = load_tasks("builtin:shell")


def _sandbox(pool):
    return pool.acquire(SandboxSpec(memory_mb=1024, timeout_s=60.0))


def _results(sandbox, checks, **kwargs) -> dict[str, dict]:
    return {r["name"]: r for r in run_state_checks(sandbox, checks, **kwargs)}


def _play(pool, env_id, task_id, actions):
    env = make_env(env_id, pool)
    verification = play(env, env.tasks.get(task_id), actions)
    env.close()
    assert verification["anomaly"] is None, verification["anomaly"]
    return verification


# -- the original exploit ------------------------------------------------------------------
def test_the_forger_fools_a_checker_that_runs_beside_the_agent(bwrap_pool):
    """The known hack, against a checker of the agent's uid talking over pipes of that uid (the old design)."""
    sandbox = _sandbox(bwrap_pool)
    try:
        sandbox.write_files({"/tmp/.forger.py": FORGER})
        sandbox.exec("nohup python3 /tmp/.forger.py >/dev/null 2>&1 &\nsleep 0.3", timeout=10)
        nonce, checks = "n" * 32, [{"name": "report", "type": "file", "path": "report.txt", "lines": ["x"]}]
        naive = "import sys, time; time.sleep(1); sys.stdin.read(); print('REAL VERDICT')"
        request = json.dumps({"checks": checks, "nonce": nonce})
        result = sandbox.exec(f'printf %s "$REQUEST" | python3 -c "{naive}" | cat', env={"REQUEST": request})
        envelope = json.loads(result.stdout_text)
        mac = hmac.new(nonce.encode(), envelope["body"].encode(), hashlib.sha256).hexdigest()
        assert hmac.compare_digest(envelope["mac"], mac)
        assert json.loads(envelope["body"]) == [{"name": "report", "ok": True, "detail": "ok"}]
    finally:
        bwrap_pool.release(sandbox)


def test_a_forger_left_running_cannot_touch_the_verdict(pool):
    """Gold controls: with the forger alive during the network phase of a service task, or killed first."""
    for task_id in ("shell/ping-service", "shell/top-clients-report"):
        actions = (gold(task_id), *leave_running("forger", FORGER), SUBMIT)
        verification = _play(pool, "agentrl/ShellOps-v0", task_id, actions)
        assert verification["passed"] and verification["reward"] == 1.0, verification["details"]


def test_programs_the_checker_starts_cannot_reach_its_descriptors(pool):
    sandbox = _sandbox(pool)
    try:
        check = {
            "name": "peek",
            "type": "command",
            "run": "id -u; ls /proc/$PPID/fd 2>&1; head -c 50 /proc/$PPID/environ 2>&1",
        }
        detail = _results(sandbox, [check])["peek"]["detail"]
        # non-dumpable: its /proc entries belong to root (bwrap's hidepid even hides them from its own uid)
        assert "1001" in detail and detail.count("Permission denied") + detail.count("No such file") == 2, detail
    finally:
        pool.release(sandbox)


# -- processes: killed unless the task keeps services ---------------------------------------
def test_every_process_is_killed_unless_services_are_kept(pool):
    sandbox = _sandbox(pool)
    try:
        server = "cd /tmp && echo ok > health && nohup python3 -m http.server 8099 --bind 127.0.0.1 >/dev/null 2>&1 &"
        checks = [
            {"name": "up", "type": "http", "url": "http://127.0.0.1:8099/health", "body_equals": "ok", "wait_s": 5}
        ]
        sandbox.exec(server + "\nsleep 0.5", timeout=30)
        assert _results(sandbox, checks)["up"]["ok"] is False  # not declared: nothing survives to answer
        assert sandbox.ping()["processes"] == 0
        sandbox.exec(server + "\nsleep 0.5", timeout=30)
        assert _results(sandbox, checks, keep_services=True)["up"]["ok"] is True
        assert sandbox.ping()["processes"] == 0  # killed right after the service was probed
    finally:
        pool.release(sandbox)


@pytest.mark.parametrize(
    "metadata,checks,match",
    [
        ({}, [{"type": "tcp", "port": 7000}], "must declare keep_services: true"),
        ({"keep_services": "yes"}, [{"type": "tcp", "port": 7000}], "expected true or false"),
        ({"keep_services": True}, [{"type": "file", "path": "x"}], "no http/tcp check"),
        ({"reset_before_cron": ["../etc"]}, [{"type": "file", "path": "x"}], "reset_before_cron"),
        ({"reset_before_cron": ["logs"]}, [{"type": "file", "path": "x"}], "no cron check has run"),
    ],
)
def test_service_and_reset_declarations_are_validated(metadata, checks, match, bwrap_pool):
    task = Task(
        id="t/bad", domain="shell", prompt="p", hidden={"checks": checks}, gold={"script": "true"}, metadata=metadata
    )
    env = make_env("agentrl/ShellOps-v0", bwrap_pool, tasks=[task])
    with pytest.raises(TaskError, match=match):
        env.reset(options={"task": task})
    env.close()
    result = make_verifier("sandbox_state").verify(VerifyContext(task=task, sandbox=object()))
    assert result.anomaly and result.anomaly.startswith("verifier_error: ValueError") and match in result.anomaly


def test_the_cron_job_runs_as_the_agent_and_nothing_of_it_survives(pool):
    sandbox = _sandbox(pool)
    try:
        sandbox.write_files(
            {
                "job.sh": "#!/bin/sh\nid -u > /workspace/ran-as\nnohup sleep 300 >/dev/null 2>&1 &\n",
                "c": "@daily /workspace/job.sh\n",
            }
        )
        sandbox.exec("chmod +x job.sh", timeout=10)
        checks = [
            {
                "name": "job",
                "type": "cron",
                "file": "c",
                "schedule": "0 0 * * *",
                "command_contains": "job.sh",
                "run": True,
            },
            {"name": "uid", "type": "file", "path": "ran-as", "equals": "1000\n"},
        ]
        results = _results(sandbox, checks)
        assert results["job"]["ok"] and results["uid"]["ok"], results
        assert sandbox.ping()["processes"] == 0
    finally:
        pool.release(sandbox)


def test_work_done_by_hand_next_to_a_lazy_job_is_reset_away(bwrap_pool):
    task = SHELL.get("shell/daily-cleanup-job")
    lazy = "mkdir -p bin cron logs && printf '#!/bin/sh\\ntrue\\n' > bin/cleanup.sh && chmod +x bin/cleanup.sh"
    by_hand = "find cache -name '*.tmp' -delete && echo 'cleanup done' >> logs/cleanup.log"
    entry = "echo '@daily /workspace/bin/cleanup.sh' > cron/cleanup.cron"
    actions = (bash(f"cd /workspace && {lazy} && {by_hand} && {entry}"), SUBMIT)
    verification = _play(bwrap_pool, "agentrl/ShellOps-v0", task.id, actions)
    failed = {c["name"] for c in verification["details"]["outcome"]["details"]["checks"] if not c["ok"]}
    assert failed == {"tmp files gone", "log line"}, verification["details"]


# -- git never runs the agent's code as the judge ------------------------------------------
GIT_REPO = (
    "cd /workspace && mkdir -p project && cd project && git init -q -b main && echo a > README.md && git add -A"
    " && git -c user.name=x -c user.email=x@y commit -qm init && mkdir -p /tmp/ran && chmod 777 /tmp/ran"
)
GIT_TRAPS = {
    "fsmonitor": FSMONITOR_KILLS_GIT.replace("kill -9 $PPID", "touch /tmp/ran/fsmonitor; kill -9 $PPID"),
    "hook": HOOK_KILLS_GIT.replace("kill -9 $PPID", "touch /tmp/ran/hook; kill -9 $PPID"),
    "filter": "cd /workspace/project && echo '* filter=x' > .gitattributes && git config filter.x.clean"
    " 'touch /tmp/ran/filter; kill -9 $PPID' && touch -d 2030-01-01 README.md",
    "textconv": "cd /workspace/project && echo '* diff=t' > .git/info/attributes && git config diff.t.textconv"
    " 'touch /tmp/ran/textconv; cat' && echo b >> README.md",
    "external diff": "cd /workspace/project && git config diff.external /workspace/.ext && echo c >> README.md"
    " && printf '#!/bin/sh\\ntouch /tmp/ran/external\\n' > /workspace/.ext && chmod +x /workspace/.ext",
    "signature": "cd /workspace/project && git config log.showSignature true && git config gpg.program /workspace/.gpg"
    " && printf '#!/bin/sh\\ntouch /tmp/ran/gpg\\n' > /workspace/.gpg && chmod +x /workspace/.gpg && t=$(git write-tree)"
    " && c=$(printf 'tree %s\\nauthor x <x@y> 1 +0000\\ncommitter x <x@y> 1 +0000\\ngpgsig -----BEGIN PGP SIGNATURE-----\\n"
    " x\\n -----END PGP SIGNATURE-----\\n\\nsigned\\n' $t | git hash-object -t commit -w --stdin) && git update-ref HEAD $c",
    "include": "cd /workspace/project && printf '[core]\\n\\tfsmonitor = /workspace/.fsm2\\n' > /workspace/.cfg"
    " && git config include.path /workspace/.cfg && echo junk > junk.txt"
    " && printf '#!/bin/sh\\ntouch /tmp/ran/include\\n' > /workspace/.fsm2 && chmod +x /workspace/.fsm2",
}
GIT_COMMANDS = [
    'test -z "$(git -C project status --porcelain)"',
    "git -C project log -p --format=%s",
    "git -C project diff",
]


@pytest.mark.parametrize("trap", sorted(GIT_TRAPS))
def test_git_settings_of_the_agent_never_run_as_the_judge(trap, pool):
    sandbox = _sandbox(pool)
    try:
        assert sandbox.exec(GIT_REPO + " && " + GIT_TRAPS[trap], timeout=30).ok
        naive = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}
        for command in GIT_COMMANDS:
            sandbox.exec(command, user="judge", env=naive, cwd="/workspace", timeout=30)
        ran = sandbox.exec("ls /tmp/ran", timeout=10).stdout_text.split()
        assert ran, f"the {trap} trap does not fire for a naive judge; it proves nothing"
        sandbox.exec("rm -f /tmp/ran/*", timeout=10)
        checks = [{"name": f"c{i}", "type": "command", "run": cmd} for i, cmd in enumerate(GIT_COMMANDS)]
        _results(sandbox, checks)
        assert sandbox.exec("ls /tmp/ran", timeout=10).stdout_text.split() == []
    finally:
        pool.release(sandbox)


def test_a_hooked_status_still_shows_the_truth(bwrap_pool):
    sandbox = _sandbox(bwrap_pool)
    try:
        sandbox.exec(GIT_REPO + " && " + FSMONITOR_KILLS_GIT, timeout=30)
        check = {"name": "status", "type": "command", "run": "git -C project status --porcelain"}
        result = _results(sandbox, [check])["status"]
        assert result["ok"] and "junk.txt" in result["detail"], result
    finally:
        bwrap_pool.release(sandbox)


# -- traps for the checker's reads fail alone and in time ----------------------------------
TRAPS = (
    "mkfifo fifo && ln -s /proc/self/fd/1 own-stdout && ln -s /dev/zero zero && mkfifo cron.fifo && mkfifo db.fifo"
    " && head -c 20000000 /dev/zero | tr '\\0' x > huge && echo secret > locked && chmod 000 locked && echo fine > ok.txt"
    " && python3 -c \"import os; os.mkdir('wide'); [open('wide/%d' % i, 'w').close() for i in range(25000)];"
    " os.mkdir('deep'); os.chdir('deep'); [(os.mkdir('d'), os.chdir('d')) for _ in range(1100)]\""
)


def test_traps_fail_their_own_check_only_and_in_time(pool):
    sandbox = _sandbox(pool)
    try:
        assert sandbox.exec(TRAPS, timeout=120).ok
        checks = [
            {"name": "fifo", "type": "file", "path": "fifo", "contains": ["x"]},
            {"name": "own stdout", "type": "file", "path": "own-stdout", "contains": ["x"]},
            {"name": "zero", "type": "file", "path": "zero", "contains": ["x"]},
            {"name": "huge", "type": "file", "path": "huge", "contains": ["y"]},
            {"name": "locked", "type": "file", "path": "locked", "equals": "secret\n"},
            {"name": "deep", "type": "tree", "path": "deep", "files": []},
            {"name": "wide", "type": "tree", "path": "wide", "files": []},
            {"name": "cron", "type": "cron", "file": "cron.fifo", "schedule": "@daily", "run": True},
            {"name": "db", "type": "sqlite", "db": "db.fifo", "query": "select 1", "rows": [[1]]},
            {"name": "cat fifo", "type": "command", "run": "cat fifo", "timeout": 2},
            {"name": "fine", "type": "file", "path": "ok.txt", "equals": "fine\n"},
        ]
        start = time.monotonic()
        results = _results(sandbox, checks)
        assert time.monotonic() - start < 30
        assert [n for n, r in results.items() if r["ok"]] == ["fine"], results
        assert "too large" in results["huge"]["detail"] and "Permission" in results["locked"]["detail"]
        assert "timed out" in results["cat fifo"]["detail"]  # the deep tree did not take the command checks down
    finally:
        pool.release(sandbox)


FILL = (
    "for d in {dirs}; do mkdir -p $d; (cd $d && seq 200000 | xargs touch 2>/dev/null;"
    " cat /dev/zero > fill 2>/dev/null); done; true"
)


def _fill(dirs: str) -> str:
    return format_tool_call("bash", {"command": FILL.format(dirs=dirs), "timeout": 200})


def test_full_disks_are_not_anomalies_and_gold_still_passes(pool):
    report = gold("shell/top-clients-report")
    verification = _play(
        pool, "agentrl/ShellOps-v0", "shell/top-clients-report", (report, _fill("/tmp /workspace/junk"), SUBMIT)
    )
    assert verification["passed"], verification["details"]
    task = load_tasks("builtin:pipeline").get("pipeline/revenue-by-product")
    config = write("pipeline.yaml", task.gold["files"]["pipeline.yaml"])
    verification = _play(pool, "agentrl/DataPipeline-v0", task.id, (config, _fill("/tmp"), SUBMIT))
    assert verification["passed"], verification["details"]  # staged on /dev/shm instead
    # kill_all empties /dev/shm before the judge runs, so filling both leaves the judge room to stage
    verification = _play(pool, "agentrl/DataPipeline-v0", task.id, (config, _fill("/tmp /dev/shm"), SUBMIT))
    assert verification["passed"] and not verification.get("anomaly"), verification["details"]


# -- the pipeline judge ----------------------------------------------------------------------
def test_pipeline_data_is_staged_privately_for_the_judge_and_removed(pool):
    sandbox = _sandbox(pool)
    try:
        root, problem = stage(sandbox, {"data/t.csv": "a\n1\n"})
        assert root and not problem
        seen = sandbox.exec(f"stat -c '%u %a' {root}; ls {root}", timeout=10)
        assert seen.stdout_text.split() == ["1001", "700"] and "Permission denied" in seen.stderr_text
        config = b"inputs: {t: {path: data/t.csv}}\nsteps: []\noutput: {table: t, path: out/result.csv}\n"
        text, log = run_pipeline(sandbox, "pipeline.yaml", config, {"data/t.csv": "a\n1\n"}, "out/result.csv")
        assert text == "a\n1\n", log
        sandbox.exec(["rm", "-rf", root], user="judge", timeout=10)
        assert ".agentrl-pipe-" not in sandbox.exec("ls -A /tmp /dev/shm", timeout=10).stdout_text
    finally:
        pool.release(sandbox)


def test_shipped_service_tasks_declare_it(bwrap_pool):
    services = {t.id for t in SHELL if any(c["type"] in ("http", "tcp") for c in t.hidden["checks"])}
    assert services == {t.id for t in SHELL if t.metadata.get("keep_services")}
    undeclared = dataclasses.replace(SHELL.get("shell/static-site-service"), id="t/undeclared", metadata={"setup": ""})
    with pytest.raises(ValueError, match="keep_services"):
        make_verifier("sandbox_state").check(VerifyContext(task=undeclared, sandbox=None))
