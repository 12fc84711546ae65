"""Ending the SFT warm start when its skill arrived (``sft.check_every``, ``sft.until_pass_rate``).

- The check samples real episodes of *training* tasks (never the held-out ones), the same tasks
  on every check.
- The learning rate holds its peak until a check passes at step c, then decays over
  ``anneal_steps`` A; SFT steps c+A+1..S-1 are skipped, step S still evaluates and checkpoints,
  RL keeps its step numbers, and a run resumed in the middle of the decay ends exactly where the
  uninterrupted run ends.
- Bad check settings name their field.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from configs import quickstart
from rl.config.settings import ConfigError, load_settings
from rl.phases import sft_check
from rl.phases.evaluation import held_out_tasks
from rl.rollout.task_stream import TaskCatalog
from rl.run.experiment import build
from rl.run.metrics import read_metrics, without_timing
from rl.run.trainer import Trainer
from tests.rl.test_train import _final_params
from tests.sandbox.conftest import backend_or_skip

SFT_STEPS, CHECK_EVERY, PASSES_AT, ANNEAL, RL_STEPS = 10, 2, 4, 3, 2
ENDS_AT = PASSES_AT + ANNEAL


def _config():
    config = quickstart.get_config("test")
    config.sft.steps = SFT_STEPS
    config.sft.check_every = CHECK_EVERY
    config.sft.check_tasks = 4
    config.sft.until_pass_rate = 0.5
    config.sft.anneal_steps = ANNEAL
    config.loop.steps = RL_STEPS
    config.loop.keep_checkpoints = 20
    return config


def _train(workdir: Path) -> None:
    catalog = TaskCatalog()
    exp = build(load_settings(_config(), catalog), workdir, catalog)
    try:
        Trainer(exp, synchronous=True).run()
    finally:
        exp.close()


def test_check_settings_name_their_field():
    config = _config()
    config.sft.until_pass_rate = 0.0
    with pytest.raises(ConfigError, match=r"config\.sft\.until_pass_rate: expected a pass rate in \(0, 1\]"):
        load_settings(config)
    config = _config()
    config.sft.check_every = -1
    with pytest.raises(ConfigError, match=r"config\.sft\.check_every: expected an int >= 0"):
        load_settings(config)
    config = _config()
    config.sft.anneal_steps = 0
    with pytest.raises(ConfigError, match=r"config\.sft\.anneal_steps: expected an int in \[1, 8\]"):
        load_settings(config)
    config = _config()
    for key in ("check_every", "check_tasks", "until_pass_rate", "anneal_steps"):
        del config.sft[key]
    assert load_settings(config).sft.check_every == 0  # a config from before the check: no check


def test_check_tasks_are_training_tasks_never_held_out_ones():
    catalog = TaskCatalog()
    config = _config()
    config.sft.check_tasks = 24
    config.eval.num_tasks = 24
    settings = load_settings(config, catalog)
    tasks = sft_check.check_tasks(settings, catalog)
    assert len(tasks) == 24 and [t.id for t in tasks] == [t.id for t in sft_check.check_tasks(settings, catalog)]
    held_out = {t.prompt for t in held_out_tasks(settings.eval, catalog)}
    assert held_out and not held_out & {t.prompt for t in tasks}


@pytest.fixture(scope="module")
def early_run(tmp_path_factory) -> Path:
    """A run whose check "passes" at step PASSES_AT: the real check runs (real sandboxes) and its
    verdict is replaced, since a few-step model passes nothing."""
    backend_or_skip("bwrap")
    real = sft_check.SFTCheck.run
    patch = pytest.MonkeyPatch()
    patch.setattr(sft_check.SFTCheck, "run", lambda self, step: (step >= PASSES_AT, real(self, step)[1]))
    workdir = tmp_path_factory.mktemp("sft_check") / "run"
    try:
        _train(workdir)
    finally:
        patch.undo()
    return workdir


@pytest.mark.slow
def test_the_passing_check_starts_the_decay_sft_ends_after_it_and_rl_keeps_its_steps(early_run):
    records = {r["step"]: r for r in read_metrics(early_run)}
    trained = list(range(1, ENDS_AT + 1))
    assert sorted(records) == [0, *trained, SFT_STEPS, *range(SFT_STEPS + 1, SFT_STEPS + RL_STEPS + 1)]
    checked = [s for s, r in records.items() if "sft/check_pass_rate" in r]
    assert checked == [2, 4]  # none once the decay started
    peak = quickstart.get_config("test").sft.learning_rate
    rates = [records[s]["sft/learning_rate"] for s in trained]
    warmup = _config().sft.warmup_steps
    assert rates[warmup - 1 : PASSES_AT + 1] == pytest.approx([peak] * (PASSES_AT + 2 - warmup))  # the plateau
    assert all(a > b for a, b in zip(rates[PASSES_AT:], rates[PASSES_AT + 1 :], strict=False))  # then the decay
    assert all(records[s]["sft/check_anomaly_rate"] == 0.0 for s in checked)  # real episodes, real sandboxes
    last_sft = records[SFT_STEPS]
    assert last_sft["phase"] == "sft" and last_sft["sft/ended_at"] == ENDS_AT and "sft/loss" not in last_sft
    assert "eval/greedy_pass_rate" in last_sft  # the after-SFT evaluation
    assert [records[s]["phase"] for s in range(SFT_STEPS + 1, SFT_STEPS + RL_STEPS + 1)] == ["rl"] * RL_STEPS
    saved = sorted(int(p.name) for p in (early_run / "checkpoints").iterdir() if p.name.isdigit())
    assert ENDS_AT in saved and SFT_STEPS in saved and not set(saved) & set(range(ENDS_AT + 1, SFT_STEPS))


@pytest.mark.slow
def test_a_run_resumed_during_the_decay_ends_where_the_uninterrupted_one_does(early_run, tmp_path, caplog):
    """Resumed in the middle of the decay: the restored learner must decay on from there (the
    check's verdict comes from the checkpoint) and must not train the skipped steps."""
    workdir = tmp_path / "resumed"
    shutil.copytree(early_run, workdir)
    for ckpt in (workdir / "checkpoints").iterdir():
        if ckpt.name.isdigit() and int(ckpt.name) > PASSES_AT + 1:
            shutil.rmtree(ckpt)
    with caplog.at_level(logging.INFO, logger="rl.run.trainer"):
        _train(workdir)
    assert f"resumed from checkpoint {PASSES_AT + 1} (sft phase)" in caplog.text  # not a restart from step 0
    assert without_timing(read_metrics(workdir)) == without_timing(read_metrics(early_run))
    a, b = _final_params(early_run), _final_params(workdir)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_the_schedule_holds_its_peak_until_decay_start_then_follows_the_cosine():
    from rl.learning.train_step import lr_schedule

    plain = lr_schedule(1.0, warmup_steps=2, total_steps=12, end_lr_ratio=0.1)
    wsd = lr_schedule(1.0, warmup_steps=2, total_steps=12, end_lr_ratio=0.1, decay_start=7)
    assert [float(wsd(c)) for c in range(8)] == pytest.approx([0.5] + [1.0] * 7)
    # the decay from step 7 to 12 is the plain cosine's shape squeezed into those 5 steps
    squeezed = lr_schedule(1.0, warmup_steps=0, total_steps=5, end_lr_ratio=0.1)
    assert [float(wsd(c)) for c in range(7, 14)] == pytest.approx([float(squeezed(c)) for c in range(7)])
    assert float(plain(3)) < 1.0 and float(wsd(20)) == pytest.approx(0.1)
