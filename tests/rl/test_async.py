"""Asynchronous RL and the engine rollout, end to end on CPU with real bwrap sandboxes.

- ``loop.max_staleness=0`` through the producer thread equals the synchronous loop bit for bit.
- The quickstart config itself (shortened by overrides), asynchronous with ``max_staleness=1`` and
  truncated importance sampling, killed with SIGKILL during RL and restarted, ends with exactly the
  parameters, metrics and trajectories of the uninterrupted run; every episode records the policy
  version that sampled it; the engine's prefill savings and the scheduler's metrics are in
  ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from configs import quickstart
from rl.config.settings import load_settings
from rl.phases.rl_phase import RLPhase
from rl.rollout import trajectory
from rl.rollout.task_stream import TaskCatalog
from rl.run.experiment import build
from rl.run.metrics import read_metrics, without_timing
from rl.run.trainer import Trainer
from tests.rl.test_train import REPO, _assert_resumed, _cli, _env, _final_params, _latest_checkpoint
from tests.sandbox.conftest import backend_or_skip

pytestmark = pytest.mark.slow  # every test here needs a training run of its own: minutes, not seconds

# The quickstart's model, tasks, rollout and algorithm; fewer and smaller steps.
SHORT = (
    "--config.sft.steps=40",
    "--config.sft.warmup_steps=5",
    "--config.sft.check_every=0",  # 40 fixed SFT steps (tests/rl/test_sft_check.py covers the check)
    "--config.loop.steps=4",
    "--config.loop.tasks_per_step=4",
    "--config.loop.checkpoint_every=1",
    "--config.optimizer.warmup_steps=1",
    "--config.eval.num_tasks=8",
    "--config.eval.every=2",
    "--config.loop.max_staleness=1",
    "--config.algorithm.loss.tis_cap=2.0",
    "--config.rollout.reproducible=True",  # every engine shape fixed: a resumed run repeats this one bit for bit
)
SFT_STEPS, TOTAL = 40, 44


def _train(workdir: Path, *extra: str) -> list[str]:
    return ["rl.train", "--config=configs/quickstart.py", f"--workdir={workdir}", *SHORT, *extra]


def _producer(trainer: Trainer) -> object:
    """The RL phase's producer thread (None: the phase sampled inline)."""
    return next(p for p in trainer.phases if isinstance(p, RLPhase)).producer


def _train_in_process(workdir: Path, synchronous: bool | None) -> Trainer:
    config = quickstart.get_config("test")
    catalog = TaskCatalog()
    exp = build(load_settings(config, catalog), workdir, catalog)
    try:
        trainer = Trainer(exp, synchronous=synchronous)
        trainer.run()
        return trainer
    finally:
        exp.close()


def test_staleness_zero_is_the_synchronous_loop(tmp_path):
    """At ``max_staleness=0`` the default runs inline, with no producer thread, and the producer (forced)
    ends bit for bit where the inline loop does."""
    backend_or_skip("bwrap")
    assert quickstart.get_config("test").loop.max_staleness == 0
    assert _producer(_train_in_process(tmp_path / "sync", synchronous=None)) is None
    assert _producer(_train_in_process(tmp_path / "producer", synchronous=False)) is not None  # control
    assert without_timing(read_metrics(tmp_path / "sync")) == without_timing(read_metrics(tmp_path / "producer"))
    a, b = _final_params(tmp_path / "sync"), _final_params(tmp_path / "producer")
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.fixture(scope="module")
def stale_run(tmp_path_factory) -> Path:
    backend_or_skip("bwrap")
    workdir = tmp_path_factory.mktemp("async") / "uninterrupted"
    proc = _cli(*_train(workdir), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return workdir


def test_stale_episodes_record_their_policy_and_the_engine_and_scheduler_metrics(stale_run):
    for step, path in trajectory.step_files(stale_run):
        versions = {e["policy_version"] for e in trajectory.read_step(path, arrays=False)}
        assert versions == {max(step - 2, SFT_STEPS)}, (step, versions)
    rl = [r for r in read_metrics(stale_run) if r.get("phase") == "rl"]
    assert [r["rollout/staleness"] for r in rl] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["train/tis_weight_mean"] > 0 for r in rl)
    # Multi-turn episodes reuse their cache: continued turns prefill only the new tokens.
    assert any(r["rollout/tool_calls_mean"] > 0 for r in rl)
    assert sum(r["rollout/prefill_tokens_reused"] for r in rl) > 0
    # Every reset and step went through the scheduler: a reset job per episode and a step job per turn.
    assert all(r["sandbox/rollout_jobs"] == r["rollout/episodes"] * (1 + r["rollout/turns_mean"]) for r in rl)
    assert all("sandbox/queue_wait_p50_s" in r and "sandbox/utilisation" in r for r in rl)


def test_sigkill_during_async_rl_resumes_exactly(stale_run, tmp_path):
    workdir = tmp_path / "killed"
    cmd = [sys.executable, "-m", *_train(workdir)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    # Kill it during RL, after its first RL checkpoint (so the restart resumes with a sampled-ahead step).
    while time.monotonic() < deadline and proc.poll() is None:
        if any(r.get("phase") == "rl" for r in read_metrics(workdir)) and len(read_metrics(workdir)) >= SFT_STEPS + 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    checkpoint = _latest_checkpoint(workdir)
    assert checkpoint > SFT_STEPS, checkpoint  # the kill came after an RL checkpoint, as intended
    resumed = _cli(*_train(workdir), timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-5000:]
    _assert_resumed(resumed, checkpoint)
    assert without_timing(read_metrics(workdir)) == without_timing(read_metrics(stale_run))
    a, b = _final_params(stale_run), _final_params(workdir)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    for (s1, f1), (s2, f2) in zip(trajectory.step_files(stale_run), trajectory.step_files(workdir), strict=True):
        r1, r2 = trajectory.read_step(f1), trajectory.read_step(f2)
        assert s1 == s2 and [x["token_ids"] for x in r1] == [x["token_ids"] for x in r2]
        assert [x["logprobs"] for x in r1] == [x["logprobs"] for x in r2]
    assert json.loads((workdir / "config.json").read_text())["loop"]["max_staleness"] == 1
