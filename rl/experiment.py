"""Everything a run needs, built from its config — and every bad field caught first.

:func:`check_config` rejects a bad experiment before anything expensive starts,
with an error naming the field. :func:`build` turns a config into live parts
(mesh, model, tokenizer, sampler, learners, sandbox pool, environments, task
streams, checkpointer, metrics writer); :mod:`rl.loop` runs them. A notebook
can call :func:`build` too.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

import jax
import ml_collections as mlc
from flax import nnx

from rl import losses, sharding
from rl.checkpoint import Checkpointer
from rl.groups import ESTIMATORS
from rl.learner import Learner, LearnerConfig
from rl.metrics import MetricsWriter
from rl.models import Transformer, get_model_config
from rl.rollout import EnvCache, Rollout, RolloutConfig, make_env_factory
from rl.sampler import Sampler, SamplerConfig
from rl.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config field is wrong; the message names it (``config.rollout.group_size``)."""


def _need(cond: bool, field: str, expected: str, value: Any) -> None:
    if not cond:
        raise ConfigError(f"config.{field}: expected {expected}, got {value!r}")


def check_config(config: mlc.ConfigDict) -> None:
    """Validates an experiment config; raises :class:`ConfigError` naming the first bad field."""
    import envs  # registers the domains
    from envs.tasks import load_tasks

    for section in ("model", "mesh", "tasks", "sandbox", "algorithm", "optimizer", "rollout", "sft", "eval", "loop"):
        _need(section in config, section, "a section (see configs/common.py)", None)
    m = config.model
    if not m.path:
        try:
            get_model_config(m.preset)
        except KeyError as exc:
            raise ConfigError(f"config.model.preset: {exc.args[0]}") from exc
    elif not Path(m.path).is_dir():
        raise ConfigError(f"config.model.path: {m.path!r} is not a directory with config.json + *.safetensors")
    shape = dict(config.mesh.shape)
    _need(set(shape) <= set(sharding.MESH_AXES), "mesh.shape", f"axes among {sharding.MESH_AXES}", shape)
    try:
        sharding.resolve_mesh_shape(shape, jax.device_count())
    except ValueError as exc:
        raise ConfigError(f"config.mesh.shape: {exc}") from exc
    _need(
        config.sandbox.backend in ("bwrap", "docker"), "sandbox.backend", "'bwrap' or 'docker'", config.sandbox.backend
    )
    train_pools = dict(config.tasks)
    _need(bool(train_pools) or config.loop.steps == 0, "tasks", "at least one task pool", train_pools)
    for where, pools in (("tasks", train_pools), ("eval.pools", dict(config.eval.pools))):
        for name, pool in pools.items():
            _need("source" in pool, f"{where}.{name}.source", "a task source spec", pool)
            try:
                source = load_tasks(pool["source"], split=pool.get("split"))
            except Exception as exc:  # noqa: BLE001 - any loader failure is a config error here
                raise ConfigError(f"config.{where}.{name}.source: {exc}") from exc
            _need(len(source) > 0, f"{where}.{name}", "a pool with tasks", pool)
            for domain in {t.domain for t in source}:
                _need(
                    domain in envs.DOMAINS,
                    f"{where}.{name}",
                    f"tasks of a registered domain {sorted(envs.DOMAINS)}",
                    domain,
                )
    alg = config.algorithm
    _need(alg.name in ("grpo", "ppo"), "algorithm.name", "'grpo' or 'ppo'", alg.name)
    _need(alg.advantage in ESTIMATORS, "algorithm.advantage", f"one of {ESTIMATORS}", alg.advantage)
    _need(isinstance(alg.epochs, int) and alg.epochs >= 1, "algorithm.epochs", "an int >= 1", alg.epochs)
    try:
        losses.PolicyLossConfig(**alg.loss)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config.algorithm.loss: {exc}") from exc
    if config.loop.steps > 0:
        _need(
            config.rollout.group_size >= 2 or alg.advantage == "batch",
            "rollout.group_size",
            "an int >= 2 (group-relative advantages need two episodes of a task)",
            config.rollout.group_size,
        )
    try:
        rollout_config(config)
    except ValueError as exc:
        raise ConfigError(f"config.{exc}") from exc
    lp = config.loop
    _need(isinstance(lp.steps, int) and lp.steps >= 0, "loop.steps", "an int >= 0", lp.steps)
    _need(
        not lp.pack_sequences or alg.loss.aggregation == "token",
        "loop.pack_sequences",
        "False when algorithm.loss.aggregation is not 'token' (packed rows hold several sequences)",
        lp.pack_sequences,
    )
    _need(
        isinstance(lp.tasks_per_step, int) and lp.tasks_per_step >= 1,
        "loop.tasks_per_step",
        "an int >= 1",
        lp.tasks_per_step,
    )
    _need(lp.checkpoint_every >= 1, "loop.checkpoint_every", "an int >= 1", lp.checkpoint_every)
    s = config.sft
    _need(isinstance(s.steps, int) and s.steps >= 0, "sft.steps", "an int >= 0", s.steps)
    _need(s.steps == 0 or bool(s.data), "sft.data", "a dataset name when sft.steps > 0", s.data)
    _need(config.eval.every >= 0, "eval.every", "an int >= 0 (0: no periodic eval)", config.eval.every)


def rollout_config(config: mlc.ConfigDict) -> RolloutConfig:
    r = config.rollout
    return RolloutConfig(
        group_size=r.group_size,
        max_turns=r.max_turns,
        max_new_tokens=r.max_new_tokens,
        max_context=r.max_context,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        render_tools=r.render_tools,
        env_workers=r.env_workers,
        tool_timeout_s=r.tool_timeout_s,
        env_kwargs={k: dict(v) for k, v in dict(r.env_kwargs).items()},
    )


def learner_config(config: mlc.ConfigDict, *, sft: bool, total_steps: int) -> LearnerConfig:
    o = config.optimizer
    lr = config.sft.learning_rate if sft else o.learning_rate
    warmup = config.sft.warmup_steps if sft else o.warmup_steps
    return LearnerConfig(
        algorithm="sft" if sft else config.algorithm.name,
        learning_rate=lr,
        warmup_steps=min(warmup, max(1, total_steps // 2)),
        total_steps=max(1, total_steps),
        end_lr_ratio=o.end_lr_ratio,
        weight_decay=o.weight_decay,
        b1=o.b1,
        b2=o.b2,
        eps=o.eps,
        grad_clip_norm=o.grad_clip_norm,
        microbatches=o.microbatches,
        temperature=1.0,
        loss=losses.PolicyLossConfig(**config.algorithm.loss, max_len=config.loop.max_len),
    )


def make_tokenizer(config: mlc.ConfigDict) -> Tokenizer:
    spec = config.model.tokenizer
    if spec in ("", "byte"):
        return ByteTokenizer() if not config.model.path or spec == "byte" else HFTokenizer(config.model.path)
    return HFTokenizer(spec)


def make_model(config: mlc.ConfigDict, mesh: jax.sharding.Mesh) -> Transformer:
    m = config.model
    if m.path:
        from rl.models.hf import load_hf_model

        return load_hf_model(m.path, mesh=mesh, dtype=m.dtype, param_dtype=m.param_dtype)
    cfg = get_model_config(m.preset, dtype=m.dtype, param_dtype=m.param_dtype, **dict(m.overrides))
    seed = int(config.seed)
    return sharding.create_sharded_model(lambda: Transformer(cfg, rngs=nnx.Rngs(seed)), mesh, sharding.DEFAULT_RULES)


def make_pool(config: mlc.ConfigDict):
    from sandbox import Host, PoolConfig, WarmPool

    s = config.sandbox
    episodes = config.loop.tasks_per_step * config.rollout.group_size
    cores = os.cpu_count() or 2
    # Stateful domains hold a sandbox for a whole episode, so a rollout needs one per episode in
    # flight; stateless ones (hold_sandbox=False) only one per concurrent tool call.
    capacity = s.capacity or max(cores, min(episodes, 64))
    max_sandboxes = max(s.max_sandboxes or capacity, capacity)
    targets = list(s.hosts) or [s.backend]
    hosts = [Host(t, capacity=capacity, max_sandboxes=max_sandboxes) for t in targets]
    return WarmPool(hosts, config=PoolConfig(handle_signals=False))


@dataclasses.dataclass
class Experiment:
    """The live parts of one run (see :func:`build`)."""

    config: mlc.ConfigDict
    workdir: Path
    mesh: jax.sharding.Mesh
    model: Transformer
    tokenizer: Tokenizer
    sampler: Sampler
    pool: Any
    rollout: Rollout
    checkpointer: Checkpointer
    metrics: MetricsWriter

    def learner(self, *, sft: bool) -> Learner:
        steps = self.config.sft.steps if sft else self.config.loop.steps * self.config.algorithm.epochs
        return Learner(self.model, self.mesh, learner_config(self.config, sft=sft, total_steps=steps))

    def close(self) -> None:
        self.rollout.close()
        self.pool.close()
        self.checkpointer.close()
        self.metrics.close()


def save_config(config: mlc.ConfigDict, workdir: Path) -> None:
    """Writes ``config.json``; refuses a workdir that holds a different experiment."""
    path = workdir / "config.json"
    text = json.dumps(json.loads(config.to_json_best_effort()), indent=2, sort_keys=True)
    if path.exists():
        old = json.loads(path.read_text())
        new = json.loads(text)
        for d in (old, new):
            d.get("loop", {}).pop("steps", None)  # extending a run is allowed
        if old != new:
            raise ConfigError(f"{workdir} holds a different experiment (config.json differs); use a new --workdir")
    path.write_text(text + "\n")


def build(config: mlc.ConfigDict, workdir: str | os.PathLike) -> Experiment:
    """Checks ``config`` and builds every part of the run in ``workdir``."""
    check_config(config)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    is_main = jax.process_index() == 0
    if is_main:
        save_config(config, workdir)
    mesh = sharding.make_mesh(dict(config.mesh.shape))
    tokenizer = make_tokenizer(config)
    model = make_model(config, mesh)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ConfigError(
            f"config.model: tokenizer has {tokenizer.vocab_size} ids but the model only {model.config.vocab_size}"
        )
    sampler = Sampler(model, tokenizer, mesh, SamplerConfig(batch_buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256)))
    pool = make_pool(config)
    rcfg = rollout_config(config)
    examples = _example_tasks(config)
    factory = make_env_factory(
        rcfg,
        sandbox_factory=pool.acquire,
        sandbox_release=pool.release,
        token_counter=lambda text: len(tokenizer.encode(text)),
        example_tasks=examples,
    )
    rollout = Rollout(sampler, tokenizer, rcfg, EnvCache(factory), seed=int(config.seed))
    return Experiment(
        config=config,
        workdir=workdir,
        mesh=mesh,
        model=model,
        tokenizer=tokenizer,
        sampler=sampler,
        pool=pool,
        rollout=rollout,
        checkpointer=Checkpointer(
            workdir, max_to_keep=config.loop.keep_checkpoints, every=config.loop.checkpoint_every
        ),
        metrics=MetricsWriter(workdir, enabled=is_main),
    )


def _example_tasks(config: mlc.ConfigDict) -> dict[str, Any]:
    """One task per domain in the config (environments are built with one and reset with any)."""
    from envs.tasks import load_tasks

    out: dict[str, Any] = {}
    for pools in (dict(config.tasks), dict(config.eval.pools)):
        for pool in pools.values():
            for task in load_tasks(pool["source"], split=pool.get("split")):
                out.setdefault(task.domain, task)
    return out
