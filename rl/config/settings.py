"""An experiment's settings: the config read once, every field checked once, the result frozen.

A config file gives an ``ml_collections.ConfigDict`` (``configs/common.py`` builds its sections
from their dataclasses). :func:`load_settings` reads each section through the same dataclasses
(:mod:`rl.config.schema`: unknown field, wrong type, out of range) and adds the checks that
relate sections or look outside the config: the phases' learners, training's sampling rules,
task pools and registries. The result is a frozen :class:`Settings`, and everything downstream
takes its values as they are. So a bad experiment fails here, before a model is loaded or a
sandbox started, with one line naming the field and what would be right
(``config.rollout.temperature: expected 1.0 for training (...), got 0.7``).
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

from rl.config.errors import ConfigError, need
from rl.config.registry_checks import check_env_kwargs, check_sft_options
from rl.config.schema import check_keys, load, values
from rl.config.sections import (  # noqa: F401 - Settings, PHASES, REWARD_MODEL_PHASE: re-exported
    OPTIMIZER_FIELDS,
    PHASES,
    REWARD_MODEL_PHASE,
    AlgorithmSettings,
    EvalSettings,
    LoopSettings,
    MeshSettings,
    ModelSettings,
    PoolSettings,
    SandboxSettings,
    Settings,
    SFTSettings,
)
from rl.generation.engine_config import EngineConfig
from rl.learning.advantages import ESTIMATORS
from rl.learning.learner_config import RAW_LOGPROB_TEMPERATURE, LearnerConfig
from rl.learning.losses import PACKABLE_AGGREGATIONS
from rl.models import get_model_config
from rl.models.sharding import MESH_AXES, resolve_mesh_shape
from rl.phases.learned_reward import parse_learned_reward
from rl.phases.preference import PreferenceSettings, preference_loss_of
from rl.phases.reward_model import parse_reward_model
from rl.phases.sft_data import is_sft_source, sft_sources
from rl.rollout.episode_driver import RolloutConfig
from rl.rollout.task_stream import TaskCatalog

_SECTIONS = (
    *("seed", "model", "mesh", "tasks", "sandbox", "algorithm", "optimizer", "rollout", "sft", "preference"),
    *("eval", "loop", "reward_model", "learned_reward", "engine"),
)
_OPTIONAL_SECTIONS = ("preference", "reward_model", "learned_reward", "engine")


def _model(node: Any) -> ModelSettings:
    m = load(ModelSettings, node, "model")
    if m.path:
        path = Path(m.path)
        found = (path / "config.json").is_file() and any(path.glob("*.safetensors"))
        found = found or (path.suffix == ".gguf" and path.is_file())
        why = "a Hugging Face model directory (config.json + *.safetensors), a .gguf file, or '' to use config.model.preset"
        need(found, "model.path", why, m.path)
    else:
        try:
            config = get_model_config(m.preset, dtype=m.dtype, param_dtype=m.param_dtype, **m.overrides)
        except KeyError as exc:
            raise ConfigError(f"config.model.preset: {exc.args[0]}") from exc
        except (TypeError, ValueError) as exc:
            field = re.match(r"ModelConfig\.(\w+)", str(exc))
            where = "model" if field and field.group(1) in ("dtype", "param_dtype") else "model.overrides"
            raise ConfigError(re.sub(r"^ModelConfig\.", f"config.{where}.", str(exc))) from exc
        m = dataclasses.replace(m, config=config)
    hf = m.tokenizer_spec
    if hf != "byte":
        file = Path(hf) / "tokenizer.json" if Path(hf).is_dir() else Path(hf)
        need(file.is_file(), "model.tokenizer", "'byte', or a tokenizer.json (or its directory) or .gguf file", hf)
    return m


def _pools(pools: Mapping[str, PoolSettings], where: str, catalog: TaskCatalog) -> Mapping[str, PoolSettings]:
    """Every pool loads (once, into ``catalog``) with tasks of registered domains."""
    import envs  # registers the domains

    for name, pool in pools.items():
        try:
            source = catalog.pool(pool)
        except Exception as exc:  # noqa: BLE001 - any loader failure is a config error here
            raise ConfigError(f"config.{where}.{name}.source: {exc}") from exc
        need(len(source) > 0, f"{where}.{name}", "a pool with tasks (check source and split)", pool)
        for domain in sorted({t.domain for t in source}):
            registered = f"tasks of a registered domain {sorted(envs.DOMAINS)}"
            need(domain in envs.DOMAINS, f"{where}.{name}", registered, domain)
    return pools


def _training_rollout(rollout: RolloutConfig, min_group: int) -> None:
    """Sampling rules that training needs (an evaluation-only run may sample as it likes)."""
    why = "for training (the learner's importance ratios use the sampler's temperature-1, unfiltered log-probs)"
    need(rollout.temperature == RAW_LOGPROB_TEMPERATURE, "rollout.temperature", f"1.0 {why}", rollout.temperature)
    need(rollout.top_p == 1.0, "rollout.top_p", f"1.0 {why}", rollout.top_p)
    need(rollout.top_k == 0, "rollout.top_k", f"0 {why}", rollout.top_k)
    expected = f"an int >= {min_group} (the advantage estimator needs {min_group} valid episodes of a task)"
    need(rollout.group_size >= min_group, "rollout.group_size", expected, rollout.group_size)


def _learner(
    phase: str, schedule: str, rate: Any, warmup: int, steps: int, shared: dict[str, Any], **extra: Any
) -> LearnerConfig:
    """The learner of one phase: ``steps`` optimizer steps with the schedule of ``config.<schedule>``
    (``rate``, ``warmup``) and the optimizer fields the phases share."""
    why = f"an int in [0, {steps}] (the {phase} phase takes {steps} optimizer steps)"
    need(0 <= warmup <= steps, f"{schedule}.warmup_steps", why, warmup)
    objective = {"sft": "sft", "preference": "preference"}.get(phase, "policy")
    try:
        return LearnerConfig(
            objective=objective, learning_rate=rate, warmup_steps=warmup, total_steps=steps,
            temperature=RAW_LOGPROB_TEMPERATURE, **shared, **extra,
        )  # fmt: skip
    except ValueError as exc:
        found = re.match(r"LearnerConfig\.(\w+)", str(exc))
        field = found.group(1) if found else ""
        where = {"learning_rate": f"{schedule}.learning_rate", "loss": "algorithm.loss"}.get(
            field, f"optimizer.{field}"
        )
        raise ConfigError(re.sub(r"^LearnerConfig\.\w+", f"config.{where}", str(exc))) from exc


def _sft(sft: SFTSettings, has_tasks: bool) -> None:
    if sft.steps:
        need(is_sft_source(sft.data), "sft.data", f"one of {sft_sources()} when sft.steps > 0", sft.data)
        check_sft_options(sft.data, sft.options)
    if sft.check_every:
        bar = sft.until_pass_rate
        need(0 < bar <= 1, "sft.until_pass_rate", "a pass rate in (0, 1] when sft.check_every > 0", bar)
        need(
            has_tasks,
            "sft.check_every",
            "0 when there are no training tasks (config.tasks) to check with",
            sft.check_every,
        )
        room = sft.steps - sft.warmup_steps
        why = f"an int in [1, {room}] when sft.check_every > 0 (the decay fits after warmup, within sft.steps)"
        need(1 <= sft.anneal_steps <= room, "sft.anneal_steps", why, sft.anneal_steps)


def load_settings(config: mlc.ConfigDict | Mapping[str, Any], catalog: TaskCatalog | None = None) -> Settings:
    """Checks every field of ``config`` and returns the run's frozen :class:`Settings`.

    Raises :class:`ConfigError` naming the first bad field. ``catalog`` loads the task pools
    (pass the run's, so that later users get them without loading again). Cheap checks come
    first, so a typo fails before any task set is read.
    """
    catalog = catalog if catalog is not None else TaskCatalog()
    raw = config.to_json_best_effort() if isinstance(config, mlc.ConfigDict) else json.dumps(config)
    c = check_keys(json.loads(raw), "", _SECTIONS, [s for s in _SECTIONS if s not in _OPTIONAL_SECTIONS])
    need(isinstance(c["seed"], int) and not isinstance(c["seed"], bool), "seed", "an int", c["seed"])
    model, loop, sandbox = (
        _model(c["model"]),
        load(LoopSettings, c["loop"], "loop"),
        load(SandboxSettings, c["sandbox"], "sandbox"),
    )
    shape = load(MeshSettings, c["mesh"], "mesh").shape
    need(set(shape) <= set(MESH_AXES), "mesh.shape", f"axes among {MESH_AXES}", dict(shape))
    try:
        resolve_mesh_shape(dict(shape), jax.device_count())
    except ValueError as exc:
        raise ConfigError(f"config.mesh.shape: {exc}") from exc
    algorithm = load(AlgorithmSettings, c["algorithm"], "algorithm")
    algorithm = dataclasses.replace(algorithm, loss=dataclasses.replace(algorithm.loss, max_len=loop.max_len))
    packable = not loop.pack_sequences or algorithm.loss.aggregation in PACKABLE_AGGREGATIONS
    why = f"False unless algorithm.loss.aggregation is in {PACKABLE_AGGREGATIONS} (packed rows hold several sequences)"
    need(packable, "loop.pack_sequences", why, loop.pack_sequences)
    training = loop.steps > 0
    rollout = load(RolloutConfig, c["rollout"], "rollout")
    rollout = dataclasses.replace(rollout, env_kwargs={k: dict(v) for k, v in rollout.env_kwargs.items()})
    check_env_kwargs(rollout.env_kwargs)
    if training:
        _training_rollout(rollout, ESTIMATORS[algorithm.advantage].min_valid)
    sft = load(SFTSettings, c["sft"], "sft")
    _sft(sft, bool(c["tasks"]))
    optimizer = values(LearnerConfig, c["optimizer"], "optimizer", only=OPTIMIZER_FIELDS, required=OPTIMIZER_FIELDS[:2])
    rate, warmup = optimizer.pop("learning_rate"), optimizer.pop("warmup_steps")
    shared = {**optimizer, "loss": algorithm.loss, "trainable": "lora" if model.lora is not None else "all"}
    learners = {}
    if sft.steps:
        learners["sft"] = _learner("sft", "sft", sft.learning_rate, sft.warmup_steps, sft.steps, shared)
        if sft.check_every:  # a plateau until a check passes (or the decay must start to end by sft.steps)
            learners["sft"] = dataclasses.replace(learners["sft"], decay_start=sft.steps - sft.anneal_steps)
    if training:
        learners["rl"] = _learner("rl", "optimizer", rate, warmup, loop.steps * algorithm.epochs, shared)
    preference = load(PreferenceSettings, c.get("preference") or {}, "preference")
    preference_loss = preference_loss_of(preference)
    if preference.steps:
        learners["preference"] = _learner(
            "preference", "preference", preference.learning_rate, preference.warmup_steps, preference.steps,
            shared, preference=preference_loss,
        )  # fmt: skip
    reward_model = parse_reward_model(c.get("reward_model"))
    if reward_model.steps:
        others = {"sft.steps": sft.steps, "preference.steps": preference.steps, "loop.steps": loop.steps}
        why = "0 in a reward-model run (it trains the judge only: its backbone is the run's model)"
        for field, steps in others.items():
            need(steps == 0, field, why, steps)
        rm = reward_model
        learners[REWARD_MODEL_PHASE] = _learner(
            REWARD_MODEL_PHASE, "reward_model", rm.learning_rate, rm.warmup_steps, rm.steps, shared
        )
    learned_reward = parse_learned_reward(c.get("learned_reward"), rollout.env_kwargs)
    tasks = load_pools(c["tasks"], "tasks", catalog)
    need(bool(tasks) or not training, "tasks", "at least one task pool when loop.steps > 0", c["tasks"])
    evaluation = load(EvalSettings, c["eval"], "eval")
    return Settings(
        seed=c["seed"],
        model=model,
        mesh_shape=shape,
        tasks=tasks,
        sandbox=sandbox,
        algorithm=algorithm,
        rollout=rollout,
        sft=sft,
        preference=preference,
        eval=dataclasses.replace(evaluation, pools=_pools(evaluation.pools, "eval.pools", catalog)),
        loop=loop,
        learners=types.MappingProxyType(learners),
        config=types.MappingProxyType(json.loads(raw)),
        reward_model=reward_model,
        learned_reward=learned_reward,
        engine=load(EngineConfig, c.get("engine") or {}, "engine"),
    )


def load_pools(node: Any, where: str, catalog: TaskCatalog) -> Mapping[str, PoolSettings]:
    """``config.<where>``: a mapping of pool name -> ``configs.common.pool(...)``, each loaded and checked."""
    need(isinstance(node, Mapping), where, "a mapping of pool name -> configs.common.pool(...)", node)
    pools = {name: load(PoolSettings, raw, f"{where}.{name}") for name, raw in node.items()}
    return types.MappingProxyType(dict(_pools(pools, where, catalog)))
