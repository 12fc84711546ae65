"""Low-rank adapters (LoRA) on the transformer's projections: attach, merge, save and load.

An adapted projection computes ``base(x) + (alpha / rank) * dropout(x) @ A @ B``. ``B`` starts at
zero, so a freshly adapted model *is* the base model. Adapters are attached to an existing model
(:func:`apply_lora`), so a preset initialised from a seed and a Hugging Face checkpoint are adapted
the same way, after loading, without touching the loader.

Why these choices:
  - **A Variable type of its own** (:class:`LoRAParam`, a subclass of ``nnx.LoRAParam`` and so of
    ``nnx.Param``): ``nnx.state(model, LoRAParam)`` selects exactly the adapters, which is how the
    learner takes gradients and builds optimizer state for them alone. Filters on ``nnx.Param``
    still see them, so code that handles "all parameters" keeps working.
  - **Weights keep their layouts.** ``A`` carries the base weight's input axes and ``B`` its output
    axes, e.g. for the query kernel ``(embed, q_heads, head_dim)``: ``A`` is ``(embed, rank)`` and
    ``B`` ``(rank, q_heads, head_dim)``. The existing logical-axis rules then shard them like their
    base weight; the ``"lora_rank"`` axis has no rule, so it is replicated. ``A @ B`` has exactly
    the base weight's shape, which makes merging a plain addition.
  - **float32 adapters** by default (:attr:`LoRAConfig.param_dtype`): they are tiny, and AdamW
    updates of ~1e-5 relative size vanish in bfloat16. They are cast to the compute dtype in the
    forward pass, like the base weights.
  - **Dropout is off unless a learner turns it on** (``nnx.view(model, deterministic=False)``):
    the sampler and decode engine run the adapted forward as it is, deterministically.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from safetensors import safe_open
from safetensors.numpy import save_file

from rl.config.schema import setting, validate
from rl.models.sharding import Rules, state_shardings

#: Projections that can carry an adapter: attention (``q``, ``k``, ``v``, ``o``) and MLP (``gate``, ``up``, ``down``).
TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
_ATTENTION = ("q", "k", "v", "o")
_DTYPES = ("float32", "bfloat16", "float16")
ADAPTER_FILE = "adapters.safetensors"


class LoRAParam(nnx.LoRAParam):
    """An adapter matrix: the Variable type the learner's LoRA filter selects."""


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """Which projections get adapters, and their shape and scale.

    Attributes:
      rank: inner dimension ``r`` of ``A`` (``[in, r]``) and ``B`` (``[r, out]``).
      alpha: the update is scaled by ``alpha / rank`` (so a change of rank keeps its size).
      dropout: probability of dropping an adapter's *input* features while training (0: off).
      target_modules: projection names among :data:`TARGETS`.
      param_dtype: storage dtype of ``A`` and ``B``.
      seed: initialisation of ``A`` (and the dropout stream).
    """

    rank: int = setting(16, low=1)
    alpha: float = setting(32.0, check=lambda v: v > 0, expected="a number > 0")
    dropout: float = setting(0.0, check=lambda v: 0 <= v < 1, expected="a float in [0, 1)")
    target_modules: tuple[str, ...] = setting(
        TARGETS,
        check=lambda t: bool(t) and set(t) <= set(TARGETS) and len(set(t)) == len(t),
        expected=f"distinct names among {TARGETS}",
    )
    param_dtype: str = setting("float32", choices=_DTYPES)
    seed: int = 0

    def __post_init__(self) -> None:
        validate(self)

    @property
    def scale(self) -> float:
        return float(self.alpha) / self.rank


class Adapter(nnx.Module):
    """``(alpha / rank) * dropout(x) @ A @ B`` for one projection whose weight is ``[*in_shape, *out_shape]``."""

    def __init__(
        self,
        in_axes: Sequence[tuple[int, str]],
        out_axes: Sequence[tuple[int, str]],
        config: LoRAConfig,
        rngs: nnx.Rngs,
    ):
        r, dtype = config.rank, jnp.dtype(config.param_dtype)
        in_shape, in_logical = (tuple(x) for x in zip(*in_axes, strict=True))
        out_shape, out_logical = (tuple(x) for x in zip(*out_axes, strict=True))
        self.out_shape = out_shape
        self.rank = r
        self.scale = config.scale
        fan_in = math.prod(in_shape)
        # Kaiming-uniform A (as PEFT and nnx.LoRA), zero B: the adapted model starts as the base model.
        init_a = nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform", in_axis=tuple(range(len(in_shape))))
        a = nnx.with_partitioning(init_a, (*in_logical, "lora_rank"))(rngs.params(), (*in_shape, r), dtype)
        b = nnx.with_partitioning(nnx.initializers.zeros, ("lora_rank", *out_logical))(
            rngs.params(), (r, *out_shape), dtype
        )
        self.a, self.b = LoRAParam(a), LoRAParam(b)
        assert self.a.shape[:-1] == in_shape and fan_in > 0
        self.dropout = nnx.Dropout(config.dropout, deterministic=True, rngs=rngs) if config.dropout > 0 else None

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x``: ``[..., prod(in_shape)]`` -> the update ``[..., *out_shape]`` in ``x``'s dtype."""
        a = self.a[...].astype(x.dtype).reshape(-1, self.rank)
        b = self.b[...].astype(x.dtype).reshape(self.rank, -1)
        if self.dropout is not None and not self.dropout.deterministic:
            # Read the stream without advancing it: a module merged inside a traced step may not
            # mutate state from an outer trace. The learner sets the counter to the step number.
            stream = self.dropout.rngs
            x = self.dropout(x, rngs=jax.random.fold_in(stream.key[...], stream.count[...]))
        out = ((x @ a) @ b) * jnp.asarray(self.scale, x.dtype)
        return out.reshape(*x.shape[:-1], *self.out_shape)

    def delta(self) -> jax.Array:
        """The merged update ``scale * A @ B`` in float32, shaped like the base weight."""
        a, b = self.a[...].astype(jnp.float32), self.b[...].astype(jnp.float32)
        return self.scale * jnp.tensordot(a, b, axes=1)


def _projection_axes(model: Any, name: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(input axes, output axes) of projection ``name`` as (size, logical name) pairs."""
    c = model.config
    e, m, h, kv, d = c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim
    return {
        "q": ([(e, "embed")], [(h, "q_heads"), (d, "head_dim")]),
        "k": ([(e, "embed")], [(kv, "kv_heads"), (d, "head_dim")]),
        "v": ([(e, "embed")], [(kv, "kv_heads"), (d, "head_dim")]),
        "o": ([(h, "q_heads"), (d, "head_dim")], [(e, "embed")]),
        "gate": ([(e, "embed")], [(m, "mlp")]),
        "up": ([(e, "embed")], [(m, "mlp")]),
        "down": ([(m, "mlp")], [(e, "embed")]),
    }[name]


def _owner(layer: Any, name: str) -> Any:
    return layer.attn if name in _ATTENTION else layer.mlp


def apply_lora(model: Any, config: LoRAConfig, mesh: Mesh | None = None, rules: Rules | None = None) -> Any:
    """Attaches zero-initialised adapters to ``config.target_modules`` of every layer of ``model`` (in place).

    With ``mesh``, the adapters are placed in their logical-axis shardings (``rules``: the model's),
    so they sit on the same devices as the weights they adapt. Returns ``model``.
    """
    if not isinstance(config, LoRAConfig):
        raise TypeError(f"apply_lora(config=): expected a LoRAConfig, got {type(config).__name__}")
    if has_lora(model):
        raise ValueError("apply_lora(model=): the model already has adapters")
    rngs = nnx.Rngs(params=config.seed, dropout=config.seed + 1)
    with nnx.use_eager_sharding(False):
        for layer in model.layers:
            for owner in (layer.attn, layer.mlp):
                names = [n for n in config.target_modules if _owner(layer, n) is owner]
                owner.lora = nnx.Dict({n: Adapter(*_projection_axes(model, n), config, rngs) for n in names})
    if mesh is not None:
        state = nnx.state(model, LoRAParam)
        nnx.update(model, jax.device_put(state, state_shardings(state, mesh, rules or model.rules)))
    return model


def has_lora(model: Any) -> bool:
    """Whether ``model`` carries adapters."""
    return bool(jax.tree.leaves(nnx.state(model, LoRAParam)))


def adapters(model: Any) -> dict[tuple[int, str], Adapter]:
    """``{(layer index, projection name): Adapter}`` of ``model``."""
    out = {}
    for i, layer in enumerate(model.layers):
        for owner in (layer.attn, layer.mlp):
            for name, adapter in dict(getattr(owner, "lora", None) or {}).items():
                out[i, name] = adapter
    return out


def merge_lora(model: Any) -> Any:
    """A plain ``Transformer`` (no adapters) whose adapted weights are ``W + scale * A @ B``.

    ``model`` is left as it is; untouched weights are shared with it, not copied. The sum is taken
    in float32 and rounded once to the parameter dtype.
    """
    from rl.models.transformer import Transformer

    plain = nnx.graphdef(nnx.eval_shape(lambda: Transformer(model.config, rules=model.rules)))
    flat = {path: var for path, var in nnx.to_flat_state(nnx.state(model)) if "lora" not in path}
    for (i, name), adapter in adapters(model).items():
        path = ("layers", i, "attn" if name in _ATTENTION else "mlp", name)
        base = flat[path]
        merged = base.get_value().astype(jnp.float32) + adapter.delta()
        flat[path] = base.replace(merged.astype(base.dtype))
    return nnx.merge(plain, nnx.from_flat_state(flat))


# ----------------------------------------------------------------------------- adapter files


def _key(path: tuple[Any, ...]) -> str:
    return ".".join(map(str, path))


def save_adapters(model: Any, path: str | os.PathLike[str], config: LoRAConfig | None = None) -> Path:
    """Writes only the adapter tensors to ``path/adapters.safetensors`` (``path`` a directory).

    ``config`` (recommended) is stored in the file's metadata, so :func:`read_adapter_config` can
    rebuild the same adapters before :func:`load_adapters`. Returns the file written.
    """
    state = nnx.to_flat_state(nnx.state(model, LoRAParam))
    if not len(state):
        raise ValueError("save_adapters(model=): the model has no adapters (see apply_lora)")
    tensors = {_key(p): np.asarray(jax.device_get(v.get_value())) for p, v in state}
    metadata = {"format": "agentrl-lora"}
    if config is not None:
        metadata["lora_config"] = json.dumps(dataclasses.asdict(config))
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    file = directory / ADAPTER_FILE
    tmp = file.with_suffix(".tmp")
    save_file({k: np.ascontiguousarray(t) for k, t in tensors.items()}, str(tmp), metadata=metadata)
    os.replace(tmp, file)
    return file


def _file(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return p / ADAPTER_FILE if p.is_dir() else p


def read_adapter_config(path: str | os.PathLike[str]) -> LoRAConfig:
    """The :class:`LoRAConfig` stored by :func:`save_adapters` (``path``: the directory or the file)."""
    with safe_open(str(_file(path)), framework="numpy") as handle:
        raw = (handle.metadata() or {}).get("lora_config")
    if raw is None:
        raise ValueError(f"{_file(path)}: no lora_config in the metadata (saved without config=)")
    return LoRAConfig(**json.loads(raw))


def load_adapters(model: Any, path: str | os.PathLike[str]) -> Any:
    """Loads adapter tensors saved by :func:`save_adapters` into ``model``'s adapters (in place).

    The model must already carry the same adapters (:func:`apply_lora` with the saved config);
    each tensor keeps the sharding of the adapter it replaces. Returns ``model``.
    """
    file = _file(path)
    flat = dict(nnx.to_flat_state(nnx.state(model, LoRAParam)))
    if not flat:
        raise ValueError("load_adapters(model=): the model has no adapters; apply_lora(model, config) first")
    with safe_open(str(file), framework="numpy") as handle:
        names = set(handle.keys())
        wanted = {_key(p) for p in flat}
        if names != wanted:
            raise ValueError(
                f"{file}: adapter tensors differ from the model's: missing {sorted(wanted - names)[:5]}, "
                f"unexpected {sorted(names - wanted)[:5]}"
            )
        for p, var in flat.items():
            tensor = handle.get_tensor(_key(p))
            if tuple(tensor.shape) != tuple(var.shape):
                raise ValueError(f"{file}: {_key(p)} has shape {tuple(tensor.shape)}, the model's is {var.shape}")
            value = var.get_value()
            sharding = getattr(value, "sharding", None)
            array = jnp.asarray(tensor, dtype=var.dtype)
            flat[p] = var.replace(jax.device_put(array, sharding) if sharding is not None else array)
    nnx.update(model, nnx.from_flat_state(flat))
    return model
