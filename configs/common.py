"""Reusable pieces of experiment configs (model, tasks, sandbox, algorithm, optimizer, rollout, eval, loop).

Code is named by string; AdamW's b1, b2 and eps come from ``rl.learning.LearnerConfig``, so a run and a
learner built directly train alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_collections as mlc

from rl.learning.learner_config import LearnerConfig


def model(
    preset: str = "tiny",
    *,
    path: str = "",
    tokenizer: str = "byte",
    dtype: str = "float32",
    param_dtype: str = "float32",
    **overrides: Any,
) -> mlc.ConfigDict:
    """A model preset (``rl.models.PRESETS``) or, with ``path``, a local Hugging Face directory.

    ``tokenizer``: ``"byte"`` (the embedded byte-level default) or a directory / tokenizer.json.
    ``overrides`` change preset fields (e.g. ``num_layers=4``).
    """
    return mlc.ConfigDict(
        {
            "preset": preset,
            "path": path,
            "tokenizer": tokenizer,
            "dtype": dtype,
            "param_dtype": param_dtype,
            "overrides": dict(overrides),
        }
    )


def lora(
    rank: int = 16,
    *,
    alpha: float = 32.0,
    dropout: float = 0.0,
    target_modules: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down"),
) -> mlc.ConfigDict:
    """LoRA adapters for ``config.model.lora`` (``rl.models.lora.LoRAConfig``): setting it turns
    LoRA on, and every learner then trains only the adapters (the base weights stay frozen).

    Example: ``config.model = model("qwen2.5-0.5b", ...); config.model.lora = lora(16)``.
    """
    return mlc.ConfigDict({"rank": rank, "alpha": alpha, "dropout": dropout, "target_modules": list(target_modules)})


def mesh(data: int = 1, fsdp: int = -1, tensor: int = 1) -> mlc.ConfigDict:
    """Mesh axis sizes; -1 means "the rest of the devices". Logical→mesh rules live in rl.models.sharding."""
    return mlc.ConfigDict({"shape": {"data": data, "fsdp": fsdp, "tensor": tensor}})


def pool(source: str, weight: float = 1.0, split: str | None = None) -> dict[str, Any]:
    """One task pool of the training/eval mix (``builtin:math``, ``arithmetic:train``, a JSONL path...)."""
    return {"source": source, "weight": weight, "split": split}


def sandbox(
    backend: str = "bwrap",
    *,
    hosts: tuple[str, ...] = (),
    capacity: int = 0,
    max_sandboxes: int = 0,
    fleet: str = "local",
    address: str = "auto",
) -> mlc.ConfigDict:
    """Where tool calls run: ``bwrap`` (local, fast) or ``docker`` (``hosts``: daemon URLs).

    ``capacity``/``max_sandboxes`` of 0 mean "derive from the host's cores" (per node with
    ``fleet="ray"``). ``fleet="ray"``: a sandbox agent on every node of the Ray cluster at
    ``address`` (``"auto"``: the one ``ray start`` made; ``"local"``: start one in the process;
    ``HOST:PORT``), each running ``backend`` (or ``hosts``, as its node sees them) on its node
    (``pip install 'agentrl[ray]'``).
    """
    return mlc.ConfigDict(
        {
            "backend": backend,
            "hosts": list(hosts),
            "capacity": capacity,
            "max_sandboxes": max_sandboxes,
            "fleet": fleet,
            "address": address,
        }
    )


def grpo(
    *,
    advantage: str = "grpo",
    policy_loss: str = "ppo_clip",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    aggregation: str = "token",
    dynamic_sampling: bool = False,
    epochs: int = 1,
    tis_cap: float = 0.0,
) -> mlc.ConfigDict:
    """GRPO and its published variants (Dr. GRPO: ``advantage="dr_grpo", aggregation="constant"``;
    DAPO: ``clip_high=0.28, dynamic_sampling=True``; GSPO: :func:`gspo`). ``tis_cap`` > 0: truncated importance sampling
    for stale samples of an asynchronous run (``loop.max_staleness`` > 0; e.g. 2.0).

    ``name`` labels the run; what runs is the advantage estimator ``advantage``
    (``rl.learning.advantages.ESTIMATORS``) and the policy loss ``policy_loss``
    (``rl.learning.losses.POLICY_LOSSES``).
    """
    return mlc.ConfigDict(
        {
            "name": "grpo",
            "advantage": advantage,
            "dynamic_sampling": dynamic_sampling,
            "epochs": epochs,
            "loss": {
                "name": policy_loss,
                "clip_low": clip_low,
                "clip_high": clip_high,
                "kl_coef": kl_coef,
                "entropy_coef": entropy_coef,
                "aggregation": aggregation,
                "tis_cap": tis_cap,
            },
        }
    )


def ppo(*, clip: float = 0.2, epochs: int = 2, kl_coef: float = 0.0, entropy_coef: float = 0.0) -> mlc.ConfigDict:
    """Critic-free PPO-clip: batch-baseline advantages, several passes over each rollout batch
    (the importance ratio against the sampler's log-probs keeps later passes correct)."""
    cfg = grpo(
        advantage="batch", clip_low=clip, clip_high=clip, kl_coef=kl_coef, entropy_coef=entropy_coef, epochs=epochs
    )
    cfg.name = "ppo"
    return cfg


def gspo(
    *,
    advantage: str = "grpo",
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    aggregation: str = "sequence",
    dynamic_sampling: bool = False,
    epochs: int = 1,
) -> mlc.ConfigDict:
    """GSPO (Zheng et al. 2025): GRPO's group advantages with one clipped importance ratio per
    sequence (``algorithm.loss.name="gspo"``). Its clip range is sequence-level, hence the paper's
    narrow default (3e-4 / 4e-4); ``aggregation="sequence"`` averages over sequences, as the paper."""
    cfg = grpo(
        advantage=advantage,
        policy_loss="gspo",
        clip_low=clip_low,
        clip_high=clip_high,
        kl_coef=kl_coef,
        entropy_coef=entropy_coef,
        aggregation=aggregation,
        dynamic_sampling=dynamic_sampling,
        epochs=epochs,
    )
    cfg.name = "gspo"
    return cfg


def optimizer(
    learning_rate: float = 3e-4,
    *,
    warmup_steps: int = 5,
    weight_decay: float = 0.0,
    grad_clip_norm: float = 1.0,
    microbatches: int = 1,
    end_lr_ratio: float = 0.1,
    remat: bool = False,
    logits_chunk_mib: int = 64,
) -> mlc.ConfigDict:
    """AdamW with linear warmup then cosine decay to ``end_lr_ratio * learning_rate``.

    ``remat``: every learner of the run recomputes each layer's activations in its backward pass
    instead of keeping them (``rl.learning.LearnerConfig.remat``): less memory, more compute.
    ``logits_chunk_mib``: the LM head's float32 logits per chunk and device (smaller: less memory)."""
    return mlc.ConfigDict(
        {
            "learning_rate": learning_rate,
            "warmup_steps": warmup_steps,
            "weight_decay": weight_decay,
            "grad_clip_norm": grad_clip_norm,
            "microbatches": microbatches,
            "b1": LearnerConfig.b1,
            "b2": LearnerConfig.b2,
            "eps": LearnerConfig.eps,
            "end_lr_ratio": end_lr_ratio,
            "remat": remat,
            "logits_chunk_mib": logits_chunk_mib,
        }
    )


def rollout(
    *,
    group_size: int = 8,
    max_turns: int = 4,
    max_new_tokens: int = 256,
    max_context: int = 2048,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    render_tools: bool = True,
    env_workers: int = 8,
    tool_timeout_s: float = 30.0,
    engine: bool = True,
    engine_slots: int = 0,
    step_deadline_s: float = 600.0,
) -> mlc.ConfigDict:
    """How episodes are sampled (``rl.rollout.lockstep.RolloutConfig``). Training samples at temperature 1
    with no top-p / top-k: the learner's importance ratios use the sampler's unfiltered log-probs."""
    return mlc.ConfigDict(
        {
            "group_size": group_size,
            "max_turns": max_turns,
            "max_new_tokens": max_new_tokens,
            "max_context": max_context,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "render_tools": render_tools,
            "env_workers": env_workers,
            "tool_timeout_s": tool_timeout_s,
            "env_kwargs": {},
            "engine": engine,
            "engine_slots": engine_slots,
            "step_deadline_s": step_deadline_s,
        }
    )


def sft(
    steps: int = 0,
    *,
    data: str = "",
    batch_size: int = 32,
    learning_rate: float = 1e-3,
    warmup_steps: int = 10,
    options: dict[str, Any] | None = None,
    check_every: int = 0,
    check_tasks: int = 32,
    until_pass_rate: float = 0.0,
    anneal_steps: int = 0,
) -> mlc.ConfigDict:
    """An optional supervised warm start before RL (``steps=0``: none), with its own optimizer schedule.

    ``data``: a demonstration source a domain registers (``envs.demonstrations``, e.g. ``"arithmetic"``,
    built with ``options``) or ``"jsonl:PATH"`` (one conversation per line).

    ``check_every > 0`` ends SFT when its skill arrived rather than after ``steps`` (then the cap):
    the learning rate holds its peak while, every ``check_every`` steps, the policy samples one
    episode of each of ``check_tasks`` training tasks; at the first check whose pass rate is at
    least ``until_pass_rate`` the rate decays over ``anneal_steps`` and SFT ends
    (``rl.phases.sft_check``). No passing check: the decay starts ``anneal_steps`` before ``steps``.
    """
    return mlc.ConfigDict(
        {
            "steps": steps,
            "data": data,
            "batch_size": batch_size,
            "learning_rate": learning_rate,
            "warmup_steps": warmup_steps,
            "options": dict(options or {}),
            "check_every": check_every,
            "check_tasks": check_tasks,
            "until_pass_rate": until_pass_rate,
            "anneal_steps": anneal_steps,
        }
    )


def preference(
    steps: int = 0,
    *,
    data: str = "mined",
    batch_size: int = 16,
    learning_rate: float = 1e-4,
    warmup_steps: int = 0,
    loss: str = "dpo",
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    gamma: float = 0.5,
    mine_tasks: int = 64,
    mine_group: int = 8,
    max_pairs_per_task: int = 4,
) -> mlc.ConfigDict:
    """An optional preference phase between SFT and RL (``steps=0``: none): DPO (``loss="dpo"``,
    ``beta``, ``label_smoothing``) or reference-free SimPO (``loss="simpo"``, ``beta``, ``gamma``).

    ``data="mined"`` mines pairs from the policy's own rollouts when the phase starts: ``mine_group``
    episodes on each of ``mine_tasks`` training tasks, a passing episode against a failing one per
    task (anomalies left out); or ``"jsonl:PATH"`` with ``{"prompt", "chosen", "rejected"}`` lines.
    """
    return mlc.ConfigDict(
        {
            "steps": steps,
            "data": data,
            "batch_size": batch_size,
            "learning_rate": learning_rate,
            "warmup_steps": warmup_steps,
            "loss": loss,
            "beta": beta,
            "label_smoothing": label_smoothing,
            "gamma": gamma,
            "mine_tasks": mine_tasks,
            "mine_group": mine_group,
            "max_pairs_per_task": max_pairs_per_task,
        }
    )


def reward_model(
    steps: int = 0,
    *,
    data: str = "",
    batch_size: int = 16,
    learning_rate: float = 1e-3,
    warmup_steps: int = 0,
    heldout_fraction: float = 0.25,
    eval_every: int = 0,
) -> mlc.ConfigDict:
    """A reward-model run (``steps`` > 0; its SFT, preference and RL steps must be 0): the run's model
    with a scalar head, trained with the Bradley-Terry loss on ``data="jsonl:PATH"`` pairs
    (``{"prompt", "chosen", "rejected"}`` lines). ``heldout_fraction`` of the pairs (seeded) measure it
    every ``eval_every`` steps and at the end; it is saved to ``<workdir>/reward_model``.
    """
    return mlc.ConfigDict(
        {
            "steps": steps,
            "data": data,
            "batch_size": batch_size,
            "learning_rate": learning_rate,
            "warmup_steps": warmup_steps,
            "heldout_fraction": heldout_fraction,
            "eval_every": eval_every,
        }
    )


def learned_reward(path: str, *, min_accuracy: float = 0.75, clip: float = 3.0) -> mlc.ConfigDict:
    """``config.learned_reward``: the judge behind the ``learned`` parts of the rollout's verifier configs,
    e.g. ``config.rollout.env_kwargs = {"arithmetic": {"verifier": {"outcome": 1.0, "learned": 0.2}}}``.

    ``path``: a reward-model run's workdir (or its ``reward_model`` directory). The run refuses to start
    unless the judge's held-out pair accuracy, measured again before step 1, is at least
    ``min_accuracy``; its scores are normalized by its held-out mean and std, clipped to
    ``[-clip, clip]`` and mapped to ``[0, 1]``.
    """
    return mlc.ConfigDict({"path": str(path), "min_accuracy": min_accuracy, "clip": clip})


def evaluation(
    pools: dict[str, dict[str, Any]],
    *,
    every: int = 10,
    num_tasks: int = 100,
    k: int = 4,
    temperature: float = 1.0,
    check_tool: str = "",
    edit_tools: tuple[str, ...] = (),
) -> mlc.ConfigDict:
    """Held-out evaluation: greedy pass rate, and pass@1 / pass@k from ``k`` samples at ``temperature``.
    With ``check_tool`` and ``edit_tools`` (e.g. ``"run_tests"``, ``("replace",)``) it also reports the
    share of passing greedy episodes that ran the check again after an edit."""
    return mlc.ConfigDict(
        {
            **{"pools": pools, "every": every, "num_tasks": num_tasks, "k": k, "temperature": temperature},
            **{"check_tool": check_tool, "edit_tools": list(edit_tools)},
        }
    )


def loop(
    *,
    steps: int = 100,
    tasks_per_step: int = 16,
    checkpoint_every: int = 10,
    keep_checkpoints: int = 3,
    max_len: int = 2048,
    pack_sequences: bool = True,
    max_anomaly_rate: float = 0.5,
    anomaly_patience: int = 3,
    max_staleness: int = 0,
) -> mlc.ConfigDict:
    """The outer loop. ``pack_sequences`` puts several trajectories in one row of the learner's batch
    (needs ``algorithm.loss.aggregation`` "token" or "sequence", which count packed segments; set
    False for "constant").
    The circuit breaker stops a run whose episodes are more than ``max_anomaly_rate`` anomalies
    (environment failures) for ``anomaly_patience`` RL steps in a row (``max_anomaly_rate=1``: off).
    ``max_staleness`` > 0 makes RL asynchronous: step t trains on episodes sampled by the policy of
    step t - 1 - max_staleness, so sampling the next steps overlaps this step's update (0: on-policy)."""
    return mlc.ConfigDict(
        {
            "steps": steps,
            "tasks_per_step": tasks_per_step,
            "checkpoint_every": checkpoint_every,
            "keep_checkpoints": keep_checkpoints,
            "max_len": max_len,
            "pack_sequences": pack_sequences,
            "max_anomaly_rate": max_anomaly_rate,
            "anomaly_patience": anomaly_patience,
            "max_staleness": max_staleness,
        }
    )


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
    episodes of 2 tasks, ``steps`` RL steps with a one-step warmup (a warmup must fit in the steps)."""
    config.model = model("tiny")
    config.optimizer.update({"microbatches": 1, "warmup_steps": 1})
    config.rollout.update({"group_size": 2, "max_new_tokens": 32, "max_context": max_len, **rollout_fields})
    config.eval.update({"num_tasks": num_tasks, "k": k})
    config.loop.update({"steps": steps, "tasks_per_step": 2, "max_len": max_len})
    return config


def base(**parts: Any) -> mlc.ConfigDict:
    """An experiment from its parts; every part has a default."""
    config = mlc.ConfigDict()
    config.seed = parts.pop("seed", 0)
    config.model = parts.pop("model", model())
    config.mesh = parts.pop("mesh", mesh())
    config.tasks = parts.pop("tasks", {})
    config.sandbox = parts.pop("sandbox", sandbox())
    config.algorithm = parts.pop("algorithm", grpo())
    config.optimizer = parts.pop("optimizer", optimizer())
    config.rollout = parts.pop("rollout", rollout())
    config.sft = parts.pop("sft", sft())
    config.eval = parts.pop("eval", evaluation({}))
    config.loop = parts.pop("loop", loop())
    if parts:
        raise ValueError(f"configs.common.base: unknown parts {sorted(parts)}")
    return config
