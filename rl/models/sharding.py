"""Meshes from config, logical-axis rules, and models created directly in their shardings.

Every parameter and the KV cache name their dimensions with *logical* axes (``"embed"``,
``"mlp"``, ``"kv_heads"``, ...). Rules — plain data kept in :class:`ShardingConfig` — map each
logical axis to zero or more *mesh* axes (``data``, ``fsdp``, ``tensor``). Changing the rules or
the mesh shape turns the same model code from data-parallel into FSDP or tensor-parallel.

Axis types: ``jax.make_mesh`` now defaults to *Explicit* axes, where every op's output sharding
must be resolvable from its inputs' types (an einsum over a sharded contraction dimension, for
example, needs an ``out_sharding``). We choose ``AxisType.Auto`` deliberately: the model code
stays free of per-op annotations, the compiler propagates shardings from the jit's explicit
in/out shardings plus a few activation constraints (:func:`constrain`), and the tests check
sharded == unsharded numerically on several mesh shapes.

A rule whose mesh axes do not divide a dimension (e.g. Qwen2.5-0.5B's 2 KV heads on ``tensor=4``)
falls back to replicating that dimension rather than failing: correctness never depends on the
sharding, only speed and memory do.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
MeshAxes = str | tuple[str, ...] | None
Rules = tuple[tuple[str, MeshAxes], ...]
M = TypeVar("M", bound=nnx.Module)

# Logical axis -> mesh axes. Batch is split over data *and* fsdp (FSDP is data parallelism
# whose parameters are also split); weights are split over fsdp on their embed dimension and
# over tensor on heads / mlp / vocab (Megatron-style column/row parallel pairs).
DEFAULT_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("seq", None),
    ("cache_seq", None),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
)


def _as_axes(value: MeshAxes) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


@dataclasses.dataclass(frozen=True)
class ShardingConfig:
    """Mesh shape and logical-axis rules.

    Attributes:
      mesh_shape: size per mesh axis, as a mapping or (axis, size) pairs, e.g.
        ``{"data": 2, "fsdp": 2, "tensor": 2}``. Missing axes have size 1; one axis may be ``-1``
        ("the rest of the devices"). Stored as a tuple of pairs in ``MESH_AXES`` order.
      rules: (logical axis, mesh axis | tuple of mesh axes | None) pairs; the first rule that
        names a logical axis wins.
    """

    mesh_shape: Any = (("data", 1), ("fsdp", -1), ("tensor", 1))
    rules: Rules = DEFAULT_RULES

    def __post_init__(self) -> None:
        shape = dict(self.mesh_shape.items() if isinstance(self.mesh_shape, Mapping) else self.mesh_shape)
        unknown = sorted(set(shape) - set(MESH_AXES))
        if unknown:
            raise ValueError(f"ShardingConfig.mesh_shape: unknown axes {unknown}; mesh axes are {MESH_AXES}")
        for axis, size in shape.items():
            if not isinstance(size, int) or not (size == -1 or size >= 1):
                raise ValueError(f"ShardingConfig.mesh_shape[{axis!r}]: expected an int >= 1 or -1, got {size!r}")
        if sum(size == -1 for size in shape.values()) > 1:
            raise ValueError(f"ShardingConfig.mesh_shape: at most one axis may be -1, got {shape}")
        object.__setattr__(self, "mesh_shape", tuple((axis, shape.get(axis, 1)) for axis in MESH_AXES))
        rules = tuple((str(logical), mesh) for logical, mesh in self.rules)
        for logical, mesh in rules:
            bad = [a for a in _as_axes(mesh) if a not in MESH_AXES]
            if bad:
                raise ValueError(
                    f"ShardingConfig.rules[{logical!r}]: unknown mesh axes {bad}; mesh axes are {MESH_AXES}"
                )
        object.__setattr__(self, "rules", rules)


def resolve_mesh_shape(mesh_shape: Any, num_devices: int) -> dict[str, int]:
    """Replaces ``-1`` by the remaining devices; errors if the shape does not fit ``num_devices``."""
    shape = dict(ShardingConfig(mesh_shape=mesh_shape).mesh_shape)
    fixed = math.prod(size for size in shape.values() if size != -1)
    if -1 in shape.values():
        if num_devices % fixed:
            raise ValueError(
                f"mesh_shape {shape}: the fixed axes multiply to {fixed}, which does not divide the "
                f"{num_devices} devices"
            )
        shape = {axis: (num_devices // fixed if size == -1 else size) for axis, size in shape.items()}
    elif fixed != num_devices:
        raise ValueError(
            f"mesh_shape {shape} uses {fixed} devices but {num_devices} are available; "
            "set one axis to -1 to take the rest, or pass `devices=` explicitly"
        )
    return shape


def make_mesh(config: ShardingConfig | Mapping[str, int], devices: Sequence[Any] | None = None) -> Mesh:
    """A ``(data, fsdp, tensor)`` mesh with Auto axis types over ``devices`` (default: all devices)."""
    if not isinstance(config, ShardingConfig):
        config = ShardingConfig(mesh_shape=config)
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(config.mesh_shape, len(devices))
    return jax.make_mesh(
        tuple(shape[a] for a in MESH_AXES),
        MESH_AXES,
        axis_types=(AxisType.Auto,) * len(MESH_AXES),
        devices=devices,
    )


def logical_to_spec(
    logical: Sequence[str | None],
    rules: Rules = DEFAULT_RULES,
    shape: Sequence[int] | None = None,
    mesh_sizes: Mapping[str, int] | None = None,
) -> PartitionSpec:
    """The ``PartitionSpec`` for an array whose dimensions carry ``logical`` names.

    Each mesh axis is used at most once (the first dimension claiming it wins). With ``shape``
    and ``mesh_sizes``, mesh axes of size 1 are dropped and a dimension keeps only the leading
    mesh axes whose product divides it (the rest of it is replicated).
    """
    table: dict[str, tuple[str, ...]] = {}
    for name, axes in rules:
        table.setdefault(name, _as_axes(axes))
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for dim, name in enumerate(logical):
        axes = [a for a in table.get(name, ()) if a not in used] if name is not None else []
        if mesh_sizes is not None:
            axes = [a for a in axes if mesh_sizes.get(a, 1) > 1]
            if shape is not None:
                kept, prod = [], 1
                for a in axes:
                    if shape[dim] % (prod * mesh_sizes[a]):
                        break
                    kept.append(a)
                    prod *= mesh_sizes[a]
                axes = kept
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    while spec and spec[-1] is None:
        spec.pop()
    return PartitionSpec(*spec)


def batch_devices(mesh_sizes: Mapping[str, int], rules: Rules = DEFAULT_RULES, rows: int | None = None) -> int:
    """Devices a batch is split over: the product of the mesh axes the ``"batch"`` rule names.

    With ``rows``, only the axes that a ``rows``-row batch can actually be split over count
    (:func:`logical_to_spec`'s divisibility rule), i.e. the devices each holding a slice of it.
    """
    shape = None if rows is None else (rows,)
    spec = logical_to_spec(("batch",), rules, shape, dict(mesh_sizes) if rows is not None else None)
    axes = () if not spec or spec[0] is None else (spec[0],) if isinstance(spec[0], str) else tuple(spec[0])
    return math.prod(mesh_sizes[a] for a in axes)


def named_sharding(mesh: Mesh, logical: Sequence[str | None], shape: Sequence[int], rules: Rules) -> NamedSharding:
    """``NamedSharding`` on ``mesh`` for an array of ``shape`` with ``logical`` dimension names."""
    return NamedSharding(mesh, logical_to_spec(logical, rules, shape, dict(mesh.shape)))


def _variable_logical(var: nnx.Variable) -> tuple[str | None, ...]:
    names = var.get_metadata().get("out_sharding")
    return tuple(names) if names else (None,) * len(var.shape)


def state_shardings(state: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """A pytree like ``state`` (an ``nnx.State``) holding each variable's ``NamedSharding``.

    Reads the logical names each ``nnx.Variable`` carries in its ``out_sharding`` metadata (set
    by ``nnx.with_partitioning``); unannotated variables are replicated.
    """

    def one(var: Any) -> Any:
        if isinstance(var, nnx.Variable):
            return var.replace(named_sharding(mesh, _variable_logical(var), var.shape, rules))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def abstract_model(factory: Callable[[], M]) -> tuple[nnx.GraphDef, Any]:
    """(graphdef, abstract state) of ``factory()`` without allocating any parameter."""
    return nnx.split(nnx.eval_shape(factory))


def create_sharded_model(factory: Callable[[], M], mesh: Mesh, rules: Rules = DEFAULT_RULES) -> M:
    """Builds ``factory()`` with every parameter initialised directly in its sharding.

    The model is first traced abstractly (``nnx.eval_shape``) to learn shapes and logical
    names; initialisation then runs under ``jax.jit`` with those shardings as ``out_shardings``,
    so each device computes only its own shard and no full copy ever lands on one device.
    """
    graphdef, abstract_state = abstract_model(factory)
    shardings = state_shardings(abstract_state, mesh, rules)

    def init() -> Any:
        return nnx.split(factory())[1]

    with jax.set_mesh(mesh):
        state = jax.jit(init, out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def constrain(x: jax.Array, logical: Sequence[str | None], rules: Rules) -> jax.Array:
    """Sharding constraint on an activation, by logical names; a no-op outside ``jax.set_mesh``.

    Used on the residual stream so that FSDP keeps activations batch-sharded and gathers
    weights, instead of letting propagation pick the weights' sharding for the activations.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or math.prod(mesh.axis_sizes) == 1:
        return x
    spec = logical_to_spec(logical, rules, x.shape, dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True)))
    return jax.lax.with_sharding_constraint(x, spec)


def host_to_sharded(array: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global ``jax.Array`` from a host array, copying to each local device only its shard."""
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def to_host(array: jax.Array) -> np.ndarray:
    """The whole array as numpy on this process; gathered from the other processes only when some
    of its shards live there (a collective then: every process must call it at the same point)."""
    if array.is_fully_replicated:
        return np.asarray(array.addressable_data(0))
    if array.is_fully_addressable:
        return np.asarray(jax.device_get(array))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
