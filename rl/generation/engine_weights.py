"""The parameter sets a decode engine decodes with, by key, each placed as its programs expect.

Asynchronous RL decodes several policy versions at once
(:meth:`rl.generation.engine.DecodeEngine.load_weights`), and the engine asks for a set's placed
parameters and LM head on every step. Keeping those sets, checking them against the engine's model,
and redoing placement and the head only when their arrays change is one job, apart from the
engine's slots and scheduling: :class:`EngineWeights` does it.
"""

from __future__ import annotations

import dataclasses
import operator
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import jax
from flax import nnx

from rl.generation.engine_programs import head_program
from rl.models.transformer import Transformer


@dataclasses.dataclass
class _Weights:
    """One set of parameters to decode with, as placed for the programs, and its LM head.

    ``state`` None: the engine's module, read in place (its Variables see a learner's updates).
    Weak references to the arrays last placed and to the head's source: placement and the head
    (a transposed copy of a tied embedding) are redone only when those arrays change, and stale
    weights are never kept alive by the engine.
    """

    state: Any = None
    placed: list[weakref.ref] = dataclasses.field(default_factory=list)
    head: tuple[weakref.ref, jax.Array] | None = None


class EngineWeights:
    """A decode engine's parameter sets by key; key ``None`` holds those of :meth:`update`.

    Args:
      model: the engine's model: its structure and shardings are what every set must match, and
        its Variables are key ``None``'s parameters, read in place, until :meth:`update`.
      jit: the engine's program cache (``DecodeEngine._jit``), where the LM head program compiles.

    Attributes:
      model: the model whose Variables key ``None`` reads (replaced by :meth:`update` with a module).
      graphdef: the model's structure, what the engine's programs are built from.
      shardings: the model state's shardings, where every set is placed.
    """

    def __init__(self, model: Transformer, jit: Callable[..., Any]):
        self.model = model
        self.graphdef, state = nnx.split(model)
        self.shardings = jax.tree.map(lambda x: x.sharding, state)
        self._module_state = nnx.state(model)  # its Variables: in-place updates are seen
        self._sets: dict[Hashable, _Weights] = {None: _Weights()}
        self._jit = jit

    def __contains__(self, key: Hashable) -> bool:
        return key in self._sets

    def keys(self) -> set[Hashable]:
        return set(self._sets)

    def update(self, state_or_model: Any) -> None:
        """Key ``None`` reads ``state_or_model`` from now on: a module's Variables in place, or a state."""
        if isinstance(state_or_model, nnx.Module):
            if nnx.split(state_or_model)[0] != self.graphdef:
                raise ValueError("update_weights: the model's structure differs from the engine's model")
            self.model, self._module_state = state_or_model, nnx.state(state_or_model)
            self._sets[None] = _Weights()
        else:
            self._sets[None] = _Weights(self._checked_state(state_or_model, "update_weights"))

    def load(self, key: Hashable, state: Any) -> None:
        """Keeps ``state`` (an ``nnx.State`` or module of the engine's model's structure) under ``key``."""
        if key is None:
            raise ValueError("load_weights(key=None): None names update_weights' parameters; pick another key")
        self._sets[key] = _Weights(self._checked_state(state, "load_weights"))

    def unload(self, key: Hashable) -> None:
        """Forgets the set under ``key``; key ``None`` is always held."""
        if key is not None:
            self._sets.pop(key, None)

    def placed(self, key: Hashable) -> tuple[Any, jax.Array]:
        """The parameters of weights ``key``, placed as the programs expect, and their LM head.

        Called every step, so it avoids work when nothing changed: placement is checked only for
        arrays not seen before, and the head is remade only when the array it comes from changes.
        """
        w = self._sets[key]
        state = w.state if w.state is not None else self._module_state
        leaves = jax.tree.leaves(state)
        if len(leaves) != len(w.placed) or any(r() is not x for r, x in zip(w.placed, leaves, strict=False)):
            shardings = self.shardings
            state = jax.tree.map(lambda x, s: x if x.sharding == s else jax.device_put(x, s), state, shardings)
            placed = jax.tree.leaves(state)
            # Arrays moved here are this call's copies: check the caller's arrays again next time.
            w.placed = [weakref.ref(x) for x in leaves] if all(map(operator.is_, placed, leaves)) else []
        source = jax.tree.leaves(state["embed" if self.model.config.tie_embeddings else "lm_head"])[0]
        if w.head is None or w.head[0]() is not source:
            program = self._jit(("head",), lambda: head_program(self.graphdef), (self.shardings,), None, ())
            w.head = (weakref.ref(source), program(state))
        return state, w.head[1]

    def _checked_state(self, state: Any, caller: str) -> Any:
        if isinstance(state, nnx.Module):
            state = nnx.state(state)
        want, got = jax.tree.structure(self._module_state), jax.tree.structure(state)
        if want != got:
            raise ValueError(f"{caller}: the state's structure differs from the engine's model's")
        return state
