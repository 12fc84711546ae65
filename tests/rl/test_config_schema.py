"""The config schema (rl.config.schema): one statement of each field, read and checked by one walker (fast)."""

from __future__ import annotations

import dataclasses
import json
import types
import typing

import ml_collections as mlc
import pytest

from configs import common, quickstart, repair_from_scratch
from rl.config import schema, sections
from rl.config.errors import ConfigError
from rl.config.settings import load_settings
from rl.generation.engine_config import EngineConfig
from rl.generation.sampler import SamplerConfig
from rl.learning.learner_config import LearnerConfig
from rl.learning.losses import PolicyLossConfig
from rl.learning.preference import PreferenceConfig
from rl.models.lora import LoRAConfig
from rl.phases.learned_reward import LearnedRewardSettings
from rl.phases.preference import PreferenceSettings
from rl.phases.reward_model import RewardModelSettings
from rl.rollout.episode_driver import RolloutConfig
from rl.run.experiment import engine_config

SECTIONS = [
    sections.ModelSettings,
    sections.MeshSettings,
    sections.SandboxSettings,
    sections.AlgorithmSettings,
    sections.SFTSettings,
    sections.EvalSettings,
    sections.LoopSettings,
    RolloutConfig,
    EngineConfig,
    PolicyLossConfig,
    LoRAConfig,
    PreferenceSettings,
    RewardModelSettings,
]


@pytest.mark.parametrize("cls", SECTIONS, ids=lambda c: c.__name__)
def test_a_section_built_from_its_defaults_loads_back_to_its_defaults(cls):
    assert schema.load(cls, schema.to_config(cls).to_dict(), "x") == cls()


def test_builders_state_no_default_of_their_own():
    """A field a builder is not given is the dataclass's default, whatever the builder."""
    assert common.loop().to_dict() == schema.defaults(sections.LoopSettings)
    assert common.rollout(group_size=4).group_size == 4
    assert common.rollout(group_size=4).max_turns == RolloutConfig.max_turns
    assert common.engine().to_dict() == schema.defaults(EngineConfig)
    assert common.optimizer().to_dict() == schema.defaults(LearnerConfig, only=sections.OPTIMIZER_FIELDS)
    assert common.optimizer(1e-3).learning_rate == 1e-3
    assert common.preference(steps=2).to_dict() == {**schema.defaults(PreferenceSettings), "steps": 2}
    # a section that restates another's fields takes that one's defaults (the loss of the preference phase)
    assert {k: getattr(PreferenceSettings(), k) for k in schema.fields(PreferenceConfig)} == dataclasses.asdict(
        PreferenceConfig()
    )
    assert common.gspo().loss.name == "gspo" and common.ppo().advantage == "batch"


def test_a_builder_refuses_a_field_its_section_lacks():
    with pytest.raises(TypeError, match=r"LoopSettings: no field 'step'"):
        common.loop(step=3)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        # an unknown field at any depth, with the closest name
        (lambda c: c.algorithm.loss.__setitem__("clip_hgh", 0.3), r"^config\.algorithm\.loss\.clip_hgh: no such field; did you mean clip_high\?$"),
        (lambda c: c.tasks.arithmetic.__setitem__("wieght", 2.0), r"^config\.tasks\.arithmetic\.wieght: no such field; did you mean weight\?$"),
        # a wrong type, nested too
        (lambda c: c.model.__setitem__("lora", {"rank": "8"}), r"^config\.model\.lora\.rank: expected an int >= 1, got '8'$"),
        (lambda c: c.sandbox.__setitem__("hosts", "unix:///x"), r"^config\.sandbox\.hosts: expected daemon URLs, got 'unix:///x'$"),
        (lambda c: c.loop.__setitem__("pack_sequences", 1), r"^config\.loop\.pack_sequences: expected True or False, got 1$"),
        # out of range: the field's own range, and the dataclass's own rules named by the config path
        (lambda c: c.loop.__setitem__("max_anomaly_rate", 1.5), r"^config\.loop\.max_anomaly_rate: expected a share in \[0, 1\]"),
        (lambda c: c.rollout.__setitem__("top_p", 0.0), r"^config\.rollout\.top_p: expected a number in \(0, 1\], got 0\.0$"),
        (lambda c: c.rollout.__setitem__("step_deadline_s", 5.0), r"^config\.rollout\.step_deadline_s: expected seconds > tool_timeout_s"),
        (lambda c: c.model.__setitem__("lora", {"target_modules": ["q", "qq"]}), r"^config\.model\.lora\.target_modules: expected distinct names"),
    ],
)  # fmt: skip
def test_every_mistake_is_one_line_naming_the_field_path(edit, message):
    config = json.loads(quickstart.get_config("test").to_json_best_effort())
    config = mlc.ConfigDict(config)
    with config.ignore_type():
        edit(config)
    with pytest.raises(ConfigError, match=message) as info:
        load_settings(config)
    assert "\n" not in str(info.value)


def test_a_config_from_before_a_field_existed_takes_its_default():
    config = json.loads(quickstart.get_config("test").to_json_best_effort())
    for section, field in [
        ("loop", "max_staleness"),
        ("sft", "check_every"),
        ("eval", "edit_tools"),
        ("rollout", "engine"),
    ]:
        del config[section][field]
    settings = load_settings(config)
    assert settings.loop.max_staleness == sections.LoopSettings.max_staleness
    assert settings.sft.check_every == 0 and settings.eval.edit_tools == () and settings.rollout.engine is True


def test_a_dataclass_built_directly_is_checked_by_the_same_ranges():
    """Direct construction and the loader share one rule and one wording; only the prefix differs."""
    with pytest.raises(ConfigError, match=r"^LearnerConfig\.b2: expected a float in \[0, 1\), got 1\.0$"):
        LearnerConfig(b2=1.0)
    config = json.loads(quickstart.get_config("test").to_json_best_effort())
    config["optimizer"]["b2"] = 1.0
    with pytest.raises(ConfigError, match=r"^config\.optimizer\.b2: expected a float in \[0, 1\), got 1\.0$"):
        load_settings(config)
    with pytest.raises(ConfigError, match=r"^RolloutConfig\.max_context: expected an int > max_new_tokens"):
        RolloutConfig(max_context=8, max_new_tokens=16)
    with pytest.raises(ConfigError, match=r"^LearnerConfig\.loss: expected a rl\.learning\.losses\.PolicyLossConfig"):
        LearnerConfig(loss={})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^LearnedRewardSettings\.clip: expected a number > 0"):
        schema.validate(LearnedRewardSettings(path="x", clip=0.0))


@pytest.mark.parametrize(
    ("cls", "field", "empty_derived"),
    [(SamplerConfig, "batch_buckets", False), (EngineConfig, "prefill_buckets", True)],
)
def test_shape_buckets_share_one_rule_and_a_list_is_stored_as_a_tuple(cls, field, empty_derived):
    built = cls(**{field: [1, 4]})
    assert getattr(built, field) == (1, 4) and hash(built) == hash(cls(**{field: (1, 4)}))
    bad_ones = [(2, 1), (0, 1), (1, 1), (1.0,)]
    if empty_derived:  # the engine's run derives its buckets from max_len (EngineConfig.resolved)
        assert getattr(cls(**{field: []}), field) == ()
    else:
        bad_ones.append(())
    for bad in bad_ones:
        with pytest.raises(ConfigError, match=rf"^{cls.__name__}\.{field}: expected increasing ints >= 1"):
            cls(**{field: bad})


def test_the_engine_sizes_a_run_leaves_at_zero_follow_from_the_experiment():
    """config.engine: 0 / [] are derived from the rollout and the loop, given values are kept, and
    rollout.reproducible fixes every shape (one window, fixed prefill rows, no compaction)."""
    config = repair_from_scratch.get_config()
    derived = engine_config(load_settings(config))
    r = config.rollout
    assert derived.slots == config.loop.tasks_per_step * r.group_size
    assert derived.max_len == r.max_context + r.max_new_tokens
    assert derived.prefill_buckets[0] == 16 and derived.prefill_buckets[-1] == min(derived.max_len, 1024)
    assert (derived.compact_decode, derived.prefill_rows) == (True, 0) and derived.window_min < derived.max_len
    config.engine.slots, config.engine.decode_steps = 5, 2
    config.rollout.reproducible = True
    exact = engine_config(load_settings(config))
    assert (exact.slots, exact.decode_steps) == (5, 2)
    assert (exact.compact_decode, exact.prefill_rows, exact.window_min) == (False, 5, exact.max_len)
    config.engine.window_min = 0
    with pytest.raises(ConfigError, match=r"^config\.engine\.window_min: expected an int >= 1, got 0$"):
        load_settings(config)


def test_derived_fields_are_not_config_fields():
    assert "max_len" not in schema.fields(PolicyLossConfig) and "config" not in schema.fields(sections.ModelSettings)
    assert "lora" not in common.model().to_dict()  # an optional sub-section is absent until a config sets it
    settings = load_settings(quickstart.get_config("test"))
    assert settings.algorithm.loss.max_len == settings.loop.max_len


def test_every_section_field_has_a_type_the_walker_knows():
    """A field whose type the walker cannot check would pass anything: every field's type is one it checks."""
    known = {bool, int, float, str}
    for cls in [*SECTIONS, sections.PoolSettings, LearnerConfig, LearnedRewardSettings, SamplerConfig, EngineConfig]:
        hints = typing.get_type_hints(cls)
        for name in schema.fields(cls):
            hint = hints[name]
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            base = args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) else hint
            origin = typing.get_origin(base)
            ok = (
                base in known
                or dataclasses.is_dataclass(base)
                or origin in (tuple, typing.get_origin(typing.Mapping[str, int]))
            )
            assert ok, f"{cls.__name__}.{name}: {hint}"
