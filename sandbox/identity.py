"""Who is who in a sandbox, and which host uids the bwrap backend maps them to.

Inside every sandbox, on both backends:

* the agent (PID 1) is sandbox root, uid 0, non-dumpable, with only the
  capabilities it needs to run commands as other uids;
* commands run as ``sandbox`` (uid/gid 1000), with no capabilities;
* code that decides a reward runs as ``judge`` (uid/gid 1001): a command
  cannot read its files, ptrace it, or see it in ``/proc`` (bwrap, ``hidepid``).

On the host, Docker maps these ids one to one (container root is host root
with the capabilities above; commands are host uid 1000, confined by the
container). The bwrap backend never lets any of them be host root: each sandbox
has its own user namespace mapping sandbox uids 0..65535 onto a range of
unprivileged host uids that belongs to agentrl alone, registered in
``/etc/subuid`` and ``/etc/subgid`` under :data:`RANGE_OWNER` (the system's
registry of such ranges, so no other user or container engine is handed the
same ids). ``python -m sandbox.identity setup`` registers a free range (run by
``scripts/system_setup.sh``).

The registered range holds :data:`SLOTS` sub-ranges of :data:`RANGE_SIZE` ids,
one per concurrently running sandbox (:mod:`sandbox.backends.uid_slots`): bwrap
runs as its slot's first uid, which owns the sandbox's user namespace, so the
kernel's per-user budgets (inotify instances and watches, message-queue bytes,
pipe-buffer pages, ...) are charged per sandbox, never shared by siblings.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
from pathlib import Path

SANDBOX_UID = SANDBOX_GID = 1000
JUDGE_UID = JUDGE_GID = 1001
USERS = {"sandbox": (SANDBOX_UID, SANDBOX_GID), "judge": (JUDGE_UID, JUDGE_GID)}
# The judge's own ground: HOME, TMPDIR and default cwd of ``user="judge"`` execs. A tmpfs of its own,
# 0700 and judge-owned, outside every path the model can write, so nothing the model plants (a
# ``.pth`` in ``~/.local``, a module named like a stdlib one in the cwd, a symlink at a temp name) is
# on the judge's way. Small: judge scratch only, inside the agent's memory reserve.
JUDGE_HOME = "/run/agentrl/judge"
JUDGE_HOME_MB = 16
RANGE_OWNER = "agentrl-sandbox"
RANGE_SIZE = 65536  # the ids one sandbox maps (0..65535)
SLOTS = 256  # sandboxes that can run at once on one machine, each on its own sub-range
REGISTERED_SIZE = SLOTS * RANGE_SIZE
# Ranges are placed above what useradd hands out by default (SUB_UID_MAX = 600100000).
_FIRST_CANDIDATE = 700_000_000
_SUBID_FILES = (Path("/etc/subuid"), Path("/etc/subgid"))


def check_user(user: object) -> str:
    """Validates a ``user=`` argument ("sandbox" or "judge")."""
    from sandbox.errors import SandboxUsageError

    if user not in USERS:
        raise SandboxUsageError(f"user: expected one of {sorted(USERS)}, got {user!r}")
    return user  # type: ignore[return-value]


def _ranges(path: Path) -> list[tuple[str, int, int]]:
    out = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def host_range() -> tuple[int, int] | None:
    """(first host uid, first host gid) of agentrl's registered range, or None if it is not registered.

    A range registered before sandboxes had slots (:data:`RANGE_SIZE` ids) is too small and ignored;
    ``setup`` then registers one of :data:`REGISTERED_SIZE` beside it.
    """
    firsts = []
    for path in _SUBID_FILES:
        mine = [
            (start, count) for owner, start, count in _ranges(path) if owner == RANGE_OWNER and count >= REGISTERED_SIZE
        ]
        if not mine:
            return None
        firsts.append(mine[0][0])
    return firsts[0], firsts[1]


def _free_start(taken: list[tuple[int, int]]) -> int:
    start = _FIRST_CANDIDATE
    for first, count in sorted(taken):
        if first < start + REGISTERED_SIZE and start < first + count:
            start = first + count
    return start


def ensure_host_range() -> tuple[int, int]:
    """Registers a free range for :data:`RANGE_OWNER` in /etc/subuid and /etc/subgid (root; idempotent)."""
    found = host_range()
    if found is not None:
        return found
    if os.geteuid() != 0:
        raise PermissionError("registering the sandbox uid range needs root: sudo python -m sandbox.identity setup")
    with open(_SUBID_FILES[0], "a") as lock:  # two setups at once register one range
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = host_range()
        if found is not None:
            return found
        taken = [(s, c) for path in _SUBID_FILES for _, s, c in _ranges(path)]
        start = _free_start(taken)
        for path in _SUBID_FILES:
            with open(path, "a") as f:
                f.write(f"{RANGE_OWNER}:{start}:{REGISTERED_SIZE}\n")
    return start, start


def uid_map(first: int) -> str:
    """The ``uid_map`` / ``gid_map`` text: sandbox ids 0..65535 onto the slot's host ids from ``first``."""
    return f"0 {first} {RANGE_SIZE}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.identity", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["setup", "status"])
    args = parser.parse_args(argv)
    try:
        found = ensure_host_range() if args.command == "setup" else host_range()
    except PermissionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if found is None:
        print(f"no host uid range registered for {RANGE_OWNER}: run `python -m sandbox.identity setup` as root")
        return 1
    print(
        f"{RANGE_OWNER}: host uids {found[0]}..{found[0] + REGISTERED_SIZE - 1}, "
        f"gids {found[1]}..{found[1] + REGISTERED_SIZE - 1} ({SLOTS} sandbox slots of {RANGE_SIZE})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
