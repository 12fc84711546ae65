"""Calls to one node's agent, coalesced: what many episodes send at the same moment goes in one round trip.

An episode's calls are sequential (the model thinks between them), but a node serves many
episodes, and their calls arrive together. :class:`CallBatcher` sends a call at once when the
line to its agent is free; calls that arrive while another thread is sending ride the next
submission together (``NodeAgent.call_many``), whose results stream back one by one as they
finish, so batching never makes a fast call wait for a slow one. It only saves the per-call cost
of a Ray submission, which is what dominates a short command's overhead under load
(``benchmarks/ray_fleet_bench.py`` measures both ways).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)

Call = tuple[str, str, tuple, dict[str, Any]]  # (sandbox id, method, args, kwargs)


class CallBatcher:
    """Sends calls to one agent; concurrent ones together. Thread-safe.

    Args:
      actor: the node's agent (a Ray actor handle).
      batch: coalesce concurrent calls (False: one submission per call, for comparison).
      drainers: threads reading streamed batch results (shared by all nodes of a fleet).
      max_batch: calls in one submission at most.
    """

    def __init__(self, actor: Any, *, batch: bool, drainers: ThreadPoolExecutor, max_batch: int = 64):
        self.actor, self.batch, self.max_batch = actor, batch, max_batch
        self._drainers = drainers
        self._lock = threading.Lock()
        self._pending: list[tuple[Call, Future]] = []
        self._sending = False
        self.submissions = 0  # round trips started (calls / submissions: the batching factor)
        self.calls = 0

    def submit(self, call: Call) -> Future:
        """Queues a call; returns the future of its outcome (a Ray error there: the call did not complete)."""
        future: Future = Future()
        with self._lock:
            self.calls += 1
            if not self.batch:
                self.submissions += 1
            else:
                self._pending.append((call, future))
                if self._sending:  # the thread sending now takes it along
                    return future
                self._sending = True
        if not self.batch:
            self._send_one(call, future)
        else:
            self._pump()
        return future

    def _pump(self) -> None:
        """Sends what is pending until nothing is: what arrives meanwhile goes together. Called by the
        thread that took the sender's role (``_sending``), which it gives up when the queue is empty."""
        while True:
            with self._lock:
                group, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                if not group:
                    self._sending = False
                    return
                self.submissions += 1
            if len(group) == 1:
                self._send_one(*group[0])
            else:
                self._send_many(group)

    def _send_one(self, call: Call, future: Future) -> None:
        try:
            ref = self.actor.call.remote(*call)
        except Exception as exc:  # noqa: BLE001 - a handle to a dead actor can refuse at once
            future.set_exception(exc)
            return
        ref.future().add_done_callback(lambda f: _settle(future, f))

    def _send_many(self, group: Sequence[tuple[Call, Future]]) -> None:
        try:
            stream = self.actor.call_many.options(num_returns="streaming").remote([c for c, _ in group])
        except Exception as exc:  # noqa: BLE001
            for _, future in group:
                future.set_exception(exc)
            return
        self._drainers.submit(_drain, stream, [f for _, f in group])


def _settle(future: Future, done: Future) -> None:
    exc = done.exception()
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(done.result())


def _drain(stream: Any, futures: Sequence[Future]) -> None:
    """Hands out a batch's results as the agent yields them; a Ray failure fails whatever is left."""
    import ray

    try:
        for ref in stream:
            index, outcome = ray.get(ref)
            futures[index].set_result(outcome)
    except Exception as exc:  # noqa: BLE001 - the node or its agent went away mid-batch
        for future in futures:
            if not future.done():
                future.set_exception(exc)
