"""An experiment's settings: the config read once, every field checked once, the result frozen.

A config file gives an ``ml_collections.ConfigDict`` (``configs/common.py``
builds them). :func:`load_settings` turns it into a frozen, typed
:class:`Settings` — including the rollout and per-phase learner configs — and
is the only place that judges a field: everything downstream takes the typed
values as they are. So a bad experiment fails here, before a model is loaded or
a sandbox started, with an error that names the field and says what would be
right (``config.rollout.temperature: expected 1.0 for training (...), got 0.7``);
nothing is silently clamped, and the same rule is never checked twice with
different bounds. Tasks are loaded through the run's :class:`TaskCatalog`, so
checking them here costs nothing later.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import ml_collections as mlc

from rl.config.errors import (  # noqa: F401 - ConfigError, unknown_field_message: re-exported
    ConfigError,
    need,
    need_bool,
    need_int,
    need_positive,
    section,
    unknown_field_message,
)
from rl.config.registry_checks import check_env_kwargs, check_sft_options
from rl.learning.advantages import ESTIMATORS
from rl.learning.learner_config import RAW_LOGPROB_TEMPERATURE, LearnerConfig
from rl.learning.losses import PACKABLE_AGGREGATIONS, PolicyLossConfig
from rl.learning.preference import PreferenceConfig
from rl.models import ModelConfig, get_model_config
from rl.models.lora import LoRAConfig
from rl.models.sharding import MESH_AXES, resolve_mesh_shape
from rl.phases.learned_reward import LearnedRewardSettings, parse_learned_reward
from rl.phases.preference import MINED, PreferenceSettings
from rl.phases.reward_model import RewardModelSettings, parse_reward_model
from rl.phases.sft_data import is_sft_source, sft_sources
from rl.rollout.lockstep import RolloutConfig
from rl.rollout.task_stream import TaskCatalog

PHASES = ("sft", "preference", "rl")  # a run's stages: optional SFT warm start, optional preference phase, RL
# A reward-model run (config.reward_model, rl.phases.reward_model) has this one phase and no other.
REWARD_MODEL_PHASE = "reward_model"
BACKENDS = ("bwrap", "docker")
FLEETS = ("local", "ray")  # config.sandbox.fleet: one machine (or Docker URLs), or a Ray cluster


@dataclasses.dataclass(frozen=True)
class PoolSettings:
    """One weighted task pool of the training or evaluation mix."""

    source: str
    weight: float
    split: str | None


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """A preset (``config`` resolved, overrides applied) or, with ``path``, a Hugging Face directory.

    ``lora``: adapters to attach (``configs.common.lora``); with them every learner trains only the adapters.
    """

    preset: str
    path: str
    tokenizer: str
    dtype: str
    param_dtype: str
    overrides: Mapping[str, Any]
    config: ModelConfig | None
    lora: LoRAConfig | None = None


@dataclasses.dataclass(frozen=True)
class SandboxSettings:
    backend: str
    hosts: tuple[str, ...]
    capacity: int
    max_sandboxes: int
    # "local": a WarmPool over `hosts`; "ray": an agent per node of a Ray cluster, each over `hosts` as
    # seen from its node (its own unix socket) or `backend` alone.
    fleet: str = "local"
    address: str = "auto"  # the Ray cluster of fleet="ray"


@dataclasses.dataclass(frozen=True)
class AlgorithmSettings:
    """``name`` labels the algorithm; ``advantage`` and ``loss.name`` pick the registered pieces that run."""

    name: str
    advantage: str
    dynamic_sampling: bool
    epochs: int
    loss: PolicyLossConfig


@dataclasses.dataclass(frozen=True)
class SFTSettings:
    steps: int  # with check_every > 0: the most SFT steps (rl.phases.sft_check)
    data: str
    batch_size: int
    options: Mapping[str, Any]
    # Ending SFT when the skill arrived: every check_every steps, one sampled episode of each of
    # check_tasks training tasks; at the first check whose pass rate is >= until_pass_rate the
    # learning rate decays over anneal_steps and SFT ends (rl.phases.sft_check).
    check_every: int = 0
    check_tasks: int = 32
    until_pass_rate: float = 0.0
    anneal_steps: int = 0


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """Held-out evaluation: greedy pass rate, and pass@1 / pass@k from ``k`` samples at ``temperature``."""

    pools: Mapping[str, PoolSettings]
    every: int
    num_tasks: int
    k: int
    temperature: float
    # The workflow metric (rl.phases.evaluation.tool_use_metrics): the tool that checks the work and
    # the tools that change it; "" / (): no workflow metric, only tool calls by name.
    check_tool: str = ""
    edit_tools: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    steps: int
    tasks_per_step: int
    checkpoint_every: int
    keep_checkpoints: int
    max_len: int
    pack_sequences: bool
    # The circuit breaker: the run stops when more than this share of a step's episodes are
    # anomalies (the environment failed, not the model) for ``anomaly_patience`` steps in a row.
    max_anomaly_rate: float = 0.5
    anomaly_patience: int = 3
    # Asynchronous RL: step t trains on episodes sampled by the policy of step t - 1 - max_staleness
    # (0: on-policy, the synchronous loop); sampling the next steps overlaps the update.
    max_staleness: int = 0


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


# -- field checks ------------------------------------------------------------------------------
def _names(cls: type, *, drop: tuple[str, ...] = ()) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in drop)


def _renamed(exc: Exception, prefix: str, where: str) -> ConfigError:
    """A library config's ``Type.field: ...`` error as ``config.<where>.field: ...``."""
    return ConfigError(re.sub(rf"^{prefix}\.", f"config.{where}.", str(exc)))


# -- sections -------------------------------------------------------------------------------------
_TOP = (
    *("seed", "model", "mesh", "tasks", "sandbox", "algorithm", "optimizer", "rollout", "sft", "preference"),
    *("eval", "loop", "reward_model", "learned_reward"),
)
_OPTIMIZER = (
    *("learning_rate", "warmup_steps", "weight_decay", "grad_clip_norm", "microbatches"),
    *("b1", "b2", "eps", "end_lr_ratio", "remat", "logits_chunk_mib"),
)
_SFT = ("steps", "data", "batch_size", "learning_rate", "warmup_steps", "options")
# Optional: configs from before the check have none of them (no check).
_SFT_CHECK = ("check_every", "check_tasks", "until_pass_rate", "anneal_steps")
# Optional: configs from before the workflow metric have neither (no workflow metric).
_EVAL_WORKFLOW = ("check_tool", "edit_tools")


def _model(node: Any) -> ModelSettings:
    m = section(node, "model", _names(ModelSettings, drop=("config",)), optional=("lora",))
    m["lora"] = _lora(m.get("lora"))
    config = None
    if m["path"]:
        path = Path(m["path"])
        found = (path / "config.json").is_file() and any(path.glob("*.safetensors"))
        why = "a Hugging Face model directory (config.json + *.safetensors), or '' to use config.model.preset"
        need(found, "model.path", why, m["path"])
    else:
        try:
            config = get_model_config(m["preset"], dtype=m["dtype"], param_dtype=m["param_dtype"], **m["overrides"])
        except KeyError as exc:
            raise ConfigError(f"config.model.preset: {exc.args[0]}") from exc
        except (TypeError, ValueError) as exc:
            field = re.match(r"ModelConfig\.(\w+)", str(exc))
            where = "model" if field and field.group(1) in ("dtype", "param_dtype") else "model.overrides"
            raise _renamed(exc, "ModelConfig", where) from exc
    spec = m["tokenizer"]
    hf = spec if spec not in ("", "byte") else m["path"] if spec == "" else ""
    if hf:
        file = Path(hf) / "tokenizer.json" if Path(hf).is_dir() else Path(hf)
        need(file.is_file(), "model.tokenizer", "'byte', or a tokenizer.json (or its directory)", spec or m["path"])
    return ModelSettings(**{**m, "overrides": types.MappingProxyType(dict(m["overrides"]))}, config=config)


def _lora(node: Any) -> LoRAConfig | None:
    """``config.model.lora`` (absent or None: no adapters, full fine-tuning)."""
    if node is None:
        return None
    lora = section(
        node, "model.lora", _names(LoRAConfig), optional=("dropout", "target_modules", "param_dtype", "seed")
    )
    if "target_modules" in lora:
        targets = lora["target_modules"]
        need(isinstance(targets, list | tuple), "model.lora.target_modules", "a list of projection names", targets)
        lora["target_modules"] = tuple(targets)
    try:
        return LoRAConfig(**lora)
    except (TypeError, ValueError) as exc:
        raise _renamed(exc, "LoRAConfig", "model.lora") from exc


def _pools(node: Any, where: str, catalog: TaskCatalog) -> dict[str, PoolSettings]:
    import envs  # registers the domains

    need(isinstance(node, Mapping), where, "a mapping of pool name -> configs.common.pool(...)", node)
    out = {}
    for name, raw in node.items():
        p = section(raw, f"{where}.{name}", _names(PoolSettings), optional=("weight", "split"))
        pool = PoolSettings(p["source"], need_positive(p.get("weight", 1.0), f"{where}.{name}.weight"), p.get("split"))
        try:
            source = catalog.pool(pool)
        except Exception as exc:  # noqa: BLE001 - any loader failure is a config error here
            raise ConfigError(f"config.{where}.{name}.source: {exc}") from exc
        need(len(source) > 0, f"{where}.{name}", "a pool with tasks (check source and split)", raw)
        for domain in sorted({t.domain for t in source}):
            registered = f"tasks of a registered domain {sorted(envs.DOMAINS)}"
            need(domain in envs.DOMAINS, f"{where}.{name}", registered, domain)
        out[name] = pool
    return out


def _algorithm(node: Any, max_len: int) -> AlgorithmSettings:
    a = section(node, "algorithm", _names(AlgorithmSettings))
    need(isinstance(a["name"], str) and bool(a["name"]), "algorithm.name", "a label such as 'grpo'", a["name"])
    need(a["advantage"] in ESTIMATORS, "algorithm.advantage", f"one of {sorted(ESTIMATORS)}", a["advantage"])
    need_int(a["epochs"], "algorithm.epochs", 1)
    need_bool(a["dynamic_sampling"], "algorithm.dynamic_sampling")
    loss = section(
        a["loss"], "algorithm.loss", _names(PolicyLossConfig, drop=("max_len",)), optional=("name", "tis_cap")
    )
    try:
        a["loss"] = PolicyLossConfig(**loss, max_len=max_len)
    except (TypeError, ValueError) as exc:
        raise _renamed(exc, "PolicyLossConfig", "algorithm.loss") from exc
    return AlgorithmSettings(**a)


def _rollout(node: Any, training: bool, min_group: int) -> RolloutConfig:
    r = section(node, "rollout", _names(RolloutConfig), optional=("engine", "engine_slots", "step_deadline_s"))
    r["env_kwargs"] = {k: dict(v) for k, v in dict(r["env_kwargs"]).items()}
    try:
        rollout = RolloutConfig(**r)
    except (TypeError, ValueError) as exc:
        raise _renamed(exc, "rollout", "rollout") from exc
    check_env_kwargs(rollout.env_kwargs)
    if training:
        why = "for training (the learner's importance ratios use the sampler's temperature-1, unfiltered log-probs)"
        need(rollout.temperature == RAW_LOGPROB_TEMPERATURE, "rollout.temperature", f"1.0 {why}", rollout.temperature)
        need(rollout.top_p == 1.0, "rollout.top_p", f"1.0 {why}", rollout.top_p)
        need(rollout.top_k == 0, "rollout.top_k", f"0 {why}", rollout.top_k)
        expected = f"an int >= {min_group} (the advantage estimator needs {min_group} valid episodes of a task)"
        need(rollout.group_size >= min_group, "rollout.group_size", expected, rollout.group_size)
    return rollout


def _learner(
    phase: str,
    optimizer: dict[str, Any],
    schedule: str,
    values: dict[str, Any],
    steps: int,
    loss: PolicyLossConfig,
    trainable: str = "all",
    preference: PreferenceConfig | None = None,
) -> LearnerConfig:
    """The learner of one phase: ``steps`` optimizer steps, rate and warmup from ``config.<schedule>``;
    ``trainable="lora"`` when the model has adapters (``config.model.lora``)."""
    warmup = values["warmup_steps"]
    why = f"an int in [0, {steps}] (the {phase} phase takes {steps} optimizer steps)"
    need(isinstance(warmup, int) and 0 <= warmup <= steps, f"{schedule}.warmup_steps", why, warmup)
    shared = {k: v for k, v in optimizer.items() if k not in ("learning_rate", "warmup_steps")}
    try:
        return LearnerConfig(
            objective={"sft": "sft", "preference": "preference"}.get(phase, "policy"),
            learning_rate=values["learning_rate"],
            warmup_steps=warmup,
            total_steps=steps,
            temperature=RAW_LOGPROB_TEMPERATURE,
            loss=loss,
            trainable=trainable,
            **({"preference": preference} if preference is not None else {}),
            **shared,
        )
    except (TypeError, ValueError) as exc:
        found = re.match(r"LearnerConfig\.(\w+)", str(exc))
        field = found.group(1) if found else ""
        where = {"learning_rate": f"{schedule}.learning_rate", "loss": "algorithm.loss"}.get(
            field, f"optimizer.{field}"
        )
        raise ConfigError(re.sub(r"^LearnerConfig\.\w+", f"config.{where}", str(exc))) from exc


def _loop(node: Any) -> LoopSettings:
    loop = section(
        node, "loop", _names(LoopSettings), optional=("max_anomaly_rate", "anomaly_patience", "max_staleness")
    )
    for key, low in (("steps", 0), ("tasks_per_step", 1), ("checkpoint_every", 1), ("keep_checkpoints", 1)):
        need_int(loop[key], f"loop.{key}", low)
    need_int(loop["max_len"], "loop.max_len", 1)
    need_bool(loop["pack_sequences"], "loop.pack_sequences")
    rate = loop.get("max_anomaly_rate", LoopSettings.max_anomaly_rate)
    need(isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 <= rate <= 1, "loop.max_anomaly_rate",
          "a share in [0, 1] (1 turns the circuit breaker off)", rate)  # fmt: skip
    need_int(loop.get("anomaly_patience", LoopSettings.anomaly_patience), "loop.anomaly_patience", 1)
    need_int(loop.get("max_staleness", LoopSettings.max_staleness), "loop.max_staleness", 0)
    return LoopSettings(**loop)


def _sandbox(node: Any) -> SandboxSettings:
    sandbox = section(node, "sandbox", _names(SandboxSettings), optional=("fleet", "address"))
    need(sandbox["backend"] in BACKENDS, "sandbox.backend", f"one of {BACKENDS}", sandbox["backend"])
    hosts = sandbox["hosts"]
    need(isinstance(hosts, list) and all(isinstance(h, str) for h in hosts), "sandbox.hosts", "daemon URLs", hosts)
    fleet = sandbox.setdefault("fleet", SandboxSettings.fleet)
    need(fleet in FLEETS, "sandbox.fleet", f"one of {FLEETS}", fleet)
    address = sandbox.setdefault("address", SandboxSettings.address)
    need(isinstance(address, str) and bool(address), "sandbox.address", "'auto', 'local' or HOST:PORT", address)
    for key in ("capacity", "max_sandboxes"):
        need_int(sandbox[key], f"sandbox.{key}")
    return SandboxSettings(**{**sandbox, "hosts": tuple(hosts)})


def _sft(node: Any, has_tasks: bool) -> SFTSettings:
    sft = section(node, "sft", _SFT + _SFT_CHECK, optional=_SFT_CHECK)
    need_int(sft["steps"], "sft.steps")
    need_int(sft["batch_size"], "sft.batch_size", 1)
    if sft["steps"]:
        known = f"one of {sft_sources()} when sft.steps > 0"
        need(is_sft_source(sft["data"]), "sft.data", known, sft["data"])
        check_sft_options(sft["data"], sft["options"])
    every = need_int(sft.get("check_every", SFTSettings.check_every), "sft.check_every")
    n = need_int(sft.get("check_tasks", SFTSettings.check_tasks), "sft.check_tasks", 1)
    bar = sft.get("until_pass_rate", SFTSettings.until_pass_rate)
    anneal = need_int(sft.get("anneal_steps", SFTSettings.anneal_steps), "sft.anneal_steps")
    if every:
        real = isinstance(bar, (int, float)) and not isinstance(bar, bool)
        need(real and 0 < bar <= 1, "sft.until_pass_rate", "a pass rate in (0, 1] when sft.check_every > 0", bar)
        need(has_tasks, "sft.check_every", "0 when there are no training tasks (config.tasks) to check with", every)
        room = sft["steps"] - sft["warmup_steps"]
        why = f"an int in [1, {room}] when sft.check_every > 0 (the decay fits after warmup, within sft.steps)"
        need(1 <= anneal <= room, "sft.anneal_steps", why, anneal)
    options = types.MappingProxyType(dict(sft["options"]))
    return SFTSettings(sft["steps"], sft["data"], sft["batch_size"], options, every, n, bar, anneal)


def _preference(node: Any) -> tuple[PreferenceSettings, PreferenceConfig | None]:
    """``config.preference`` (absent: no preference phase) and its loss."""
    if node is None:
        return PreferenceSettings(), None
    p = section(node, "preference", _names(PreferenceSettings))
    for key, low in (("steps", 0), ("batch_size", 1), ("mine_tasks", 1), ("mine_group", 2), ("max_pairs_per_task", 1)):
        need_int(p[key], f"preference.{key}", low)
    settings = PreferenceSettings(**p)
    if not settings.steps:
        return settings, None
    data = p["data"]
    known = f"'{MINED}' (pairs from the policy's own rollouts) or 'jsonl:PATH'"
    need(isinstance(data, str) and (data == MINED or data.startswith("jsonl:")), "preference.data", known, data)
    if data.startswith("jsonl:"):
        path = Path(data.removeprefix("jsonl:"))
        need(path.is_file(), "preference.data", "a JSONL file that exists", data)
    try:
        loss = PreferenceConfig(p["loss"], p["beta"], p["label_smoothing"], p["gamma"])
    except ValueError as exc:
        raise _renamed(exc, "PreferenceConfig", "preference") from exc
    return settings, loss


def _eval(node: Any, catalog: TaskCatalog) -> EvalSettings:
    ev = section(node, "eval", _names(EvalSettings), optional=_EVAL_WORKFLOW)
    need(isinstance(ev.get("check_tool", ""), str), "eval.check_tool", "a tool name", ev.get("check_tool"))
    edit_tools = ev.get("edit_tools", ())
    need(
        isinstance(edit_tools, (list, tuple)) and all(isinstance(t, str) for t in edit_tools),
        "eval.edit_tools",
        "a list of tool names",
        edit_tools,
    )
    ev["edit_tools"] = tuple(edit_tools)
    for key, low in (("every", 0), ("num_tasks", 1), ("k", 0)):
        need_int(ev[key], f"eval.{key}", low)
    temperature = ev["temperature"]
    need(isinstance(temperature, (int, float)) and temperature >= 0, "eval.temperature", "a number >= 0", temperature)
    return EvalSettings(**{**ev, "pools": types.MappingProxyType(_pools(ev["pools"], "eval.pools", catalog))})


def load_settings(config: mlc.ConfigDict | Mapping[str, Any], catalog: TaskCatalog | None = None) -> Settings:
    """Checks every field of ``config`` and returns the run's frozen :class:`Settings`.

    Raises :class:`ConfigError` naming the first bad field. ``catalog`` loads the task pools
    (pass the run's, so that later users get them without loading again). Cheap checks come
    first, so a typo fails before any task set is read.
    """
    catalog = catalog if catalog is not None else TaskCatalog()
    raw = config.to_json_best_effort() if isinstance(config, mlc.ConfigDict) else json.dumps(config)
    c = section(json.loads(raw), "", _TOP, optional=("preference", "reward_model", "learned_reward"))
    need(isinstance(c["seed"], int) and not isinstance(c["seed"], bool), "seed", "an int", c["seed"])
    model, loop, sandbox = _model(c["model"]), _loop(c["loop"]), _sandbox(c["sandbox"])
    shape = section(c["mesh"], "mesh", ("shape",))["shape"]
    need(isinstance(shape, Mapping) and set(shape) <= set(MESH_AXES), "mesh.shape", f"axes among {MESH_AXES}", shape)
    try:
        resolve_mesh_shape(shape, jax.device_count())
    except ValueError as exc:
        raise ConfigError(f"config.mesh.shape: {exc}") from exc
    algorithm = _algorithm(c["algorithm"], loop.max_len)
    packable = not loop.pack_sequences or algorithm.loss.aggregation in PACKABLE_AGGREGATIONS
    why = f"False unless algorithm.loss.aggregation is in {PACKABLE_AGGREGATIONS} (packed rows hold several sequences)"
    need(packable, "loop.pack_sequences", why, loop.pack_sequences)
    training = loop.steps > 0
    rollout = _rollout(c["rollout"], training, ESTIMATORS[algorithm.advantage].min_valid)
    sft = _sft(c["sft"], bool(c["tasks"]))
    optimizer = section(c["optimizer"], "optimizer", _OPTIMIZER, optional=("remat", "logits_chunk_mib"))
    learners = {}
    trainable = "lora" if model.lora is not None else "all"
    if sft.steps:
        learners["sft"] = _learner("sft", optimizer, "sft", c["sft"], sft.steps, algorithm.loss, trainable)
        if sft.check_every:  # a plateau until a check passes (or the decay must start to end by sft.steps)
            learners["sft"] = dataclasses.replace(learners["sft"], decay_start=sft.steps - sft.anneal_steps)
    if training:
        rl_steps = loop.steps * algorithm.epochs
        learners["rl"] = _learner("rl", optimizer, "optimizer", optimizer, rl_steps, algorithm.loss, trainable)
    preference, preference_loss = _preference(c.get("preference"))
    if preference.steps:
        learners["preference"] = _learner(
            "preference", optimizer, "preference", c["preference"], preference.steps, algorithm.loss, trainable,
            preference=preference_loss,
        )  # fmt: skip
    reward_model = parse_reward_model(c.get("reward_model"))
    if reward_model.steps:
        others = {"sft.steps": sft.steps, "preference.steps": preference.steps, "loop.steps": loop.steps}
        why = "0 in a reward-model run (it trains the judge only: its backbone is the run's model)"
        for field, steps in others.items():
            need(steps == 0, field, why, steps)
        learners[REWARD_MODEL_PHASE] = _learner(
            REWARD_MODEL_PHASE, optimizer, "reward_model", dataclasses.asdict(reward_model), reward_model.steps,
            algorithm.loss, trainable,
        )  # fmt: skip
    learned_reward = parse_learned_reward(c.get("learned_reward"), rollout.env_kwargs)
    tasks = _pools(c["tasks"], "tasks", catalog)
    need(bool(tasks) or not training, "tasks", "at least one task pool when loop.steps > 0", c["tasks"])
    return Settings(
        seed=c["seed"],
        model=model,
        mesh_shape=types.MappingProxyType(dict(shape)),
        tasks=types.MappingProxyType(tasks),
        sandbox=sandbox,
        algorithm=algorithm,
        rollout=rollout,
        sft=sft,
        preference=preference,
        eval=_eval(c["eval"], catalog),
        loop=loop,
        learners=types.MappingProxyType(learners),
        config=types.MappingProxyType(json.loads(raw)),
        reward_model=reward_model,
        learned_reward=learned_reward,
    )
