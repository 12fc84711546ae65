"""The model's weight matmuls: ``x @ w`` in the compute dtype, accumulated in float32.

A plain ``x @ w`` of two bfloat16 arrays means different programs on different back ends.
Accelerators multiply bfloat16 natively and accumulate in float32. XLA:CPU has no bfloat16 x
bfloat16 -> bfloat16 kernel: it converts both operands to float32 first, and because the
weights are the same in the forward and the backward pass, it converts each weight once and
keeps the float32 copy from one to the other. For a LoRA step that is 4 bytes per frozen weight
on top of the weight itself: 1.4 GiB of a qwen2.5-0.5b step's 3.7 GiB
(``benchmarks/lora_memory.py``).

:func:`project` asks for what the accelerators do anyway, ``bfloat16 x bfloat16 -> float32``
then rounded to bfloat16, which XLA:CPU runs natively; its backward pass does the same with the
cotangent rounded to the compute dtype first, as autodiff of a bfloat16 matmul does. The result is
the same arithmetic as before (exact products, float32 sums, one rounding), without the copies.
Float32 models take the plain matmul: nothing to save there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def project(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w`` for ``x`` ``[..., k]`` and ``w`` ``[k, n]`` of one dtype: ``[..., n]`` in that dtype.

    Low-precision dtypes accumulate in float32 in both passes and never keep a float32 copy of
    ``w``; float32 is the plain matmul."""
    if x.dtype != w.dtype:
        raise TypeError(f"project: x and w must share a dtype, got {x.dtype} and {w.dtype}")
    if x.dtype == jnp.float32:
        return x @ w
    return _low_precision_project(x, w)


def _dot(a: jax.Array, b: jax.Array, dtype: jnp.dtype, contract: tuple[int, int] = (-1, 0)) -> jax.Array:
    """``a`` and ``b`` contracted over one axis each (``contract``), float32 sums rounded to ``dtype``.

    The axes are named rather than transposed (``g @ w.T``): XLA:CPU materialises a transposed
    operand as a float32 copy, the very thing :func:`project` avoids."""
    dims = ((contract[0] % a.ndim,), (contract[1] % b.ndim,))
    return jax.lax.dot_general(a, b, (dims, ((), ())), preferred_element_type=jnp.float32).astype(dtype)


@jax.custom_vjp
def _low_precision_project(x: jax.Array, w: jax.Array) -> jax.Array:
    return _dot(x, w, x.dtype)


def _forward(x: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _dot(x, w, x.dtype), (x, w)  # residuals: the operands themselves, no float32 copy


def _backward(residuals: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    x, w = residuals
    g = g.astype(x.dtype)
    dx = _dot(g, w, x.dtype, contract=(-1, 1))
    rows, g_rows = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    dw = _dot(rows, g_rows, w.dtype, contract=(0, 0))  # a frozen weight's: removed as dead code
    return dx, dw


_low_precision_project.defvjp(_forward, _backward)
