"""Settings from a config: every bad field named with its fix, once, before anything starts (fast)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configs import common, quickstart
from envs import env_for_domain
from rl.config.settings import ConfigError, load_settings
from rl.learning.learner_config import LearnerConfig
from rl.phases.evaluation import held_out_tasks
from rl.rollout.episode_driver import ENV_MIN_TURNS
from rl.rollout.task_stream import TaskCatalog, task_stream
from rl.run import experiment
from rl.run.experiment import build, check_workdir, example_tasks

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p.stem for p in (REPO / "configs").glob("*.py") if p.stem not in ("__init__", "common"))


def _config(**fields):
    config = quickstart.get_config("test")
    for field, value in fields.items():
        *parents, leaf = field.split("__")
        node = config
        for p in parents:
            node = node[p]
        node[leaf] = value
    return config


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rollout__group_size", 1, r"config\.rollout\.group_size: expected an int >= 2"),
        ("rollout__max_context", 10, r"config\.rollout\.max_context"),
        ("rollout__max_turns", 1, rf"config\.rollout\.max_turns: expected an int >= {ENV_MIN_TURNS}"),
        ("rollout__temperature", 0.7, r"config\.rollout\.temperature: expected 1\.0 for training \(.*\), got 0\.7$"),
        ("rollout__top_p", 0.9, r"config\.rollout\.top_p: expected 1\.0 for training"),
        ("rollout__top_k", 5, r"config\.rollout\.top_k: expected 0 for training"),
        (
            "algorithm__loss__name",
            "reinforce",
            r"config\.algorithm\.loss\.name: expected one of \['gspo', 'ppo_clip'\]",
        ),
        ("algorithm__advantage", "gae", r"config\.algorithm\.advantage: expected one of \["),
        ("algorithm__loss__clip_low", -1.0, r"config\.algorithm\.loss\.clip_low"),
        ("optimizer__warmup_steps", 4, r"config\.optimizer\.warmup_steps: expected an int in \[0, 3\] \(the rl phase"),
        ("sft__warmup_steps", 10, r"config\.sft\.warmup_steps: expected an int in \[0, 4\]"),
        ("optimizer__b2", 1.0, r"config\.optimizer\.b2: expected a float in \[0, 1\)"),
        ("optimizer__logits_chunk_mib", -1, r"config\.optimizer\.logits_chunk_mib: expected an int >= 0"),
        ("sft__learning_rate", 0.0, r"config\.sft\.learning_rate: expected a finite float > 0"),
        ("sandbox__backend", "podman", r"config\.sandbox\.backend"),
        ("sandbox__fleet", "k8s", r"config\.sandbox\.fleet: expected one of \('local', 'ray'\), got 'k8s'"),
        ("sandbox__address", "", r"config\.sandbox\.address: expected 'auto', 'local' or HOST:PORT"),
        ("model__preset", "gpt5", r"config\.model\.preset: unknown model preset 'gpt5'"),
        ("model__overrides", {"num_kv_heads": 3}, r"config\.model\.overrides\.num_kv_heads"),
        ("model__path", "/no/such/model", r"config\.model\.path: expected a Hugging Face model directory"),
        ("mesh__shape", {"data": 3, "fsdp": 1, "tensor": 1}, r"config\.mesh\.shape"),
        ("loop__tasks_per_step", 0, r"config\.loop\.tasks_per_step"),
        ("sft__data", "", r"config\.sft\.data"),
        ("tasks__arithmetic__weight", 0.0, r"config\.tasks\.arithmetic\.weight: expected a number > 0"),
        ("eval__k", -1, r"config\.eval\.k: expected an int >= 0"),
    ],
)
def test_bad_fields_are_named(field, value, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(_config(**{field: value}))


def test_memory_settings_reach_every_learner_and_older_configs_keep_the_defaults():
    config = _config(optimizer=common.optimizer(1e-3, warmup_steps=1, remat=True, logits_chunk_mib=16))
    learners = load_settings(config).learners
    assert learners and all(ln.remat and ln.logits_chunk_mib == 16 for ln in learners.values())
    older = _config()
    del older.optimizer["remat"], older.optimizer["logits_chunk_mib"]
    assert all(not ln.remat and ln.logits_chunk_mib == 64 for ln in load_settings(older).learners.values())


def test_a_run_and_a_directly_built_learner_share_the_optimizer_defaults():
    """configs.common.optimizer reads AdamW's b1, b2, eps from LearnerConfig: one default, not two
    (they once disagreed: a run used b2=0.99, a notebook's LearnerConfig() 0.999)."""
    direct = LearnerConfig()
    for learner in load_settings(_config()).learners.values():
        assert (learner.b1, learner.b2, learner.eps) == (direct.b1, direct.b2, direct.eps)
    assert load_settings(_config(optimizer__b2=0.95)).learners["rl"].b2 == 0.95  # control: a config may set it


def test_gspo_is_selected_by_the_loss_name_and_packs():
    """``algorithm.loss.name="gspo"`` reaches the learner; its per-sequence mean is per packed segment."""
    config = _config(algorithm=common.gspo())
    assert config.loop.pack_sequences
    settings = load_settings(config)
    loss = settings.learners["rl"].loss
    assert (loss.name, loss.clip_low, loss.clip_high, loss.aggregation) == ("gspo", 3e-4, 4e-4, "sequence")
    assert settings.algorithm.name == "gspo" and settings.algorithm.loss == loss
    assert load_settings(_config(algorithm__loss__name="gspo")).learners["rl"].loss.name == "gspo"
    constant = _config(algorithm=common.gspo(aggregation="constant"))
    with pytest.raises(ConfigError, match=r"config\.loop\.pack_sequences: expected False unless .*'sequence'"):
        load_settings(constant)
    constant.loop.pack_sequences = False
    assert load_settings(constant).algorithm.loss.aggregation == "constant"


def test_unknown_fields_suggest_the_right_one():
    config = quickstart.get_config("test").to_dict()
    config["rollout"]["group_sise"] = 4
    with pytest.raises(ConfigError, match=r"^config\.rollout\.group_sise: no such field; did you mean group_size\?$"):
        load_settings(config)
    config = quickstart.get_config("test").to_dict()
    config["lop"] = {}
    with pytest.raises(ConfigError, match=r"^config\.lop: no such field; did you mean loop\?$"):
        load_settings(config)


def test_unknown_task_source_is_a_config_error():
    config = _config(tasks={"x": {"source": "/no/such/tasks.jsonl", "weight": 1.0, "split": None}})
    with pytest.raises(ConfigError, match=r"config\.tasks\.x\.source"):
        load_settings(config)


def test_rules_that_only_training_needs_do_not_bind_an_eval_only_run():
    settings = load_settings(_config(loop__steps=0, rollout__temperature=0.7, rollout__group_size=1))
    assert settings.rollout.temperature == 0.7 and "rl" not in settings.learners
    batch = load_settings(_config(algorithm__advantage="batch", rollout__group_size=1))  # a batch baseline
    assert batch.rollout.group_size == 1


def test_max_turns_minimum_is_the_environments():
    env_cls = env_for_domain("arithmetic")
    task = next(iter(TaskCatalog().get("arithmetic:train")))
    env_cls(tasks=[task], max_turns=ENV_MIN_TURNS).close()
    with pytest.raises(ValueError, match="max_turns"):
        env_cls(tasks=[task], max_turns=ENV_MIN_TURNS - 1)
    assert load_settings(_config(rollout__max_turns=ENV_MIN_TURNS)).rollout.max_turns == ENV_MIN_TURNS


def test_settings_are_frozen_and_typed():
    settings = load_settings(quickstart.get_config("test"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.seed = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        settings.learners["rl"] = None  # type: ignore[index]
    assert settings.learners["sft"].objective == "sft" and settings.learners["rl"].objective == "policy"
    assert (settings.total_steps, settings.phase_at(4), settings.phase_at(5)) == (7, "sft", "rl")


def test_each_task_source_is_loaded_once():
    from envs import load_tasks

    calls = []
    catalog = TaskCatalog(lambda spec, split=None: calls.append((spec, split)) or load_tasks(spec, split=split))
    settings = load_settings(quickstart.get_config("test"), catalog)
    example_tasks(settings, catalog)
    held_out_tasks(settings.eval, catalog)
    next(iter(task_stream(settings.tasks, catalog, seed=0)))
    assert sorted(calls) == [("arithmetic:eval", None), ("arithmetic:train", None)]


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_configs_check_their_variants(name):
    module = importlib.import_module(f"configs.{name}")
    load_settings(module.get_config("test"))
    with pytest.raises(
        ValueError, match=rf"--config=configs/{name}\.py:tset: no variant 'tset'; use configs/{name}\.py:test"
    ):
        module.get_config("tset")


@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_runs_on_a_ray_fleet_by_flag(name):
    """``--config.sandbox.fleet=ray`` (and ``address``) override any shipped config; the default is local."""
    config = importlib.import_module(f"configs.{name}").get_config("test")
    assert load_settings(config).sandbox.fleet == "local"
    config.update_from_flattened_dict({"sandbox.fleet": "ray", "sandbox.address": "10.0.0.1:6379"})
    sandbox = load_settings(config).sandbox
    assert (sandbox.fleet, sandbox.address) == ("ray", "10.0.0.1:6379")


def test_a_config_from_before_the_fleet_field_still_loads():
    config = json.loads(quickstart.get_config("test").to_json())
    del config["sandbox"]["fleet"], config["sandbox"]["address"]
    assert (load_settings(config).sandbox.fleet, load_settings(config).sandbox.address) == ("local", "auto")


def test_a_run_may_resume_on_another_fleet(tmp_path):
    (tmp_path / "config.json").write_text(load_settings(quickstart.get_config("test")).config_json())
    check_workdir(load_settings(_config(sandbox__fleet="ray", sandbox__address="local")), tmp_path)


def test_a_workdir_is_refused_for_another_experiment_naming_the_fields(tmp_path):
    settings = load_settings(quickstart.get_config("test"))
    (tmp_path / "config.json").write_text(settings.config_json())
    check_workdir(settings, tmp_path)  # the same experiment resumes
    check_workdir(load_settings(_config(loop__steps=5)), tmp_path)  # ... and may be extended
    other = load_settings(_config(rollout__group_size=3, seed=2))
    with pytest.raises(
        ConfigError,
        match=r"holds a different experiment \(config\.json differs in rollout\.group_size: 4 -> 3; seed: 0 -> 2\)",
    ):
        check_workdir(other, tmp_path)


def test_a_failed_start_leaves_the_workdir_usable(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise ConfigError("config.model.path: not a model")

    monkeypatch.setattr(experiment, "make_model", broken)
    catalog = TaskCatalog()
    with pytest.raises(ConfigError):
        build(load_settings(quickstart.get_config("test"), catalog), tmp_path, catalog)
    assert not (tmp_path / "config.json").exists()  # the fixed command is not taken for another experiment


# -- as a new user meets them: one line on stderr, exit status 2 -------------------------------------
def _train(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "rl.train", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--config=configs/quickstart.py:tset"],
            "error: --config=configs/quickstart.py:tset: no variant 'tset'; use configs/quickstart.py:test, "
            "or configs/quickstart.py alone for the full experiment",
        ),
        (
            ["--config=configs/quickstart.py:test", "--config.rollout.group_sise=4"],
            "error: config.rollout.group_sise: no such field; did you mean group_size?",
        ),
        (
            ["--config=configs/quickstart.py:test", "--config.rollout.temperature=0.7"],
            "error: config.rollout.temperature: expected 1.0 for training (the learner's importance ratios use "
            "the sampler's temperature-1, unfiltered log-probs), got 0.7",
        ),
    ],
)
def test_config_mistakes_end_in_one_line(tmp_path, flags, message):
    proc = _train(*flags, f"--workdir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == message and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "run" / "config.json").exists()


# What a config file (not a flag) sets: free-form dicts, and values of another type than the default's.
MISTAKES_IN_FILES = {
    "misspelt env_kwargs domain": (
        'config.rollout.env_kwargs = {"arithmetc": {"max_turns": 3}}',
        "error: config.rollout.env_kwargs.arithmetc: no such registered domain; did you mean arithmetic?",
    ),
    "misspelt environment keyword": (
        'config.rollout.env_kwargs = {"arithmetic": {"max_turn": 3}}',
        "error: config.rollout.env_kwargs.arithmetic.max_turn: no such argument of ArithmeticEnv; "
        "did you mean max_turns?",
    ),
    "misspelt sft.options key": (
        'config.sft.options = {"num_task": 8}',
        "error: config.sft.options.num_task: no such option of sft.data='arithmetic'; did you mean num_tasks?",
    ),
    "wrong type": (
        'with config.ignore_type():\n        config.loop.checkpoint_every = "1"',
        "error: config.loop.checkpoint_every: expected an int >= 1, got '1'",
    ),
    "out of range": (
        "config.rollout.group_size = 1",
        "error: config.rollout.group_size: expected an int >= 2 (the advantage estimator needs 2 valid episodes "
        "of a task), got 1",
    ),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES_IN_FILES))
def test_config_file_mistakes_end_in_one_line_before_anything_starts(tmp_path, mistake):
    line, message = MISTAKES_IN_FILES[mistake]
    config = tmp_path / "bad.py"
    config.write_text(
        "from configs import quickstart\n\n\ndef get_config(arg=None):\n"
        f"    config = quickstart.get_config('test')\n    {line}\n    return config\n"
    )
    proc = _train(f"--config={config}", f"--workdir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == message and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "run").exists()  # nothing started: not even the workdir


def test_an_empty_model_directory_is_named_and_the_workdir_stays_usable(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = _train(
        "--config=configs/quickstart.py:test",
        f"--config.model.path={tmp_path / 'empty'}",
        f"--workdir={tmp_path / 'run'}",
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: config.model.path: expected a Hugging Face model")
    assert not (tmp_path / "run" / "config.json").exists()
    check_workdir(load_settings(quickstart.get_config("test")), tmp_path / "run")  # the fixed command may start


def test_config_json_round_trips_into_the_same_settings():
    settings = load_settings(quickstart.get_config("test"))
    again = load_settings(json.loads(settings.config_json()))
    assert again == settings
