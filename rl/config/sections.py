"""The sections of an experiment's config, each a frozen dataclass: its fields, defaults, ranges and docs.

``configs/common.py`` builds a section from its dataclass's defaults
(:func:`rl.config.schema.to_config`) and :func:`rl.config.settings.load_settings` reads it back
through the same fields (:func:`rl.config.schema.load`). Sections that belong to one part of
the code live beside it and follow the same rules: ``config.rollout`` is
:class:`rl.rollout.episode_driver.RolloutConfig`, ``config.engine``
:class:`rl.generation.engine_config.EngineConfig`, ``config.algorithm.loss``
:class:`rl.learning.losses.PolicyLossConfig`, ``config.optimizer`` the :data:`OPTIMIZER_FIELDS`
of :class:`rl.learning.learner_config.LearnerConfig`, ``config.model.lora``
:class:`rl.models.lora.LoRAConfig`, ``config.preference``
:class:`rl.phases.preference.PreferenceSettings`, ``config.reward_model``
:class:`rl.phases.reward_model.RewardModelSettings` and ``config.learned_reward``
:class:`rl.phases.learned_reward.LearnedRewardSettings`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from envs.sandboxes import BACKENDS
from rl.config.schema import setting
from rl.generation.engine_config import EngineConfig
from rl.learning.advantages import ESTIMATORS
from rl.learning.learner_config import LearnerConfig
from rl.learning.losses import PolicyLossConfig
from rl.models import ModelConfig
from rl.models.lora import LoRAConfig
from rl.phases.learned_reward import LearnedRewardSettings
from rl.phases.preference import PreferenceSettings
from rl.phases.reward_model import RewardModelSettings
from rl.rollout.episode_driver import RolloutConfig

FLEETS = ("local", "ray")  # config.sandbox.fleet: one machine (or Docker URLs), or a Ray cluster
# config.optimizer: the LearnerConfig fields every learner of a run shares; learning_rate and
# warmup_steps there are RL's schedule (each other phase's section has its own).
OPTIMIZER_FIELDS = (
    *("learning_rate", "warmup_steps", "weight_decay", "grad_clip_norm", "microbatches"),
    *("b1", "b2", "eps", "end_lr_ratio", "remat", "logits_chunk_mib"),
)


@dataclasses.dataclass(frozen=True)
class PoolSettings:
    """One weighted task pool of the training or evaluation mix: ``source`` such as ``builtin:math``,
    ``arithmetic:train`` or a JSONL path, its mixing ``weight``, and a ``split`` of the source."""

    source: str
    weight: float = setting(1.0, check=lambda w: w > 0, expected="a number > 0")
    split: str | None = None


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """A preset (``rl.models.PRESETS``) with ``overrides`` of its fields (e.g. ``num_layers=4``), or,
    with ``path``, a local Hugging Face directory or a ``.gguf`` file (``configs.common.model`` resolves
    a packaged one by name, e.g. ``"smollm2-135m-instruct"``).

    ``tokenizer``: ``"byte"`` (the embedded byte-level default), ``""`` (the one in ``path``) or a
    directory / tokenizer.json / .gguf file. ``lora``: adapters to attach (``configs.common.lora``); with them
    every learner trains only the adapters. ``config``: the resolved preset (not a config field).
    """

    preset: str = "tiny"
    path: str = ""
    tokenizer: str = "byte"
    dtype: str = "float32"
    param_dtype: str = "float32"
    overrides: Mapping[str, Any] = setting(factory=dict)
    lora: LoRAConfig | None = None
    config: ModelConfig | None = setting(None, derived=True)

    @property
    def tokenizer_spec(self) -> str:
        """``"byte"``, or the tokenizer.json (or directory) the model uses (``tokenizer=""``: the one in ``path``)."""
        if self.tokenizer == "byte" or (self.tokenizer == "" and not self.path):
            return "byte"
        return self.tokenizer or self.path


@dataclasses.dataclass(frozen=True)
class MeshSettings:
    """Mesh axis sizes; -1 means "the rest of the devices" (logical→mesh rules: ``rl.models.sharding``)."""

    shape: Mapping[str, int] = setting(factory=lambda: {"data": 1, "fsdp": -1, "tensor": 1})


@dataclasses.dataclass(frozen=True)
class SandboxSettings:
    """Where tool calls run: ``bwrap`` (local, fast) or ``docker`` (``hosts``: daemon URLs).

    ``capacity``/``max_sandboxes`` of 0 mean "derive from the host's cores" (per node with
    ``fleet="ray"``). ``fleet="ray"``: a sandbox agent on every node of the Ray cluster at
    ``address`` (``"auto"``: the one ``ray start`` made; ``"local"``: start one in the process;
    ``HOST:PORT``), each running ``backend`` (or ``hosts``, as its node sees them) on its node
    (``pip install 'agentrl[ray]'``).
    """

    backend: str = setting("bwrap", choices=BACKENDS)
    hosts: tuple[str, ...] = setting((), expected="daemon URLs")
    capacity: int = setting(0, low=0)
    max_sandboxes: int = setting(0, low=0)
    fleet: str = setting("local", choices=FLEETS)
    address: str = setting("auto", check=bool, expected="'auto', 'local' or HOST:PORT")


@dataclasses.dataclass(frozen=True)
class AlgorithmSettings:
    """``name`` labels the run; what runs is the advantage estimator ``advantage``
    (``rl.learning.advantages.ESTIMATORS``) and the policy loss ``loss.name``
    (``rl.learning.losses.POLICY_LOSSES``). ``dynamic_sampling`` drops groups whose episodes all
    scored alike (DAPO); ``epochs`` passes are made over each rollout batch (PPO)."""

    name: str = setting("grpo", check=bool, expected="a label such as 'grpo'")
    advantage: str = setting("grpo", choices=lambda: ESTIMATORS)
    dynamic_sampling: bool = False
    epochs: int = setting(1, low=1)
    loss: PolicyLossConfig = setting(factory=PolicyLossConfig)


@dataclasses.dataclass(frozen=True)
class SFTSettings:
    """An optional supervised warm start before RL (``steps=0``: none), with its own schedule
    (``learning_rate``, ``warmup_steps``; the other optimizer fields are ``config.optimizer``'s).

    ``data``: a demonstration source a domain registers (``envs.demonstrations``, e.g.
    ``"arithmetic"``, built with ``options``) or ``"jsonl:PATH"`` (one conversation per line).

    ``check_every > 0`` ends SFT when its skill arrived rather than after ``steps`` (then the cap):
    the learning rate holds its peak while, every ``check_every`` steps, the policy samples one
    episode of each of ``check_tasks`` training tasks; at the first check whose pass rate is at
    least ``until_pass_rate`` the rate decays over ``anneal_steps`` and SFT ends
    (``rl.phases.sft_check``). No passing check: the decay starts ``anneal_steps`` before ``steps``.
    """

    steps: int = setting(0, low=0)
    data: str = ""
    batch_size: int = setting(32, low=1)
    learning_rate: float = 1e-3
    warmup_steps: int = setting(10, low=0)
    options: Mapping[str, Any] = setting(factory=dict)
    check_every: int = setting(0, low=0)
    check_tasks: int = setting(32, low=1)
    until_pass_rate: float = 0.0
    anneal_steps: int = setting(0, low=0)


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """Held-out evaluation every ``every`` RL steps on ``num_tasks`` tasks of ``pools``: greedy pass
    rate, and pass@1 / pass@k from ``k`` samples at ``temperature``. With ``check_tool`` and
    ``edit_tools`` (e.g. ``"run_tests"``, ``("replace",)``) it also reports the share of passing
    greedy episodes that ran the check again after an edit (``rl.phases.evaluation``)."""

    pools: Mapping[str, PoolSettings] = setting(factory=dict)
    every: int = setting(10, low=0)
    num_tasks: int = setting(100, low=1)
    k: int = setting(4, low=0)
    temperature: float = setting(1.0, low=0)
    check_tool: str = ""
    edit_tools: tuple[str, ...] = setting((), expected="a list of tool names")


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """The outer loop: ``steps`` RL steps of ``tasks_per_step`` tasks, a checkpoint every
    ``checkpoint_every`` (the last ``keep_checkpoints`` kept), sequences of at most ``max_len`` tokens.

    ``pack_sequences`` puts several trajectories in one row of the learner's batch (needs
    ``algorithm.loss.aggregation`` "token" or "sequence", which count packed segments).
    The circuit breaker stops a run whose episodes are more than ``max_anomaly_rate`` anomalies
    (the environment failed, not the model) for ``anomaly_patience`` RL steps in a row (1: off).
    ``max_staleness`` > 0 makes RL asynchronous: step t trains on episodes sampled by the policy
    of step t - 1 - max_staleness, so sampling the next steps overlaps the update (0: on-policy).
    """

    steps: int = setting(100, low=0)
    tasks_per_step: int = setting(16, low=1)
    checkpoint_every: int = setting(10, low=1)
    keep_checkpoints: int = setting(3, low=1)
    max_len: int = setting(2048, low=1)
    pack_sequences: bool = True
    max_anomaly_rate: float = setting(
        0.5, low=0, high=1, expected="a share in [0, 1] (1 turns the circuit breaker off)"
    )
    anomaly_patience: int = setting(3, low=1)
    max_staleness: int = setting(0, low=0)


PHASES = ("sft", "preference", "rl")  # a run's stages: optional SFT warm start, optional preference phase, RL
# A reward-model run (config.reward_model, rl.phases.reward_model) has this one phase and no other.
REWARD_MODEL_PHASE = "reward_model"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a run reads from its config, checked. ``config`` is the resolved config as JSON data."""

    seed: int
    model: ModelSettings
    mesh_shape: Mapping[str, int]
    tasks: Mapping[str, PoolSettings]
    sandbox: SandboxSettings
    algorithm: AlgorithmSettings
    rollout: RolloutConfig
    sft: SFTSettings
    preference: PreferenceSettings
    eval: EvalSettings
    loop: LoopSettings
    learners: Mapping[str, LearnerConfig]  # one per phase that has steps
    config: Mapping[str, Any]
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)  # its derived sizes still 0
    reward_model: RewardModelSettings = dataclasses.field(default_factory=RewardModelSettings)  # steps > 0: RM run
    learned_reward: LearnedRewardSettings | None = None  # the judge of the verifiers' 'learned' parts

    @property
    def total_steps(self) -> int:
        """SFT steps ``1..S``, preference steps ``S+1..S+P``, then RL steps: numbered across phases."""
        return self.reward_model.steps + self.sft.steps + self.preference.steps + self.loop.steps

    @property
    def rl_start(self) -> int:
        """The last step before RL (RL's first policy is this step's)."""
        return self.sft.steps + self.preference.steps

    def phase_at(self, step: int) -> str:
        """The phase step ``step`` belongs to: ``"sft"``, ``"preference"`` or ``"rl"`` (or ``"reward_model"``)."""
        if self.reward_model.steps:
            return REWARD_MODEL_PHASE
        if step <= self.sft.steps:
            return "sft"
        return "preference" if step <= self.rl_start else "rl"

    def config_json(self) -> str:
        """The text of ``config.json``."""
        return json.dumps(dict(self.config), indent=2, sort_keys=True) + "\n"
