"""Checkpoints with orbax: params, optimizer state, step, RNG and data-iterator state.

Orbax writes each step into a temporary directory and renames it only when the
save is complete, so a process killed mid-save leaves no step that
:meth:`Checkpointer.latest_step` would report: a half-written checkpoint is
never restored. JSON side-cars (data-iterator state, task-queue state) are
saved in the same atomic step.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class Checkpointer:
    """Saves and restores one run's training state under ``<workdir>/checkpoints``.

    Args:
      workdir: the run directory.
      max_to_keep: how many recent steps to keep on disk.
      every: save every ``every`` steps (``should_save``); the final step is always saved.
      announce: log each save (the main process of a job; every process writes its shards).
    """

    def __init__(self, workdir: str | os.PathLike, *, max_to_keep: int = 3, every: int = 1, announce: bool = True):
        if every < 1:
            raise ValueError(f"checkpoint every: expected >= 1, got {every}")
        self.directory = Path(workdir).absolute() / "checkpoints"
        self.every, self.announce = every, announce
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False
            ),
        )

    def should_save(self, step: int, final: bool = False) -> bool:
        return final or step % self.every == 0

    def latest_step(self) -> int | None:
        """The newest *complete* checkpoint, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Every complete checkpoint kept, oldest first."""
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any, extra: dict[str, Any]) -> None:
        """Saves the array pytree ``state`` and the JSON-serialisable ``extra`` atomically."""
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), extra=ocp.args.JsonSave(extra)),
            force=True,
        )
        self._manager.wait_until_finished()
        if self.announce:
            log.info("saved checkpoint %d to %s", step, self.directory)

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """Restores ``step`` into the shapes, dtypes and *shardings* of ``abstract_state``.

        ``abstract_state`` is a pytree of ``jax.ShapeDtypeStruct`` (with ``sharding``)
        or of arrays, e.g. from ``nnx.eval_shape`` or the freshly initialised state.
        """
        target = jax.tree.map(_as_abstract, abstract_state)
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target), extra=ocp.args.JsonRestore())
        )
        return restored["state"], dict(restored["extra"])

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def _as_abstract(x: Any) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x
