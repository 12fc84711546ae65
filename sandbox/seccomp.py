"""The seccomp filter of every sandbox, built with libseccomp (``pyseccomp``), never by hand.

Capabilities are the first wall: commands run as an unprivileged uid with none.
This filter is the second: it takes away, from the agent and everything it
runs, the syscalls that are either a way out of the sandbox or a way into
another process, whatever the caller's uid or capabilities. Everything else is
allowed, so ordinary programs (compilers, test runners, databases) work; the
denied calls fail with ``EPERM`` (``ENOSYS`` for ``clone3``, so libc falls
back to ``clone``, whose flags this filter can inspect).

The same table feeds both backends:

* bwrap: :func:`bpf_program` is exported by libseccomp as a BPF program and
  passed with ``--seccomp FD``. That one leaves ``mount`` open, because the
  agent remounts its tmpfs (inode caps) and ``/proc`` (``hidepid``) at boot;
  the agent then loads the full program (``allow_mount=False``) itself before
  it serves a single request.
* Docker: :func:`docker_profile` is the same table as a Docker seccomp profile
  (``security_opt=["seccomp=<json>"]``), which runc compiles with libseccomp.

Sockets are an allow-list, not a deny-list: ``socket``/``socketpair`` work for
the families an ordinary program needs (:data:`SOCKET_FAMILIES`; the network
namespace decides what AF_INET/AF_INET6 reach), netlink only for
``NETLINK_ROUTE`` (glibc's ``getaddrinfo`` and ``ip`` ask it for addresses),
and every other family -- AF_VSOCK, whose port space crosses network
namespaces, AF_PACKET, AF_ALG, Bluetooth, ... -- fails with ``EAFNOSUPPORT``,
as on a kernel built without it. A new family added to the kernel is denied
until someone adds it here. AF_INET/AF_INET6 are TCP only (:data:`INET_SOCKET_TYPES`;
UDP, raw and the rest get ``ESOCKTNOSUPPORT``): cgroup v1 charges no datagram
buffer to the sandbox's memory.

Syscalls of other ABIs on the same machine (i386 ``int 0x80``, x32) do not
match the native rules, so libseccomp's bad-architecture action kills them.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import platform
import tempfile

# (syscall, why it is denied). Names missing on this architecture are skipped.
DENIED: tuple[tuple[str, str], ...] = (
    # Reaching into other processes: the agent, the judge, a neighbour.
    ("ptrace", "attach to / read / write another process"),
    ("process_vm_readv", "read another process's memory"),
    ("process_vm_writev", "write another process's memory"),
    ("kcmp", "compare kernel objects of other processes"),
    ("pidfd_getfd", "steal a file descriptor from another process"),
    ("process_madvise", "act on another process's memory"),
    # Kernel keyrings are not namespaced: they reach the host's keys.
    ("keyctl", "host keyrings"),
    ("add_key", "host keyrings"),
    ("request_key", "host keyrings"),
    # Large kernel attack surface with no use inside a sandbox.
    ("bpf", "eBPF programs and maps"),
    ("perf_event_open", "performance counters, kernel addresses"),
    ("userfaultfd", "stalls the kernel at will: a race-exploit primitive"),
    ("io_uring_setup", "io_uring runs operations this filter never sees"),
    ("io_uring_enter", "io_uring runs operations this filter never sees"),
    ("io_uring_register", "io_uring runs operations this filter never sees"),
    ("fanotify_init", "filesystem-wide event monitoring"),
    ("lookup_dcookie", "kernel profiling"),
    ("syslog", "kernel log buffer"),
    ("modify_ldt", "x86 segment tricks"),
    ("iopl", "raw I/O port access"),
    ("ioperm", "raw I/O port access"),
    ("vm86", "x86 virtual 8086 mode"),
    ("vm86old", "x86 virtual 8086 mode"),
    ("uselib", "obsolete loader"),
    ("ustat", "obsolete"),
    ("sysfs", "obsolete"),
    ("_sysctl", "obsolete sysctl interface"),
    ("nfsservctl", "obsolete"),
    ("create_module", "obsolete module loader"),
    ("get_kernel_syms", "kernel symbols"),
    ("query_module", "kernel modules"),
    # New namespaces and joining others: the way to regain capabilities.
    ("unshare", "new namespaces (a user namespace gives back every capability)"),
    ("setns", "join another namespace"),
    # Filesystem topology.
    ("mount", "mounts (left open to the agent's boot on bwrap, then closed)"),
    ("umount", "unmount"),
    ("umount2", "unmount"),
    ("pivot_root", "change the root filesystem"),
    ("chroot", "change the root directory"),
    ("move_mount", "new mount API"),
    ("open_tree", "new mount API"),
    ("fsopen", "new mount API"),
    ("fsconfig", "new mount API"),
    ("fsmount", "new mount API"),
    ("fspick", "new mount API"),
    ("mount_setattr", "new mount API"),
    ("open_by_handle_at", "opens files by inode handle, bypassing the mount namespace"),
    ("name_to_handle_at", "the other half of open_by_handle_at"),
    ("quotactl", "filesystem quotas"),
    ("quotactl_fd", "filesystem quotas"),
    ("acct", "process accounting to a file"),
    # The machine itself.
    ("kexec_load", "boot another kernel"),
    ("kexec_file_load", "boot another kernel"),
    ("init_module", "load a kernel module"),
    ("finit_module", "load a kernel module"),
    ("delete_module", "unload a kernel module"),
    ("reboot", "reboot"),
    ("swapon", "swap devices"),
    ("swapoff", "swap devices"),
    ("vhangup", "hang up the terminal"),
    ("sethostname", "host name"),
    ("setdomainname", "domain name"),
    # Clocks are not namespaced (time namespaces only offset monotonic/boottime).
    ("settimeofday", "host clock"),
    ("stime", "host clock"),
    ("clock_settime", "host clock"),
    ("clock_adjtime", "host clock"),
    ("adjtimex", "host clock"),
)

# clone() flags that make a namespace; clone() with any of them is denied.
CLONE_NAMESPACE_FLAGS: tuple[tuple[str, int], ...] = (
    ("CLONE_NEWTIME", 0x00000080),
    ("CLONE_NEWNS", 0x00020000),
    ("CLONE_NEWCGROUP", 0x02000000),
    ("CLONE_NEWUTS", 0x04000000),
    ("CLONE_NEWIPC", 0x08000000),
    ("CLONE_NEWUSER", 0x10000000),
    ("CLONE_NEWPID", 0x20000000),
    ("CLONE_NEWNET", 0x40000000),
)
# The socket families allowed (everything else: EAFNOSUPPORT), and netlink's one protocol.
SOCKET_FAMILIES: tuple[tuple[str, int], ...] = (
    ("AF_UNIX", 1),
    ("AF_INET", 2),
    ("AF_INET6", 10),
    ("AF_NETLINK", 16),
)
AF_NETLINK = 16
NETLINK_ROUTE = 0
# Families at or above this are denied by one range rule; below it, one rule per denied value.
# (Linux's AF_MAX is 46; the margin covers kernels newer than this table.) The kernel reads the
# domain as a 32-bit int, but seccomp compares all 64 bits: a value with high bits set is >= this
# bound and denied, so no encoding of a denied family slips past an equality rule.
SOCKET_FAMILY_BOUND = 64
_SOCKET_CALLS = ("socket", "socketpair")
# AF_INET/AF_INET6 sockets are TCP only: cgroup v1 charges no datagram buffer (UDP, raw, SCTP, ...)
# to any memory counter, so each such socket could hold ``rmem_max`` of host memory outside the
# sandbox's limit. No domain needs them; other types get ESOCKTNOSUPPORT. The type argument carries
# SOCK_NONBLOCK/SOCK_CLOEXEC above :data:`SOCK_TYPE_MASK`, which the rules mask off.
INET_FAMILIES = (2, 10)
INET_SOCKET_TYPES: tuple[tuple[str, int], ...] = (("SOCK_STREAM", 1),)
SOCK_TYPE_MASK = 0xF


def denied_inet_types() -> list[int]:
    """Every socket type (masked) that :data:`INET_SOCKET_TYPES` does not allow for AF_INET/AF_INET6."""
    allowed = {nr for _, nr in INET_SOCKET_TYPES}
    return [t for t in range(SOCK_TYPE_MASK + 1) if t not in allowed]


def denied_socket_families() -> list[int]:
    """Every family value below :data:`SOCKET_FAMILY_BOUND` that :data:`SOCKET_FAMILIES` does not allow."""
    allowed = {nr for _, nr in SOCKET_FAMILIES}
    return [nr for nr in range(SOCKET_FAMILY_BOUND) if nr not in allowed]


# personality(0xffffffff) only queries; every other value changes the execution domain
# (e.g. READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE).
PERSONALITY_QUERY = 0xFFFFFFFF
_MOUNT_FAMILY = {"mount"}
_DOCKER_ARCH = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64", "ppc64le": "SCMP_ARCH_PPC64LE"}


def _seccomp():
    try:
        import pyseccomp
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise RuntimeError("pyseccomp is not installed: pip install pyseccomp") from exc
    try:
        pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, "ptrace")
    except (OSError, AttributeError) as exc:  # pragma: no cover - depends on the host
        raise RuntimeError("libseccomp is not usable here: apt-get install -y libseccomp2") from exc
    return pyseccomp


def _native_names() -> list[str]:
    """The denied syscalls that exist on this architecture."""
    sc = _seccomp()
    names = []
    for name, _ in DENIED:
        try:
            if sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0:
                names.append(name)
        except (OSError, ValueError):
            continue
    return names


def build_filter(*, allow_mount: bool = False):
    """The filter as a ``pyseccomp.SyscallFilter`` (default allow; the table above denied)."""
    sc = _seccomp()
    flt = sc.SyscallFilter(defaction=sc.ALLOW)
    flt.set_attr(sc.Attr.CTL_NNP, 1)
    eperm = sc.ERRNO(errno.EPERM)
    for name in _native_names():
        if allow_mount and name in _MOUNT_FAMILY:
            continue
        flt.add_rule(eperm, name)
    for _, bit in CLONE_NAMESPACE_FLAGS:
        flt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, bit, bit))
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # flags sit behind a pointer: make libc use clone()
    flt.add_rule(eperm, "personality", sc.Arg(0, sc.NE, PERSONALITY_QUERY))
    no_family = sc.ERRNO(errno.EAFNOSUPPORT)
    for call in _SOCKET_CALLS:
        for family in denied_socket_families():
            flt.add_rule(no_family, call, sc.Arg(0, sc.EQ, family))
        flt.add_rule(no_family, call, sc.Arg(0, sc.GE, SOCKET_FAMILY_BOUND))
        flt.add_rule(no_family, call, sc.Arg(0, sc.EQ, AF_NETLINK), sc.Arg(2, sc.NE, NETLINK_ROUTE))
    no_type = sc.ERRNO(errno.ESOCKTNOSUPPORT)
    for family in INET_FAMILIES:
        for kind in denied_inet_types():
            flt.add_rule(no_type, "socket", sc.Arg(0, sc.EQ, family), sc.Arg(1, sc.MASKED_EQ, SOCK_TYPE_MASK, kind))
    return flt


@functools.cache
def bpf_program(*, allow_mount: bool = False) -> bytes:
    """The filter compiled by libseccomp to a classic BPF program (``struct sock_filter[]``)."""
    flt = build_filter(allow_mount=allow_mount)
    with tempfile.TemporaryFile() as f:
        flt.export_bpf(f)
        f.seek(0)
        data = f.read()
    if not data or len(data) % 8:
        raise RuntimeError(f"libseccomp exported a malformed BPF program ({len(data)} bytes)")
    return data


def seccomp_fd(*, allow_mount: bool) -> int:
    """A readable descriptor holding :func:`bpf_program` (for ``bwrap --seccomp FD``); the caller closes it."""
    data = bpf_program(allow_mount=allow_mount)
    fd = os.memfd_create("agentrl-seccomp", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@functools.cache
def docker_profile() -> str:
    """The same table as a Docker seccomp profile (JSON), for ``security_opt=["seccomp=..."]``."""
    machine = platform.machine()
    if machine not in _DOCKER_ARCH:
        raise RuntimeError(f"no Docker seccomp architecture known for {machine!r}")
    syscalls = [{"names": _native_names(), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}]
    for _, bit in CLONE_NAMESPACE_FLAGS:
        arg = {"index": 0, "value": bit, "valueTwo": bit, "op": "SCMP_CMP_MASKED_EQ"}
        syscalls.append({"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM, "args": [arg]})
    syscalls.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    arg = {"index": 0, "value": PERSONALITY_QUERY, "op": "SCMP_CMP_NE"}
    syscalls.append({"names": ["personality"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM, "args": [arg]})
    syscalls.extend(_docker_socket_rules())
    profile = {"defaultAction": "SCMP_ACT_ALLOW", "architectures": [_DOCKER_ARCH[machine]], "syscalls": syscalls}
    return json.dumps(profile, separators=(",", ":"))


def _docker_socket_rules() -> list[dict]:
    """:data:`SOCKET_FAMILIES` as Docker profile rules (args of one rule are ANDed, rules ORed)."""

    def deny(*args: dict) -> dict:
        return {
            "names": list(_SOCKET_CALLS),
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": errno.EAFNOSUPPORT,
            "args": list(args),
        }

    rules = [deny({"index": 0, "value": family, "op": "SCMP_CMP_EQ"}) for family in denied_socket_families()]
    rules.append(deny({"index": 0, "value": SOCKET_FAMILY_BOUND, "op": "SCMP_CMP_GE"}))
    rules.append(
        deny(
            {"index": 0, "value": AF_NETLINK, "op": "SCMP_CMP_EQ"},
            {"index": 2, "value": NETLINK_ROUTE, "op": "SCMP_CMP_NE"},
        )
    )
    for family in INET_FAMILIES:
        for kind in denied_inet_types():
            rules.append(
                {
                    "names": ["socket"],
                    "action": "SCMP_ACT_ERRNO",
                    "errnoRet": errno.ESOCKTNOSUPPORT,
                    "args": [
                        {"index": 0, "value": family, "op": "SCMP_CMP_EQ"},
                        {"index": 1, "value": SOCK_TYPE_MASK, "valueTwo": kind, "op": "SCMP_CMP_MASKED_EQ"},
                    ],
                }
            )
    return rules
