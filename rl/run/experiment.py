"""The live parts of a run, built from its :class:`~rl.config.settings.Settings`.

:func:`build` turns checked settings into mesh, model, tokenizer,
sandbox pool, environments, rollout (with its decode engine or sampler) and checkpointer; :mod:`rl.run.trainer`
trains with them and :mod:`rl.phases.evaluation` evaluates with them. A notebook
can call it too.

``config.json`` records which experiment a workdir holds. It is compared before
anything is built (a workdir holding a different experiment is refused, naming
the fields that differ) and written only once every part has been built, so a
start that fails — a bad model directory, a missing sandbox backend — leaves
the workdir as it was and the corrected command runs in it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import jax
from flax import nnx

from envs.sandboxes import Host, LentSandboxes, PoolConfig, RayFleet, Scheduler, WarmPool
from rl.config.config_file import CONFIG_FILE, differing_fields, read_config
from rl.config.errors import ConfigError
from rl.config.sections import REWARD_MODEL_PHASE, ModelSettings, Settings
from rl.generation.engine import DecodeEngine
from rl.generation.engine_config import EngineConfig
from rl.generation.sampler import Sampler, SamplerConfig
from rl.generation.tokenizer import Tokenizer, load_tokenizer
from rl.learning.learner import Learner
from rl.learning.learner_config import LearnerConfig
from rl.learning.reward_learner import RewardLearner
from rl.learning.reward_model import RewardModel
from rl.models import Transformer, sharding
from rl.models.lora import apply_lora
from rl.phases.learned_reward import Judge, install_judge, uninstall_judge
from rl.rollout.engine_rollout import EngineRollout
from rl.rollout.episode_driver import EnvCache, RolloutRunner, make_env_factory
from rl.rollout.lockstep import Rollout
from rl.rollout.split import LocalReplica, SplitRollout, rollout_mesh_shape
from rl.rollout.task_stream import TaskCatalog
from rl.run.checkpoint import Checkpointer
from rl.run.distributed import ProcessGroup
from rl.run.metrics import MetricsWriter

log = logging.getLogger(__name__)
SAMPLER_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def make_model(model: ModelSettings, seed: int, mesh: jax.sharding.Mesh) -> Transformer:
    """The preset initialised from ``seed``, or the Hugging Face checkpoint / GGUF file, created in its shardings;
    with ``model.lora``, adapters attached (zero updates: the same function as the base model)."""
    if model.path:
        from rl.models.gguf import load_gguf_model
        from rl.models.hf import CheckpointError, load_hf_model

        load = load_gguf_model if model.path.endswith(".gguf") else load_hf_model
        try:
            built = load(model.path, mesh=mesh, dtype=model.dtype, param_dtype=model.param_dtype)
        except CheckpointError as exc:
            raise ConfigError(f"config.model.path: {exc}") from exc
    else:
        config = model.config
        factory = lambda: Transformer(config, rngs=nnx.Rngs(seed))  # noqa: E731
        built = sharding.create_sharded_model(factory, mesh, sharding.DEFAULT_RULES)
    if model.lora is not None:
        apply_lora(built, model.lora, mesh=mesh)
    return built


def make_pool(settings: Settings) -> WarmPool | RayFleet:
    """The warm sandbox pool every environment of the run takes its sandboxes from: a
    :class:`WarmPool` here (or over ``sandbox.hosts``), or with ``sandbox.fleet="ray"`` a
    :class:`RayFleet` with the same interface, whose agents run a pool on each node of the cluster."""
    s = settings.sandbox
    episodes = settings.loop.tasks_per_step * settings.rollout.group_size
    cores = os.cpu_count() or 2
    if s.fleet == "ray":  # per node: its own cores unless set (the rollout's episodes spread over nodes)
        cap, most = s.capacity or None, s.max_sandboxes or None
        return RayFleet(s.backend, address=s.address, hosts=s.hosts, capacity=cap, max_sandboxes=most)
    # Stateful domains hold a sandbox for a whole episode, so a rollout needs one per episode in
    # flight; stateless ones (hold_sandbox=False) only one per concurrent tool call.
    capacity = s.capacity or max(cores, min(episodes, 64))
    max_sandboxes = max(s.max_sandboxes or capacity, capacity)
    targets = list(s.hosts) or [s.backend]
    hosts = [Host(t, capacity=capacity, max_sandboxes=max_sandboxes) for t in targets]
    return WarmPool(hosts, config=PoolConfig(handle_signals=False))


def engine_config(settings: Settings) -> EngineConfig:
    """``config.engine`` resolved for the run: a slot per episode of a training step and a cache as long
    as an episode, unless set; every shape fixed with ``config.rollout.reproducible``."""
    r = settings.rollout
    config = settings.engine.resolved(
        slots=settings.loop.tasks_per_step * r.group_size, max_len=r.max_context + r.max_new_tokens
    )
    return config.exact() if r.reproducible else config


def example_tasks(settings: Settings, catalog: TaskCatalog) -> dict[str, Any]:
    """One task per domain of the run (environments are built with one and reset with any)."""
    out: dict[str, Any] = {}
    for pools in (settings.tasks, settings.eval.pools):
        for pool in pools.values():
            for task in catalog.pool(pool):
                out.setdefault(task.domain, task)
    return out


@dataclasses.dataclass
class Experiment:
    """The live parts of one run (see :func:`build`)."""

    settings: Settings
    workdir: Path
    catalog: TaskCatalog
    mesh: jax.sharding.Mesh
    model: Transformer
    tokenizer: Tokenizer
    pool: WarmPool | RayFleet
    scheduler: Scheduler
    rollout: RolloutRunner
    checkpointer: Checkpointer
    metrics: MetricsWriter
    judge: Judge | None = None  # the learned reward's judge (config.learned_reward), registered for the verifiers
    group: ProcessGroup = dataclasses.field(default_factory=ProcessGroup)  # the job's processes

    @property
    def is_main(self) -> bool:
        """The process that writes the run's files (metrics, trajectories, config.json)."""
        return self.group.is_main

    def rollout_weights(self) -> Any:
        """The live policy as the rollout samples it: the model itself on one process; with several,
        a copy on this process's devices (a collective: the main thread, at the same point everywhere)."""
        if isinstance(self.rollout, SplitRollout):
            return self.rollout.weights()
        return None

    def learner(self, phase: str, config: LearnerConfig | None = None) -> Learner | RewardLearner:
        """A fresh learner of ``phase`` (``"sft"`` or ``"rl"``) on the shared model: RL starts with
        a fresh optimizer (and, with KL on, the post-SFT policy as its reference). A reward-model
        run's learner trains the model as the backbone of a fresh scalar head. ``config``: another
        than the settings' (an SFT warm start whose decay a check started)."""
        if phase not in self.settings.learners:
            raise ValueError(
                f"learner(phase=): this run has no {phase!r} steps; phases: {list(self.settings.learners)}"
            )
        config = config or self.settings.learners[phase]
        if phase == REWARD_MODEL_PHASE:
            return RewardLearner(RewardModel(self.model), self.mesh, config)
        return Learner(self.model, self.mesh, config)

    def close(self) -> None:
        self.close_local()
        self.checkpointer.close()

    def close_local(self) -> None:
        """Closes what this process holds alone — environments, sandboxes, the metrics file — and
        not the checkpointer, which in a job of several processes may wait for the others (a
        failed job's peers may be gone; its checkpoints are complete: every save is synchronous)."""
        uninstall_judge(self.judge)
        self.rollout.close()
        self.scheduler.close(cancel=True)
        self.pool.close()
        self.metrics.close()


def check_workdir(settings: Settings, workdir: Path) -> None:
    """Refuses a workdir whose ``config.json`` holds another experiment, naming the fields that differ.

    ``loop.steps`` may change: that extends (or shortens) the same run; so may where its sandboxes run.
    """
    if not (workdir / CONFIG_FILE).exists():
        return
    # Where the sandboxes run (fleet, cluster address) changes no result: a run may move to a cluster.
    ignore = ("loop.steps", "sandbox.fleet", "sandbox.address")
    differ = differing_fields(read_config(workdir), settings.config, ignore=ignore)
    if differ:
        shown = "; ".join(f"{field}: {old!r} -> {new!r}" for field, old, new in differ[:5])
        more = f" (and {len(differ) - 5} more)" if len(differ) > 5 else ""
        raise ConfigError(
            f"{workdir} holds a different experiment (config.json differs in {shown}{more}); "
            "use a new --workdir, or the same config to resume"
        )


def build(settings: Settings, workdir: str | os.PathLike, catalog: TaskCatalog, *, record: bool = True) -> Experiment:
    """Builds every part of the run in ``workdir``.

    With ``record`` (a training run), the workdir's ``config.json`` is checked first and written
    once everything is built, and metrics are written; without (evaluating a saved run, whose
    evaluation settings may differ), neither is touched.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    group = ProcessGroup.current()
    if record and group.is_main:
        check_workdir(settings, workdir)
    mesh = sharding.make_mesh(dict(settings.mesh_shape))
    tokenizer = load_tokenizer(settings.model.tokenizer_spec)
    model = make_model(settings.model, settings.seed, mesh)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ConfigError(
            f"config.model: the tokenizer has {tokenizer.vocab_size} ids but the model only "
            f"{model.config.vocab_size}; use the model's own tokenizer (config.model.tokenizer)"
        )
    # With several processes, each samples on its own devices with a replica of the policy.
    sample_mesh, sample_model, replica = mesh, model, None
    if group.count > 1:
        local = jax.local_devices()
        sample_mesh = sharding.make_mesh(rollout_mesh_shape(dict(settings.mesh_shape), len(local)), devices=local)
        sample_model = make_model(settings.model, settings.seed, sample_mesh)
        replica = LocalReplica(model, sample_model)
    judge = install_judge(settings, sample_mesh)  # before any environment: the 'learned' verifier parts use it
    pool = make_pool(settings)
    scheduler = Scheduler(pool, log_interval_s=None)
    try:
        lender = LentSandboxes(pool.acquire, pool.release)
        factory = make_env_factory(
            settings.rollout,
            sandbox_factory=lender.acquire,
            sandbox_release=lender.release,
            example_tasks=example_tasks(settings, catalog),
        )
        if settings.rollout.engine:
            engine = DecodeEngine(sample_model, tokenizer, sample_mesh, engine_config(settings))
            rollout = EngineRollout(
                engine, tokenizer, settings.rollout, EnvCache(factory), scheduler, lender, seed=settings.seed
            )
        else:  # only the lock-step rollout samples with the Sampler: the engine path builds none
            sampler = Sampler(sample_model, tokenizer, sample_mesh, SamplerConfig(batch_buckets=SAMPLER_BATCH_BUCKETS))
            rollout = Rollout(sampler, tokenizer, settings.rollout, EnvCache(factory), seed=settings.seed)
        if replica is not None:
            rollout = SplitRollout(rollout, group, replica)
        loop = settings.loop
        checkpointer = Checkpointer(
            workdir, max_to_keep=loop.keep_checkpoints, every=loop.checkpoint_every, announce=group.is_main
        )
    except BaseException:
        scheduler.close(cancel=True)
        pool.close()
        uninstall_judge(judge)
        raise
    exp = Experiment(
        settings=settings,
        workdir=workdir,
        catalog=catalog,
        mesh=mesh,
        model=model,
        tokenizer=tokenizer,
        pool=pool,
        scheduler=scheduler,
        rollout=rollout,
        checkpointer=checkpointer,
        metrics=MetricsWriter(workdir, enabled=record and group.is_main),
        judge=judge,
        group=group,
    )
    if record and group.is_main:
        (workdir / CONFIG_FILE).write_text(settings.config_json())
    return exp
