"""The agent's signal plumbing, built so that no process in the sandbox can wedge PID 1.

Runs inside the sandbox (standard library + ctypes, Python >= 3.8).

The agent learns that a command exited through SIGCHLD, delivered to a
self-pipe (:func:`signal.set_wakeup_fd`) that its exec loop selects on. Any
process in the sandbox can make SIGCHLDs arrive at will: every orphan is the
agent's child, and stopping and continuing one a million times sends a million
notifications. Three things keep that from blocking the agent for good:

- ``SA_NOCLDSTOP``: stop/continue of a child sends no SIGCHLD at all (the agent
  only needs exits), which takes away the cheapest way to flood the pipe;
- the wake-up pipe is drained between requests too, not only inside an exec,
  and Python is told not to warn when it is full (the warning is a write to
  stderr from the signal path);
- the agent's stderr is nonblocking: a diagnostic the host does not read is
  dropped (``EAGAIN``) instead of stopping PID 1 mid-write.
"""

import ctypes
import os
import signal
import sys

# glibc/musl ``struct sigaction`` on 64-bit Linux: handler (8), sa_mask (128), sa_flags (int) at 136, ...
_SIGACTION_SIZE = 152
_SA_FLAGS_OFFSET = 136
_SA_NOCLDSTOP = 1


def _libc():
    from sandbox.agent.confine import libc

    return libc()


def set_nocldstop():
    """Adds SA_NOCLDSTOP to the SIGCHLD disposition Python installed, keeping its handler and mask.

    Returns whether the flag is now set (False on a platform whose struct layout we do not know; the
    drained pipe and nonblocking stderr still keep the agent unwedgeable there, only less cheaply).
    """
    if ctypes.sizeof(ctypes.c_void_p) != 8 or not sys.platform.startswith("linux"):
        return False
    lib = _libc()
    lib.sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    act = ctypes.create_string_buffer(_SIGACTION_SIZE)
    if lib.sigaction(signal.SIGCHLD, None, act) != 0:
        return False
    flags = ctypes.c_int.from_buffer(act, _SA_FLAGS_OFFSET)
    flags.value |= _SA_NOCLDSTOP
    if lib.sigaction(signal.SIGCHLD, act, None) != 0:
        return False
    check = ctypes.create_string_buffer(_SIGACTION_SIZE)
    lib.sigaction(signal.SIGCHLD, None, check)
    return bool(ctypes.c_int.from_buffer(check, _SA_FLAGS_OFFSET).value & _SA_NOCLDSTOP)


def install():
    """Sets up SIGCHLD/SIGPIPE handling and returns the nonblocking read end of the wake-up pipe."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    set_nocldstop()
    try:
        os.set_blocking(2, False)
    except OSError:  # no stderr at all: nothing to block on
        pass
    return wake_r


def drain(fd):
    """Empties the wake-up pipe without blocking (it only says "look again"; its bytes carry nothing)."""
    while True:
        try:
            if not os.read(fd, 65536):
                return
        except (BlockingIOError, InterruptedError):
            return
