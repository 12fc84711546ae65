"""Log-probs and entropies of target tokens from final hidden states, a chunk of positions at a time.

Why: the learner needs, per token, only the log-prob of the token that came next and the entropy
of the distribution, but the plain path (``Transformer.logits`` then
:func:`rl.learning.losses.token_logprobs_and_entropy`) materialises float32 logits ``[B, T, V]``
for the whole micro-batch, and its gradient keeps several tensors of that size alive (log-softmax,
probabilities, their cotangents). With the 152k / 128k vocabularies of Qwen2.5 and Llama-3 that
is ~0.6 MB per token per tensor, more than everything else a LoRA step holds.

Here the head runs over chunks of positions (``lax.map``), each producing only its ``[B, c]``
log-probs and entropies, and a hand-written backward pass (:func:`jax.custom_vjp`) recomputes one
chunk's logits at a time, so at most one chunk's vocabulary-sized tensors exist at once. The head's
gradient is accumulated over chunks in float32 (and skipped when the head is not trained, e.g.
LoRA); the hidden states' gradient is per chunk, no accumulation. Each chunk's forward is the
plain path's own function, so log-probs, entropies and gradients agree with it up to float
rounding (tested: ~1e-6 in float32). With a bfloat16 head the logits' cotangent is rounded to
bfloat16 before its two matmuls (the plain path's autodiff keeps it float32 and so multiplies by a
float32 copy of the head).

Chunks split the sequence axis only, so a batch split over devices stays split the same way; the
chunk length is sized from the rows each device holds (``jax.set_mesh`` and the ``"batch"`` rule).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from flax import struct
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero

from rl.learning.losses import token_logprobs_and_entropy
from rl.models.sharding import DEFAULT_RULES, Rules, batch_devices, constrain

_F32 = jnp.float32


def batch_shards(rows: int, rules: Rules) -> int:
    """Devices a ``rows``-row batch is split over under the current ``jax.set_mesh`` (1 outside one)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1
    return batch_devices(dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True)), rules, rows)


def chunk_positions(rows: int, seq: int, vocab: int, budget_mib: int, rules: Rules = DEFAULT_RULES) -> int:
    """Positions per chunk so that one chunk's float32 logits on a device fit in ``budget_mib`` MiB.

    ``seq`` (one chunk: the plain path) when ``budget_mib`` is 0 or the whole sequence fits.
    """
    if budget_mib <= 0:
        return seq
    local_rows = max(1, rows // batch_shards(rows, rules))
    return max(1, min(seq, (budget_mib << 20) // (local_rows * vocab * 4)))


def token_logprobs(
    hidden: jax.Array,
    head: jax.Array,
    targets: jax.Array,
    temperature: float = 1.0,
    budget_mib: int = 0,
    rules: Rules = DEFAULT_RULES,
    tied: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """``(logprobs, entropy)`` ``[B, S]`` of ``targets`` under ``softmax(hidden @ head / temperature)``.

    Args:
      hidden: ``[B, S, E]`` final (normed) hidden states; position ``s`` predicts ``targets[:, s]``.
      head: the LM head in the compute dtype: ``[E, V]``, or with ``tied`` the ``[V, E]`` embedding
        table itself (a transposed copy would be one more table-sized buffer in the chunk loop).
      targets: ``[B, S]`` int token ids.
      temperature: divides the logits (the sampler's temperature).
      budget_mib: float32 logits per chunk and device, in MiB (:func:`chunk_positions`); 0: the
        whole ``[B, S, V]`` at once, exactly the plain path.
      rules: logical-axis rules, to keep chunks split along the batch like the hidden states.
    """
    b, s, _ = hidden.shape
    c = chunk_positions(b, s, head.shape[0 if tied else 1], budget_mib, rules)
    if c >= s:
        return _chunk_forward(temperature, tied, hidden, head, targets)
    n = -(-s // c)
    c = -(-s // n)  # balanced chunks: the padding is under one position per chunk
    pad = n * c - s
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, n, c, -1).swapaxes(0, 1)
    t = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, n, c).swapaxes(0, 1)
    h = constrain(h, (None, "batch", "seq", "embed"), rules)
    t = constrain(t, (None, "batch", "seq"), rules)
    logp, entropy = _chunked(float(temperature), tied, h, head, t)
    unchunk = lambda x: x.swapaxes(0, 1).reshape(b, n * c)[:, :s]  # noqa: E731
    return unchunk(logp), unchunk(entropy)


# -- the chunked head with its own backward pass -----------------------------------------------------
def _head_spec(tied: bool) -> str:
    return "ve" if tied else "ev"


def _logits(tied: bool, h: jax.Array, head: jax.Array) -> jax.Array:
    return jnp.einsum(f"bce,{_head_spec(tied)}->bcv", h, head, preferred_element_type=_F32)


def _chunk_forward(
    temperature: float, tied: bool, h: jax.Array, head: jax.Array, t: jax.Array
) -> tuple[jax.Array, jax.Array]:
    return token_logprobs_and_entropy(_logits(tied, h, head), t, temperature)


def _map_chunks(
    temperature: float, tied: bool, h: jax.Array, head: jax.Array, t: jax.Array
) -> tuple[jax.Array, jax.Array]:
    return jax.lax.map(lambda xs: _chunk_forward(temperature, tied, xs[0], head, xs[1]), (h, t))


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _chunked(
    temperature: float, tied: bool, h: jax.Array, head: jax.Array, t: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``[n, B, c]`` log-probs and entropies of ``n`` chunks ``h`` ``[n, B, c, E]``, ``t`` ``[n, B, c]``."""
    return _map_chunks(temperature, tied, h, head, t)


@struct.dataclass
class _Residuals:
    h: jax.Array
    head: jax.Array
    t: jax.Array
    # Static: which inputs need a gradient (the head does not when it is frozen, e.g. under LoRA).
    need_h: bool = struct.field(pytree_node=False)
    need_head: bool = struct.field(pytree_node=False)


def _fwd(
    temperature: float, tied: bool, h: CustomVJPPrimal, head: CustomVJPPrimal, t: CustomVJPPrimal
) -> tuple[tuple[jax.Array, jax.Array], _Residuals]:
    out = _map_chunks(temperature, tied, h.value, head.value, t.value)
    return out, _Residuals(h.value, head.value, t.value, h.perturbed, head.perturbed)


def _bwd(temperature: float, tied: bool, res: _Residuals, cotangents: tuple) -> tuple:
    """Per chunk: recompute the logits, pull the cotangents back to them, then through the matmul."""
    g_logp, g_ent = (None if isinstance(g, SymbolicZero) else g for g in cotangents)
    h, head, t = res.h, res.head, res.t
    if g_logp is None and g_ent is None:
        g_logp = jnp.zeros(t.shape, _F32)

    def logits_cotangent(hc: jax.Array, tc: jax.Array, gl: jax.Array | None, ge: jax.Array | None) -> jax.Array:
        logits = _logits(tied, hc, head)
        if ge is None:  # entropy not in the loss (it is only a metric): skip its pull-back
            _, pull = jax.vjp(lambda z: token_logprobs_and_entropy(z, tc, temperature)[0], logits)
            return pull(gl)[0]
        if gl is None:
            _, pull = jax.vjp(lambda z: token_logprobs_and_entropy(z, tc, temperature)[1], logits)
            return pull(ge)[0]
        _, pull = jax.vjp(lambda z: token_logprobs_and_entropy(z, tc, temperature), logits)
        return pull((gl, ge))[0]

    def body(acc: jax.Array | None, xs: tuple) -> tuple[jax.Array | None, jax.Array | None]:
        hc, tc, gl, ge = xs
        dz = logits_cotangent(hc, tc, gl, ge).astype(head.dtype)
        spec = _head_spec(tied)
        dh = (
            jnp.einsum(f"bcv,{spec}->bce", dz, head, preferred_element_type=_F32).astype(hc.dtype)
            if res.need_h
            else None
        )
        if acc is not None:
            acc = acc + jnp.einsum(f"bce,bcv->{spec}", hc, dz, preferred_element_type=_F32)
        return acc, dh

    acc = jnp.zeros(head.shape, _F32) if res.need_head else None
    acc, dh = jax.lax.scan(body, acc, (h, t, g_logp, g_ent))
    d_head = acc.astype(head.dtype) if acc is not None else None
    return dh, d_head, None


_chunked.defvjp(_fwd, _bwd, symbolic_zeros=True)
