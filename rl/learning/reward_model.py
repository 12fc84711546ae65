"""A learned reward model: the policy backbone with a scalar head, its Bradley-Terry loss, and its files.

The model (:class:`RewardModel`) is any :class:`~rl.models.transformer.Transformer` (a preset, or a
Hugging Face checkpoint loaded by :mod:`rl.models.hf`) and a linear head ``r = h . w + b`` on the
final-norm hidden state ``h`` of each sequence's last real token, in float32. The head starts at
zero, so an untrained judge has no opinion: every score is 0 and its pair accuracy is chance (0.5,
ties count half).

Loss (Bradley-Terry, as InstructGPT's reward model): on a :func:`rl.learning.preference.pair_batch`
(``P`` chosen rows, then the ``P`` rejected ones in the same order), ``m = r_chosen - r_rejected``
and ``loss = -log sigmoid(m)``, a weighted mean over pairs. Metrics (pair means): ``loss``,
``accuracy`` (``m > 0``, ties half), ``margin`` (``m``), ``chosen`` and ``rejected`` (the scores).

Files (:func:`save_reward_model`): ``<dir>/params`` (orbax; LoRA adapters merged into the base),
``<dir>/reward_model.json`` (:class:`RewardModelInfo`: architecture, tokenizer, the held-out
accuracy and the score mean / std the judge normalizes with) and ``<dir>/heldout_pairs.jsonl``
(the held-out pairs as tokens, so a run using the judge measures its accuracy again before step 1).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils

from rl.learning.batch import DEFAULT_BATCH_BUCKETS, DEFAULT_LENGTH_BUCKETS, round_up
from rl.learning.preference import Pair
from rl.models.config import ModelConfig, RopeScaling
from rl.models.lora import has_lora, merge_lora
from rl.models.sharding import DEFAULT_RULES, Rules, make_mesh, state_shardings
from rl.models.transformer import Transformer

RM_METRICS = ("loss", "accuracy", "margin", "chosen", "rejected")
INFO_FILE, PARAMS_DIR, HELDOUT_FILE = "reward_model.json", "params", "heldout_pairs.jsonl"
FORMAT = 1


class RewardHead(nnx.Module):
    """``r = h . w + b`` in float32, zero-initialised (no opinion before training)."""

    def __init__(self, hidden_size: int):
        with nnx.use_eager_sharding(False):
            self.kernel = nnx.Param(nnx.with_partitioning(nnx.initializers.zeros, ("embed",))(None, (hidden_size,)))
            self.bias = nnx.Param(jnp.zeros((), jnp.float32))

    def __call__(self, hidden: jax.Array) -> jax.Array:
        return hidden.astype(jnp.float32) @ self.kernel[...] + self.bias[...]


class RewardModel(nnx.Module):
    """A backbone and a :class:`RewardHead`: one float32 score per sequence.

    Args:
      backbone: the transformer (shared, not copied: training it trains this module).
      head: the scalar head (a fresh zero head by default).
    """

    def __init__(self, backbone: Transformer, head: RewardHead | None = None):
        self.backbone = backbone
        self.head = head if head is not None else RewardHead(backbone.config.hidden_size)

    def __call__(self, tokens: jax.Array, input_mask: jax.Array, remat: bool = False) -> jax.Array:
        """Scores ``[B]`` of ``[B, T]`` rows; each row is one sequence (positions ``0..T-1``, padding
        anywhere ``input_mask`` is False); the score reads the row's last real token. ``remat``:
        training recomputes each layer's activations in the backward pass (``LearnerConfig.remat``)."""
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        hidden, _ = self.backbone.hidden_states(tokens, positions, input_mask, remat=remat)
        last = jnp.max(jnp.where(input_mask, positions, 0), axis=1)
        return self.head(jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0])


def bradley_terry_loss(scores: jax.Array, weights: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The weighted mean of ``-log sigmoid(r_chosen - r_rejected)`` over a pair layout, and its metrics.

    ``scores``: ``[2P]`` (chosen rows first); ``weights``: ``[2P]`` (a pair's weight is its chosen row's).
    """
    p = scores.shape[0] // 2
    scores = scores.astype(jnp.float32)
    chosen, rejected = scores[:p], scores[p:]
    margin = chosen - rejected
    w = weights[:p].astype(jnp.float32)
    total = jnp.maximum(w.sum(), 1e-9)
    mean = lambda x: (x * w).sum() / total  # noqa: E731
    won = jnp.where(margin > 0, 1.0, jnp.where(margin == 0, 0.5, 0.0))
    metrics = {
        "loss": mean(-jax.nn.log_sigmoid(margin)),
        "accuracy": mean(won),
        "margin": mean(margin),
        "chosen": mean(chosen),
        "rejected": mean(rejected),
    }
    return metrics["loss"], metrics


def pair_accuracy(chosen: np.ndarray, rejected: np.ndarray) -> float:
    """Share of pairs whose chosen score is higher (ties count half), as :func:`bradley_terry_loss`."""
    chosen, rejected = np.asarray(chosen, np.float64), np.asarray(rejected, np.float64)
    if not len(chosen):
        raise ValueError("pair_accuracy: no pairs")
    return float(np.mean((chosen > rejected) + 0.5 * (chosen == rejected)))


def score_sequences(
    apply: Callable[[np.ndarray, np.ndarray], Any],
    seqs: Sequence[Sequence[int]],
    *,
    pad_id: int,
    max_len: int | None = None,
    row_multiple: int = 1,
    max_rows: int = 32,
) -> np.ndarray:
    """Scores of token sequences through ``apply(tokens [B, T], input_mask [B, T]) -> [B]``.

    Batches of at most ``max_rows`` (padded to a bucketed row count, a multiple of
    ``row_multiple``, and a bucketed length, so few shapes compile); sequences are cut to
    ``max_len`` tokens from the start, as :func:`rl.learning.preference.pair_batch` cuts them.
    """
    out = []
    seqs = [list(s[:max_len]) if max_len else list(s) for s in seqs]
    if any(not s for s in seqs):
        raise ValueError("score_sequences: an empty sequence has no token to score")
    for start in range(0, len(seqs), max_rows):
        chunk = seqs[start : start + max_rows]
        rows = -(-round_up(len(chunk), DEFAULT_BATCH_BUCKETS) // row_multiple) * row_multiple
        t = round_up(max(len(s) for s in chunk), DEFAULT_LENGTH_BUCKETS)
        tokens = np.full((rows, t), pad_id, np.int32)
        mask = np.zeros((rows, t), bool)
        for i, s in enumerate(chunk):
            tokens[i, : len(s)], mask[i, : len(s)] = s, True
        mask[len(chunk) :, 0] = True  # padding rows score something finite; dropped below
        out.append(np.asarray(jax.device_get(apply(tokens, mask)), np.float32)[: len(chunk)])
    return np.concatenate(out)


# -- files --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RewardModelInfo:
    """``reward_model.json``: what a run needs to rebuild, check and normalize the judge.

    Attributes:
      model_config: the backbone's :class:`~rl.models.config.ModelConfig` fields.
      tokenizer: ``"byte"`` or the path of the tokenizer.json (or its directory) it was trained with.
      max_len: sequences are cut to this many tokens, in training and when judging.
      heldout_accuracy, heldout_pairs: pair accuracy on the held-out pairs, and how many there are.
      score_mean, score_std: of the raw scores of every held-out sequence; the judge's normalization.
      train_pairs, steps: what it was trained on, for the record.
    """

    model_config: dict[str, Any]
    tokenizer: str
    max_len: int
    heldout_accuracy: float
    heldout_pairs: int
    score_mean: float
    score_std: float
    train_pairs: int = 0
    steps: int = 0
    format: int = FORMAT

    def backbone_config(self) -> ModelConfig:
        fields = dict(self.model_config)
        if fields.get("rope_scaling") is not None:
            fields["rope_scaling"] = RopeScaling(**fields["rope_scaling"])
        return ModelConfig(**fields)


def _pure_params(model: RewardModel) -> dict[str, Any]:
    if has_lora(model.backbone):  # a plain backbone: the judge never needs the adapter machinery
        model = RewardModel(merge_lora(model.backbone), model.head)
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def save_reward_model(
    model: RewardModel, directory: str | os.PathLike, info: RewardModelInfo, heldout: Sequence[Pair]
) -> Path:
    """Writes the files of the module docstring; the directory appears whole or not at all."""
    directory = Path(directory).absolute()
    tmp, old = directory.with_name(directory.name + ".tmp"), directory.with_name(directory.name + ".old")
    main = jax.process_index() == 0  # a job's processes all save their shards; one writes the files
    if main:
        for stale in (tmp, old):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("agentrl:save_reward_model")
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(tmp / PARAMS_DIR, _pure_params(model))
        ckpt.wait_until_finished()
    if not main:
        return directory
    (tmp / INFO_FILE).write_text(json.dumps(dataclasses.asdict(info), indent=2, sort_keys=True) + "\n")
    (tmp / HELDOUT_FILE).write_text("".join(json.dumps(p.to_dict()) + "\n" for p in heldout))
    if directory.exists():
        directory.rename(old)
    tmp.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory


def read_info(directory: str | os.PathLike) -> RewardModelInfo:
    """The ``reward_model.json`` of a saved reward model; the error says what the directory lacks."""
    file = Path(directory) / INFO_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{directory}: not a saved reward model (no {INFO_FILE}); train one with a "
                                "config.reward_model run (configs/reward_model.py)")  # fmt: skip
    data = json.loads(file.read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{file}: format {data.get('format')!r}, this code reads format {FORMAT}")
    return RewardModelInfo(**data)


def read_heldout(directory: str | os.PathLike) -> list[Pair]:
    lines = (Path(directory) / HELDOUT_FILE).read_text().splitlines()
    return [Pair.from_dict(json.loads(line)) for line in lines if line.strip()]


def load_reward_model(
    directory: str | os.PathLike, mesh: jax.sharding.Mesh | None = None, rules: Rules = DEFAULT_RULES
) -> tuple[RewardModel, RewardModelInfo]:
    """A saved reward model, restored straight into its shardings on ``mesh`` (default: one device)."""
    directory = Path(directory).absolute()
    info = read_info(directory)
    config = info.backbone_config()
    mesh = mesh if mesh is not None else make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
    abstract = nnx.eval_shape(lambda: RewardModel(Transformer(config, rngs=None, rules=rules)))
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    shardings = nnx.to_pure_dict(state_shardings(params, mesh, rules))
    target = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), nnx.to_pure_dict(params), shardings
    )
    with ocp.StandardCheckpointer() as ckpt:
        restored = ckpt.restore(directory / PARAMS_DIR, target)
    nnx.replace_by_pure_dict(params, restored)
    return nnx.merge(graphdef, params, rest), info
