"""``configs/repair_from_scratch.py:test`` end to end through the CLI, and a resume after SIGKILL.

The agentic example's plumbing: a few SFT steps on the blind-fix demonstrations, a few RL steps on
generated repair tasks judged by the hidden tests (bwrap), held-out evaluation with the tool-use
metrics, the wall-time split of every RL step, and a killed run that resumes to exactly the
metrics and parameters of one that never stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rl.phases.time_split import SPLIT
from rl.run.metrics import read_metrics, without_timing
from tests.rl.test_train import REPO, _assert_resumed, _env, _final_params, _latest_checkpoint
from tests.sandbox.conftest import backend_or_skip

pytestmark = pytest.mark.slow  # two training runs of ~2 minutes each on 2 cores

CONFIG = "configs/repair_from_scratch.py:test"


def _cmd(workdir: Path) -> list[str]:
    return [sys.executable, "-m", "rl.train", f"--config={CONFIG}", f"--workdir={workdir}"]


def _run(workdir: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(_cmd(workdir), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    backend_or_skip("bwrap")
    workdir = tmp_path_factory.mktemp("runs") / "repair"
    proc = _run(workdir)
    assert "held-out greedy pass rate" in proc.stdout + proc.stderr and "tool calls per episode" in proc.stdout
    return workdir


def test_runs_end_to_end_with_tool_use_and_the_time_split(run_dir):
    records = read_metrics(run_dir)
    assert [r["phase"] for r in records] == ["init"] + ["sft"] * 4 + ["rl"] * 3
    for r in records[5:]:
        assert r["rollout/repair_gen/reward_mean"] >= 0.0 and r["rollout/anomaly_rate"] == 0.0, r
        assert r["rollout/prefill_tokens_reused"] > 0, r  # multi-turn episodes reuse their KV
        assert all(r[k] >= 0.0 for k in SPLIT) and r["time/verify_s"] > 0.0, r  # every episode is judged
        assert sum(r[k] for k in SPLIT) + r.get("time/eval_s", 0.0) == pytest.approx(
            r["time/step_s"], rel=0.05, abs=0.5
        )
    last = records[-1]
    assert {"eval/greedy_pass_rate", "eval/pass@1", "eval_greedy/tool_calls_mean"} <= set(last)
    assert any(k.startswith("eval_greedy/tool_calls/") for k in last), last  # calls by tool name


def test_sigkill_and_resume_matches_an_uninterrupted_run(run_dir, tmp_path):
    workdir = tmp_path / "killed"
    proc = subprocess.Popen(_cmd(workdir), cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:  # kill it a few steps in, wherever it is
        if len(read_metrics(workdir)) >= 6:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    resume_from = _latest_checkpoint(workdir)
    _assert_resumed(_run(workdir), resume_from)
    assert without_timing(read_metrics(workdir)) == without_timing(read_metrics(run_dir))
    a, b = _final_params(run_dir), _final_params(workdir)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
