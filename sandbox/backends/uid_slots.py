"""Per-sandbox host uids for the bwrap backend: a slot of agentrl's registered range, locked while in use.

The kernel charges per-user budgets (``fs.inotify.max_user_instances``, the
message-queue byte limit, pipe-buffer pages, ``RLIMIT_NPROC``...) to the host
uid that owns a user namespace. With one host uid for every sandbox, 128
inotify instances taken in one sandbox gave ``EMFILE`` in all the others, the
judge's included. So each sandbox takes a *slot*: a sub-range of
:data:`~sandbox.identity.RANGE_SIZE` host ids of the registered range, whose
first uid runs bwrap (and so owns the namespace) and onto which sandbox ids
0..65535 map.

A slot is held by an exclusive ``flock`` on ``<LOCK_DIR>/<n>.lock`` for the
sandbox's life: two processes (or two pools in one) never share a slot, and a
slot whose holder died is free again at once (the kernel drops the lock with
the descriptor). Everything of the previous holder has exited by then: the
lock is released only after the sandbox's teardown.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from sandbox import identity
from sandbox.errors import BackendUnavailable

LOCK_DIR = Path(os.environ.get("AGENTRL_UID_SLOT_DIR", "/run/agentrl/uid-slots"))


class UidSlot:
    """One held slot: ``uid``/``gid`` are the host ids sandbox root maps to; :meth:`release` frees it."""

    def __init__(self, index: int, fd: int, first: tuple[int, int]):
        self.index = index
        self.uid = first[0] + index * identity.RANGE_SIZE
        self.gid = first[1] + index * identity.RANGE_SIZE
        self._fd: int | None = fd

    def release(self) -> None:
        """Frees the slot (idempotent). Call only once nothing of the sandbox runs any more."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing drops the flock

    def __repr__(self) -> str:
        return f"UidSlot({self.index}, uid={self.uid})"


def acquire_slot(first: tuple[int, int], *, slots: int = identity.SLOTS) -> UidSlot:
    """The first free slot of the range starting at ``first`` (host uid, gid); refuses when all are held."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    start = os.getpid() % slots  # processes starting together try different slots first
    for step in range(slots):
        index = (start + step) % slots
        fd = os.open(LOCK_DIR / f"{index}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return UidSlot(index, fd, first)
    raise BackendUnavailable(
        f"all {slots} sandbox uid slots under {LOCK_DIR} are held: this machine runs as many bwrap sandboxes "
        "as agentrl's host uid range has slots (sandbox.identity.SLOTS)",
        backend="bwrap",
    )
