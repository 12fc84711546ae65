"""Task-set screening (``python -m envs.quality.validate``) and verifier self-checks (``python -m envs.quality.selfcheck``).

Every shipped task is validated on bwrap (gold passes, no-op fails, stable over
two repeats, environment builds, oracle unreachable); a slice of every domain
runs on Docker too, so the production backend is exercised in CI.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from envs.quality import selfcheck, validate
from envs.quality.hooks import SELF_CHECKS, Unavailable, register_selfcheck
from envs.tasks import Task, load_tasks, write_jsonl
from tests.sandbox.conftest import backend_or_skip

SETS = ("math", "repair", "shell", "pipeline")


@pytest.mark.slow
@pytest.mark.parametrize("name", SETS)
def test_every_shipped_task_is_sound_on_bwrap(name):
    backend_or_skip("bwrap")
    tasks = list(load_tasks(f"builtin:{name}"))
    reports, leaks = validate.validate(tasks, backend="bwrap", repeats=2, log=lambda line: None)
    assert [(r.task_id, r.problems) for r in reports if not r.ok] == []
    assert len(reports) == len(tasks) and leaks == []
    assert all(len(r.gold) == 2 and len(r.noop) == 2 for r in reports)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("name", SETS)
def test_shipped_tasks_are_sound_on_docker(name):
    backend_or_skip("docker")
    tasks = load_tasks(f"builtin:{name}")
    picked = [t for d in ("easy", "medium", "hard") for t in tasks.filter(difficulty=d)][:: max(len(tasks) // 6, 1)]
    reports, _ = validate.validate(picked, backend="docker", repeats=1, log=lambda line: None)
    assert [(r.task_id, r.problems) for r in reports if not r.ok] == []


def test_cli_passes_a_sound_set_and_fails_a_broken_one(tmp_path, capsys):
    backend_or_skip("bwrap")
    good = load_tasks("builtin:repair").get("repair/leap-years")
    wrong_gold = dataclasses.replace(
        good, id="broken/wrong-gold", gold={"patch": good.gold["patch"].replace("400", "500")}
    )
    leaky = dataclasses.replace(
        good, id="broken/leaky", files={**good.files, "NOTES.md": good.hidden["tests"]["test_leap.py"]}
    )
    careless = load_tasks("builtin:shell").get("shell/env-from-json")
    careless = dataclasses.replace(
        careless,
        id="broken/setup-leaks-gold",
        metadata={"setup": f"cat > /tmp/.solution <<'EOF'\n{careless.gold['script']}EOF"},
    )
    trivial = Task(
        id="broken/trivial",
        domain="shell",
        prompt="Make sure notes.txt exists.",
        files={"notes.txt": "hi\n"},
        hidden={"checks": [{"name": "exists", "type": "file", "path": "notes.txt"}]},
        gold={"script": "touch notes.txt"},
    )
    write_jsonl([good], tmp_path / "good.jsonl")
    write_jsonl([good, wrong_gold, leaky, careless, trivial], tmp_path / "bad.jsonl")
    assert validate.main([str(tmp_path / "good.jsonl"), "--repeats", "1", "--report", str(tmp_path / "ok.json")]) == 0
    assert json.loads((tmp_path / "ok.json").read_text())["sound"] == 1
    assert validate.main([str(tmp_path / "bad.jsonl"), "--repeats", "1", "--report", str(tmp_path / "bad.json")]) == 1
    report = {t["task_id"]: t for t in json.loads((tmp_path / "bad.json").read_text())["tasks"]}
    assert report["repair/leap-years"]["ok"]
    assert any("gold solution fails" in p for p in report["broken/wrong-gold"]["problems"])
    assert any(p.startswith("oracle visible: 7 of 7 distinctive hidden") for p in report["broken/leaky"]["problems"])
    assert any(
        p.startswith("oracle reachable") and "/tmp/.solution" in p
        for p in report["broken/setup-leaks-gold"]["problems"]
    )
    assert any("noop solution passes" in p for p in report["broken/trivial"]["problems"])
    out = capsys.readouterr().out
    assert "[validate    1/5]" in out and "1/5 tasks sound" in out


@pytest.mark.slow
def test_selfcheck_every_verifier_is_exact_and_stable(capsys):
    backend_or_skip("bwrap")
    assert selfcheck.main(["--backend", "bwrap", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    for name in ("hidden_tests", "function_tests", "math_answer", "sandbox_state", "pipeline_output"):
        assert f"[selfcheck] {name}" in out and "(100.0%), stable" in out
    assert "all verifiers 100% accurate and stable" in out


def test_selfcheck_reports_an_inaccurate_verifier():
    outcomes = [
        selfcheck.Outcome("math_answer", "x", True, [True, True]),
        selfcheck.Outcome("math_answer", "y", False, [True, False]),
    ]
    lines: list[str] = []
    assert selfcheck.summarise(outcomes, log=lines.append) is False
    assert "1/2   correct ( 50.0%), FLAKY" in lines[0]


def test_selfcheck_sets_come_from_the_domains_and_an_unavailable_one_is_skipped_with_why():
    assert set(SELF_CHECKS) >= {"function", "math", "pipeline", "repair", "shell"}
    with pytest.raises(ValueError, match="already registered"):
        register_selfcheck("repair")(lambda: [])

    @register_selfcheck("unavailable_demo")
    def needs_a_package():
        raise Unavailable("`pip install something` for its self-check set")

    lines: list[str] = []
    try:
        samples = selfcheck.registered_samples(log=lines.append)
    finally:
        SELF_CHECKS.pop("unavailable_demo")
    assert lines == ["[selfcheck] unavailable_demo skipped: `pip install something` for its self-check set"]
    verifiers = {s.verifier for s in samples}
    assert verifiers >= {"function_tests", "hidden_tests", "math_answer", "pipeline_output", "sandbox_state"}
