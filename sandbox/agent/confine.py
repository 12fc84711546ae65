"""How the agent locks itself down at boot, and how it drops a command to its uid.

Runs inside the sandbox (standard library + ctypes, Python >= 3.8). The agent
starts as sandbox root with a handful of capabilities. Before it answers its
first request it

1. applies the backend's boot mounts (bwrap only): inode and byte caps on every
   tmpfs, ``/proc`` with ``hidepid`` where the kernel allows it, the kernel
   interfaces under ``/proc`` and the ``/dev`` tmpfs read-only;
2. hands ownership of the writable directories to the command uid;
3. keeps only the capabilities it needs (set uids, signal and manage files of
   other uids), with an empty bounding set beyond them and no ambient ones;
4. loads the full seccomp program the host compiled with libseccomp (so the
   ``mount`` it just used is gone for it and everything it runs);
5. marks itself non-dumpable: no ``/proc/1/{mem,environ,fd}``, no ptrace,
   even by a process that somehow had its uid.

It then checks each of these from ``/proc/self/status`` and refuses to serve
if one did not take: a sandbox that is less confined than asked never starts.
"""

import ctypes
import ctypes.util
import os

PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
CAPABILITY_VERSION_3 = 0x20080522

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_RELATIME = 1 << 21
# statvfs f_flag bits -> mount flags that a remount inside a user namespace must keep.
_KEEP_FLAGS = ((1, MS_RDONLY), (2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC), (1024, MS_NOATIME))
_KEEP_FLAGS += ((2048, MS_NODIRATIME), (4096, MS_RELATIME))

CAPS = {
    "CHOWN": 0,
    "DAC_OVERRIDE": 1,
    "FOWNER": 3,
    "KILL": 5,
    "SETGID": 6,
    "SETUID": 7,
    "SETPCAP": 8,
    "SYS_ADMIN": 21,
}
# What the agent keeps after boot: start commands as other uids, signal them, manage their files.
AGENT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID")

_libc = None


class ConfineError(RuntimeError):
    """The sandbox could not be confined as asked: the agent refuses to serve."""


def libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise ConfineError("%s: %s" % (what, os.strerror(err)))


def prctl(option, arg2=0, arg3=0, arg4=0, arg5=0):
    lib = libc()
    lib.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return lib.prctl(option, arg2, arg3, arg4, arg5)


def mount(source, target, fstype, flags, data):
    lib = libc()
    lib.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    return lib.mount(enc(source), enc(target), enc(fstype), flags, enc(data))


def _mount_flags(path):
    """The per-mount flags of ``path``'s mount (a remount in a user namespace may not drop them)."""
    f_flag = os.statvfs(path).f_flag
    flags = 0
    for st_bit, ms_bit in _KEEP_FLAGS:
        if f_flag & st_bit:
            flags |= ms_bit
    return flags


def make_readonly(path):
    """Bind ``path`` onto itself and remount that bind read-only (files and directories alike)."""
    if not os.path.lexists(path):
        return
    if not os.path.ismount(path):
        _check(mount(path, path, None, MS_BIND, None), "bind %s" % path)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | _mount_flags(path)
    _check(mount(None, path, None, flags, None), "remount %s read-only" % path)


def remount_tmpfs(path, options):
    flags = MS_REMOUNT | (_mount_flags(path) & ~MS_RDONLY)
    _check(mount("tmpfs", path, "tmpfs", flags, options), "remount %s with %s" % (path, options))


def remount_proc_hidepid():
    """``hidepid``: commands see only their own processes; gid 0 (the agent) sees all. False if unsupported."""
    flags = MS_REMOUNT | _mount_flags("/proc")
    for option in ("hidepid=invisible,gid=0", "hidepid=2,gid=0"):
        if mount("proc", "/proc", "proc", flags, option) == 0:
            return True
    return False


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def keep_only_caps(names):
    """Ambient and inheritable sets emptied, bounding set cut to ``names``, effective = permitted = ``names``."""
    keep = 0
    for name in names:
        keep |= 1 << CAPS[name]
    _check(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL), "clear ambient capabilities")
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if not keep & (1 << cap):
            _check(prctl(PR_CAPBSET_DROP, cap), "drop capability %d from the bounding set" % cap)
    header = _CapHeader(CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    data[0].effective = data[0].permitted = keep & 0xFFFFFFFF
    data[1].effective = data[1].permitted = keep >> 32
    lib = libc()
    _check(lib.capset(ctypes.byref(header), ctypes.byref(data)), "capset")
    return keep


def load_seccomp(program):
    """Installs a classic BPF program (``struct sock_filter[]`` bytes that libseccomp exported)."""
    if not program or len(program) % 8:
        raise ConfineError("seccomp program of %d bytes is malformed" % len(program))
    _check(prctl(PR_SET_NO_NEW_PRIVS, 1), "no_new_privs")
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _check(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog)), "load the seccomp filter")


def status():
    """The confinement fields of ``/proc/self/status``."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
                out[key] = int(value.strip(), 16)
            elif key in ("Seccomp", "NoNewPrivs", "Uid", "Gid"):
                out[key] = value.split()[0] if key in ("Uid", "Gid") else int(value.strip())
    return out


def confine(config):
    """Runs the boot steps above from ``config["confine"]``; returns what was applied (for the hello)."""
    spec = config.get("confine") or {}
    applied = {"hidepid": False}
    for op in spec.get("mounts", ()):
        kind = op["op"]
        if kind == "tmpfs":
            remount_tmpfs(op["path"], op["options"])
        elif kind == "readonly":
            make_readonly(op["path"])
        elif kind == "hidepid":
            applied["hidepid"] = remount_proc_hidepid()
        else:
            raise ConfineError("unknown boot mount %r" % kind)
    roots = []
    for root in config.get("writable", ()):
        if not os.path.lexists(root["path"]) and root.get("optional"):
            continue  # e.g. no mqueue filesystem here: nothing to reset there either
        if not os.path.ismount(root["path"]):
            raise ConfineError("%s is not a mount of its own, so its caps would not apply" % root["path"])
        os.chown(root["path"], root["uid"], root["gid"])
        os.chmod(root["path"], root["mode"])
        roots.append(root)
    applied["writable"] = roots
    keep = keep_only_caps(spec.get("keep_caps", AGENT_CAPS))
    program = spec.get("seccomp")
    if program is not None:
        load_seccomp(bytes.fromhex(program))
    _check(prctl(PR_SET_DUMPABLE, 0), "set non-dumpable")
    got = status()
    problems = []
    if got.get("CapEff") != keep or got.get("CapPrm") != keep or got.get("CapBnd") != keep:
        problems.append("capabilities %s" % {k: hex(v) for k, v in got.items() if k.startswith("Cap")})
    if got.get("CapAmb") or got.get("CapInh"):
        problems.append("ambient/inheritable capabilities left")
    if program is not None and got.get("Seccomp") != SECCOMP_MODE_FILTER:
        problems.append("seccomp mode %s" % got.get("Seccomp"))
    if got.get("NoNewPrivs") != 1:
        problems.append("no_new_privs not set")
    if prctl(3) != 0:  # PR_GET_DUMPABLE
        problems.append("still dumpable")
    if problems:
        raise ConfineError("confinement incomplete: " + "; ".join(problems))
    applied["caps"] = hex(keep)
    return applied


def drop_to(uid, gid):
    """In a forked child before exec: become ``uid``/``gid`` for good (every capability goes with root)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
