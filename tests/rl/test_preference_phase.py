"""The preference phase in a run: ``configs/sft_dpo_grpo.py:test`` trains SFT -> DPO -> GRPO end to end,
a run resumed from a checkpoint inside the DPO phase ends exactly where the uninterrupted one did, and
mined pairs are written once and reused on resume (never mined again from a changed policy)."""

from __future__ import annotations

import json
import shutil
import subprocess
import types
from pathlib import Path

import numpy as np
import pytest

from envs import Task
from rl.generation.tokenizer import ByteTokenizer
from rl.phases.preference import PAIRS_FILE, PreferencePhase, PreferenceSettings
from rl.rollout.episode_driver import RolloutResult
from rl.rollout.trajectory import EpisodeRecord
from rl.run.metrics import read_metrics, without_timing
from tests.rl.test_train import _assert_resumed, _cli, _final_params

CONFIG = "configs/sft_dpo_grpo.py:test"
KEEP = "--config.loop.keep_checkpoints=50"  # every step's checkpoint stays: the test resumes from one


def _run(workdir: Path) -> subprocess.CompletedProcess:
    proc = _cli("rl.train", f"--config={CONFIG}", f"--workdir={workdir}", KEEP, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.mark.slow
def test_sft_dpo_grpo_runs_and_resumes_exactly_from_inside_the_dpo_phase(tmp_path):
    full = tmp_path / "full"
    _run(full)
    metrics = read_metrics(full)
    phases = [m["phase"] for m in metrics if m["step"] > 0]
    assert phases == ["sft"] * 4 + ["preference"] * 3 + ["rl"] * 3
    dpo = [m for m in metrics if m.get("phase") == "preference"]
    assert dpo[0]["dpo/loss"] == pytest.approx(np.log(2.0), abs=1e-5)  # the reference is the policy at first
    assert dpo[-1]["dpo/loss"] < dpo[0]["dpo/loss"] and dpo[-1]["dpo/accuracy"] > 0.5
    assert "eval/greedy_pass_rate" in dpo[-1]  # evaluated after the phase

    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed)
    for ckpt in (resumed / "checkpoints").iterdir():  # as if killed right after checkpoint 5 (DPO step 1)
        if ckpt.name.isdigit() and int(ckpt.name) > 5:
            shutil.rmtree(ckpt)
    _assert_resumed(_run(resumed), 5)
    assert without_timing(read_metrics(resumed)) == without_timing(metrics)
    a, b = _final_params(full), _final_params(resumed)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


class _Rollout:
    def __init__(self):
        self.calls = 0

    def run(self, tasks, *, step, group_size, policy_version):
        self.calls += 1
        episodes = []
        for g, task in enumerate(tasks):
            for i in range(group_size):
                e = EpisodeRecord(step, task.id, task.domain, g, i, seed=i)
                e.append([1, 2], sampled=False)
                e.append([3 + i], sampled=True)
                passed = (g + i) % 2 == 0
                e.verification = {"reward": float(passed), "passed": passed, "anomaly": None}
                episodes.append(e)
        return RolloutResult(episodes, [], {})


def test_mined_pairs_are_written_once_and_reused_on_resume(tmp_path):
    from rl.rollout.task_stream import TaskCatalog

    tasks = [Task(f"t{i}", "arithmetic", f"{i}*2", hidden={"answer": str(2 * i)}) for i in range(6)]
    catalog = TaskCatalog(loader=lambda source, split=None: tasks)
    pool = types.SimpleNamespace(source="stub", weight=1.0, split=None)
    rollout = _Rollout()
    preference = PreferenceSettings(steps=2, mine_tasks=3, mine_group=4, max_pairs_per_task=2)
    settings = types.SimpleNamespace(
        seed=0, tasks={"stub": pool}, loop=types.SimpleNamespace(max_len=64), preference=preference
    )
    exp = types.SimpleNamespace(
        workdir=str(tmp_path),
        tokenizer=ByteTokenizer(),
        settings=settings,
        catalog=catalog,
        rollout=rollout,
        is_main=True,
    )
    phase = PreferencePhase(exp, 5, 6)
    mined = phase.prepare()
    assert rollout.calls == 1 and mined["dpo/mined_pairs"] == 6 and mined["dpo/mined_pass_rate"] == 0.5
    lines = (tmp_path / PAIRS_FILE).read_text().splitlines()
    assert len(lines) == 6 and all(json.loads(line)["chosen"][0] == [1, 2, 3] for line in lines[:1])
    state = phase.data.state()
    again = PreferencePhase(exp, 5, 6)
    again.load_state({"preference_data": state}, 5)  # a resumed run: the file, not a new mining rollout
    assert rollout.calls == 1 and again.data.pairs == phase.data.pairs
