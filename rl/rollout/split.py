"""Rollouts split across the processes of a job: each samples its share, every process gets every episode.

With several processes the learner's mesh spans all of them, and a program on it runs only when
every process launches it in the same order. Sampling cannot work that way: episodes end at
times their tools decide, on whichever thread drives them. So each process samples on its own
devices, with a replica of the policy (:class:`LocalReplica`), and runs the groups ``g`` with
``g % count == index`` of every rollout — its own environments and sandboxes. The episodes meet
through the job's key-value store (:class:`~rl.run.distributed.ProcessGroup`), are put back in
the order one process would have produced them (group, then index), and every process then
holds the same result and builds the same training batch for the update.

Episodes are a function of their seeds (which name the task's group, never the process), and
the replica holds the learner's parameters exactly, so a job of any number of processes samples
the same episodes as one process does.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from flax import nnx

from envs import Task
from rl.models import sharding
from rl.rollout.episode_driver import RolloutHandle, RolloutResult, RolloutRunner, requeue_of
from rl.rollout.trajectory import EpisodeRecord

if TYPE_CHECKING:  # the job's channel is built by rl.run; a rollout only uses it
    from rl.run.distributed import ProcessGroup

# Timing entries that count work (summed over processes); the others are durations (the slowest).
_COUNTED = ("prefill_tokens", "prefill_tokens_reused", "jobs", "job_retries")
_COUNTED += ("prefill_tokens_padded", "decode_tokens", "decode_tokens_padded", "decode_steps")


def rollout_mesh_shape(mesh_shape: Mapping[str, int], local_devices: int) -> dict[str, int]:
    """The mesh a process samples on: its own devices, tensor-parallel as the learner where that fits."""
    tensor = int(mesh_shape.get("tensor", 1))
    tensor = tensor if tensor > 0 and local_devices % tensor == 0 else 1
    return {"data": 1, "fsdp": local_devices // tensor, "tensor": tensor}


class LocalReplica:
    """The learner's parameters, copied onto this process's devices for sampling.

    Args:
      source: the learner's model (its arrays span every process).
      replica: the same architecture, created on this process's mesh.
    """

    def __init__(self, source: nnx.Module, replica: nnx.Module):
        self.source, self.replica = source, replica
        self._shardings = jax.tree.map(lambda x: x.sharding, nnx.state(replica))

    def state(self) -> Any:
        """A local copy of the learner's current parameters. Every process must call it at the same
        point (arrays sharded across processes are gathered), so only the main thread may."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("LocalReplica.state(): a collective; call it on the main thread of every process")
        return jax.tree.map(
            lambda x, s: sharding.host_to_sharded(sharding.to_host(x), s), nnx.state(self.source), self._shardings
        )

    def sync(self) -> None:
        """The replica takes the learner's current parameters (in place)."""
        nnx.update(self.replica, self.state())


def _encode(result: RolloutResult) -> bytes:
    """This process's episodes and timing as JSON (data, never code: no pickle crosses the network;
    floats round-trip exactly)."""
    data = {"episodes": [dataclasses.asdict(e) for e in result.episodes], "timing": result.timing}
    return json.dumps(data, default=lambda v: v.item() if isinstance(v, np.generic) else v.tolist()).encode()


def _decode(data: bytes) -> tuple[list[EpisodeRecord], dict[str, float]]:
    parsed = json.loads(data)
    return [EpisodeRecord(**e) for e in parsed["episodes"]], parsed["timing"]


@dataclasses.dataclass
class _Split:
    """One rollout of the job: this process's part in flight, then everyone's."""

    tag: str
    tasks: Sequence[Task]
    inner: RolloutHandle
    handle: RolloutHandle
    posted: bool = False


class SplitRollout:
    """A rollout whose groups are shared out over the job's processes (module docstring).

    A :class:`~rl.rollout.episode_driver.RolloutRunner` itself: ``run``, ``start`` / ``advance``, ``close``.

    Args:
      inner: this process's rollout (lock-step or engine), sampling with ``replica.replica``.
      group: the job's processes.
      replica: the learner's parameters on this process's devices.
    """

    def __init__(self, inner: RolloutRunner, group: ProcessGroup, replica: LocalReplica):
        self.inner, self.group, self.replica = inner, group, replica
        self.tokenizer, self.config, self.seed, self.envs = inner.tokenizer, inner.config, inner.seed, inner.envs
        self._flying: list[_Split] = []
        self._calls: dict[str, int] = {}

    def close(self) -> None:
        self.inner.close()

    def weights(self) -> Any:
        """The live policy's parameters on this process (for an asynchronous run's published versions)."""
        return self.replica.state()

    def run(self, tasks: Sequence[Task], **kwargs: Any) -> RolloutResult:
        """As :meth:`RolloutRunner.run`; other rollouts in flight move forward meanwhile."""
        handle = self.start(tasks, **kwargs)
        while not handle.done:
            self.advance(timeout=0.05)
        return handle.get()

    def start(self, tasks: Sequence[Task], *, step: int, weights: Any = None, **kwargs: Any) -> RolloutHandle:
        """Starts this process's share of the groups (arguments as :meth:`RolloutRunner.run`).

        ``weights`` None (the live policy) copies the learner's parameters into the replica first:
        a collective, so such rollouts start on the main thread, in the same order everywhere."""
        if weights is None:
            self.replica.sync()
        mine = [g for g in range(len(tasks)) if g % self.group.count == self.group.index]
        signature = (
            f"{step}/{kwargs.get('decoding', 'sampled')}/{kwargs.get('group_size')}/{kwargs.get('policy_version')}"
        )
        signature += f"/{zlib.crc32(''.join(t.id for t in tasks).encode()):08x}"
        n = self._calls.get(signature, 0)
        self._calls[signature] = n + 1
        inner = self.inner.start(tasks, step=step, weights=weights, groups=mine, **kwargs)
        split = _Split(f"rollout/{signature}/{n}", tasks, inner, RolloutHandle())
        self._flying.append(split)
        self._exchange(split)
        return split.handle

    def advance(self, timeout: float | None = None) -> None:
        """Moves this process's rollouts forward; a rollout is done once every process's part arrived."""
        if any(not s.inner.done for s in self._flying):
            self.inner.advance(timeout=timeout)
        for split in list(self._flying):
            self._exchange(split)

    def _exchange(self, split: _Split) -> None:
        """Posts this process's part once it is done; completes the rollout once every part is in."""
        if not split.inner.done:
            return
        if split.inner.error is not None:
            self._flying.remove(split)
            split.handle.error = split.inner.error
            return
        if not split.posted:
            local = split.inner.result
            self.group.post(split.tag, _encode(local))
            split.posted = True
        parts = self.group.collect(split.tag)
        if parts is None:
            return
        self._flying.remove(split)
        episodes, timing = [], {}
        for part in parts:
            eps, t = _decode(part)
            episodes += eps
            for key, value in t.items():
                timing[key] = timing.get(key, 0.0) + value if key in _COUNTED else max(timing.get(key, 0.0), value)
        episodes.sort(key=lambda e: (e.group, e.index))
        split.handle.result = RolloutResult(episodes, requeue_of(episodes, split.tasks), timing)
