"""System V IPC objects: listed for the hygiene probe, removed when a sandbox is reset.

Runs inside the sandbox (standard library + ctypes). Shared memory segments,
message queues and semaphore sets outlive the processes that made them and
live in the sandbox's IPC namespace, not in any directory: without this, a
segment planted in one episode would be waiting in the next lease. Only an
object's owner (or ``CAP_SYS_ADMIN``, which the agent gave up) may remove it,
so the agent takes the owner's effective uid for the moment of removal.
"""

import ctypes
import os

from sandbox.agent.confine import libc

IPC_RMID = 0
_TABLES = (("shm", "shmctl"), ("msg", "msgctl"), ("sem", "semctl"))


def objects():
    """[[kind, id, owner uid], ...] of every System V IPC object in this namespace."""
    found = []
    for kind, _ in _TABLES:
        try:
            with open("/proc/sysvipc/" + kind) as f:
                header = f.readline().split()
                rows = [line.split() for line in f if line.strip()]
        except OSError:
            continue
        id_col, uid_col = header.index(kind + "id" if kind != "msg" else "msqid"), header.index("uid")
        found.extend([kind, int(row[id_col]), int(row[uid_col])] for row in rows)
    return sorted(found)


def remove_all():
    """Removes every object, each as its owner; returns how many are left (0 unless something resisted)."""
    lib = libc()
    for kind, ident, owner in objects():
        fn = getattr(lib, dict(_TABLES)[kind])
        if kind == "sem":
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
            args = (ident, 0, IPC_RMID, 0)
        else:
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
            args = (ident, IPC_RMID, None)
        euid = os.geteuid()
        try:
            if owner != euid:
                os.seteuid(owner)
            fn(*args)
        finally:
            if os.geteuid() != euid:
                os.seteuid(euid)
    return len(objects())
