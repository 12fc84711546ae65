"""Fail fast, loudly: a broken sandbox stops a run before step 1, and anomalies that dominate stop it later."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl.run.preflight import CircuitBreaker, RunAborted, explain

REPO = Path(__file__).resolve().parents[2]


def test_a_run_without_bwrap_stops_within_a_minute_naming_the_fix(tmp_path):
    """The scenario of a fresh machine before `scripts/system_setup.sh`: no bubblewrap on PATH."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "JAX_PLATFORMS": "cpu",
        "PATH": os.path.dirname(sys.executable),  # python, but no bwrap
    }
    start = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "rl.train", "--config=configs/quickstart.py:test", f"--workdir={tmp_path / 'run'}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert time.monotonic() - start < 60
    assert run.returncode == 1, run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: domain 'arithmetic': no sandbox could start: bwrap not installed: "
        "run `bash scripts/system_setup.sh --no-docker`"
    ], run.stderr[-2000:]
    assert not list((tmp_path / "run").glob("checkpoints/*")) and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_circuit_breaker_trips_after_patience_steps_of_anomalies():
    breaker = CircuitBreaker(max_rate=0.5, patience=3)
    bad = {"rollout/anomaly_rate": 0.9, "rollout/anomalies/sandbox_vanished": 12.0, "rollout/anomalies/env_error": 1}
    good = {"rollout/anomaly_rate": 0.1}
    breaker.observe(1, bad, "bwrap")
    breaker.observe(2, bad, "bwrap")
    breaker.observe(3, good, "bwrap")  # a healthy step resets the streak
    breaker.observe(4, bad, "bwrap")
    breaker.observe(5, bad, "bwrap")
    with pytest.raises(RunAborted) as caught:
        breaker.observe(6, bad, "bwrap")
    message = str(caught.value)
    assert message.startswith("step 6: 90% of the episodes were anomalies") and "3 steps in a row" in message
    assert "sandbox_vanished x36" in message and "resumes from the last checkpoint" in message
    off = CircuitBreaker(max_rate=1.0, patience=1)
    off.observe(1, {"rollout/anomaly_rate": 1.0}, "docker")  # max_anomaly_rate=1: never trips


@pytest.mark.parametrize(
    ("message", "fix"),
    [
        ("bubblewrap is not installed: apt-get install -y bubblewrap", "bash scripts/system_setup.sh --no-docker"),
        ("no Docker daemon answers at unix:///x.sock", "--config.sandbox.backend=bwrap"),
    ],
)
def test_infrastructure_errors_come_with_the_command_that_fixes_them(message, fix):
    assert fix in explain(RuntimeError(message), "bwrap")


def test_a_warm_start_that_passes_nothing_is_reported(caplog):
    """After SFT, no held-out pass at all (greedy or sampled) means RL has nothing to learn: a warning."""
    from rl.phases.sft import warn_if_nothing_to_learn

    with caplog.at_level(logging.WARNING, logger="rl.phases.sft"):
        warn_if_nothing_to_learn({"eval/greedy_pass_rate": 0.0, "eval/pass@1": 0.0, "eval/pass@4": 0.0}, 300, True)
    assert "no held-out episode passed" in caplog.text and "step 300" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rl.phases.sft"):
        warn_if_nothing_to_learn({"eval/greedy_pass_rate": 0.0, "eval/pass@1": 0.01, "eval/pass@4": 0.04}, 300, True)
        warn_if_nothing_to_learn({"eval/greedy_pass_rate": 0.0, "eval/pass@4": 0.0}, 300, False)  # no RL after it
    assert caplog.text == ""
