"""Hostile programs against the isolation and the trust boundary, on both backends.

Who is who (see ``sandbox.identity``): the agent is sandbox root, non-dumpable,
with a few capabilities; commands run as uid 1000 with none, under agentrl's
seccomp filter; on bwrap no sandbox uid is host root. These tests try, through
the public API, fresh and through a warm pool, what a policy would try: reach
the agent (ptrace, ``/proc/1``), forge its own exit status, touch host kernel
knobs and keyrings, exhaust inodes, and leave something behind for the next
lease.
"""

from __future__ import annotations

import errno
import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from sandbox import Host, SandboxFileError, WarmPool, seccomp
from sandbox.agent import encode_message
from tests.sandbox.conftest import HOSTILE_SPEC as SPEC


def _host_addresses() -> list[str]:
    addrs = {"127.0.0.1"}
    try:
        addrs.add(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    out = subprocess.run(
        ["sh", "-c", "ip -4 -o addr 2>/dev/null || hostname -I"], capture_output=True, text=True
    ).stdout
    for tok in out.replace("/", " ").split():
        if tok.count(".") == 3 and all(p.isdigit() for p in tok.split(".")):
            addrs.add(tok)
    return sorted(addrs)


def test_no_network_egress(hostile):
    with socket.socket() as server:  # a host service the sandbox must not reach
        server.bind(("0.0.0.0", 0))
        server.listen()
        port = server.getsockname()[1]
        for addr in [*_host_addresses(), "172.17.0.1", "1.1.1.1"]:
            r = hostile.exec(f"curl -sS -m 2 http://{addr}:{port}/ || curl -sS -m 2 http://{addr}/", timeout=10)
            assert r.exit_code != 0, f"reached {addr}"
    r = hostile.exec("getent hosts deb.debian.org pypi.org", timeout=10)
    assert r.exit_code != 0 and not r.stdout
    ifaces = hostile.exec("cat /proc/net/dev").stdout_text
    assert [line.split(":")[0].strip() for line in ifaces.splitlines()[2:]] == ["lo"]


def test_host_files_and_docker_socket_are_invisible(hostile, tmp_path):
    secret = Path("/root/agentrl-host-secret.txt")
    secret.write_text("host secret")
    try:
        r = hostile.exec(
            "cat /root/agentrl-host-secret.txt; ls /var/run/docker.sock /run/docker.sock; ls /proc | grep -c '^[0-9]'"
        )
        assert b"host secret" not in r.stdout
        assert b"docker.sock" not in r.stdout
        assert int(r.stdout_text.split()[-1]) <= 4  # the agent, bash and the ls/grep pipeline: no host processes
    finally:
        secret.unlink()


# Becomes uid 0 for real (all three ids) and says so, or fails: exit 0 only where root is reachable.
SETUID_ROOT = "python3 -c 'import os; os.setresuid(0, 0, 0); assert os.getresuid() == (0, 0, 0)'"


@pytest.mark.parametrize(
    "cmd",
    [
        "mount -t tmpfs none /mnt",
        "unshare -r true",
        "unshare -m true",
        SETUID_ROOT,
        "chroot / true",
        "mknod /tmp/sda b 8 0",
        "python3 -c 'import ctypes; l = ctypes.CDLL(None); assert l.unshare(0x10000000) == 0'",
        "ip link set lo down",
        "kill -9 1",
    ],
    ids=[
        "mount",
        "unshare-user",
        "unshare-mount",
        "setuid",
        "chroot",
        "mknod",
        "unshare-syscall",
        "netadmin",
        "kill-agent",
    ],
)
def test_privilege_escalation_fails(hostile, cmd):
    r = hostile.exec(cmd, timeout=10)
    assert r.exit_code != 0, (cmd, r)
    assert "0000000000000000" in hostile.exec("grep CapEff /proc/self/status").stdout_text
    assert hostile.ping()["pid"] == 1  # the agent is still there (kill-agent did not land)


def test_state_is_invisible_to_the_next_sandbox(backend):
    """Pool hygiene: files, processes, env of one sandbox are invisible to a fresh one and after restore."""
    with backend.create(SPEC) as first, backend.create(SPEC) as second:
        clean = first.snapshot()
        first.exec("echo a > /workspace/left; echo b > /tmp/left; echo c > /dev/shm/left; export SECRET=1; sleep 600 &")
        probe = "ls -A /workspace /tmp /dev/shm; ps -eo comm= | grep -c sleep; echo ${SECRET:-none}"
        seen = second.exec(probe).stdout_text
        assert "left" not in seen and seen.split()[-2:] == ["0", "none"]
        first.restore(clean)
        seen = first.exec(probe).stdout_text
        assert "left" not in seen and seen.split()[-2:] == ["0", "none"]


def test_setuid_binaries_grant_no_capabilities(hostile):
    r = hostile.exec(
        "cp /bin/bash /tmp/sh && chmod u+s /tmp/sh; cp /bin/cat /workspace/cat && chmod u+s /workspace/cat; "
        "/tmp/sh -p -c 'grep CapEff /proc/self/status'; /workspace/cat /proc/self/status | grep CapEff"
    )
    caps = [line.split()[1] for line in r.stdout_text.splitlines() if line.startswith("CapEff")]
    assert caps and all(int(c, 16) == 0 for c in caps), r


# -- the trust boundary: agent, commands, judge -------------------------------------------------

# Run as a command (uid 1000) or as the judge (uid 1001): everything it tries against the agent (PID 1).
REACH_AGENT = r"""
import ctypes, json, os, signal
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def sc(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(*args)
    out[name] = [r, ctypes.get_errno()]
sc("ptrace_attach", 101, 16, 1, 0, 0)
sc("ptrace_seize", 101, 0x4206, 1, 0, 0)
buf = ctypes.create_string_buffer(64)
iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 64)
sc("process_vm_readv", 310, 1, ctypes.addressof(iov), 1, ctypes.addressof(iov), 1, 0)
sc("process_vm_writev", 311, 1, ctypes.addressof(iov), 1, ctypes.addressof(iov), 1, 0)
pidfd = libc.syscall(434, 1, 0)
sc("pidfd_getfd", 438, pidfd, 1, 0)
for name in ("mem", "environ", "maps", "fd/0", "fd/1", "fd/2", "cwd/.", "root/etc/hostname", "syscall", "stack"):
    for mode in ("rb", "wb"):
        try:
            open("/proc/1/" + name, mode).close()
            out[name + ":" + mode] = "opened"
        except OSError as e:
            out[name + ":" + mode] = e.errno
try:
    out["fd_list"] = os.listdir("/proc/1/fd")
except OSError as e:
    out["fd_list"] = e.errno
for sig in (signal.SIGSTOP, signal.SIGKILL, signal.SIGTERM):
    try:
        os.kill(1, sig)
        out["kill%d" % sig] = "sent"
    except OSError as e:
        out["kill%d" % sig] = e.errno
print(json.dumps(out))
"""


def run_py(sb, code: str, *, user: str = "sandbox", timeout: float = 30):
    return sb.exec(["python3", "-c", code], user=user, timeout=timeout)


@pytest.mark.parametrize("user", ["sandbox", "judge"])
def test_commands_cannot_ptrace_read_or_signal_the_agent(target, user):
    r = run_py(target, REACH_AGENT, user=user)
    assert r.exit_code == 0, r.stderr_text
    out = json.loads(r.stdout)
    for name in ("ptrace_attach", "ptrace_seize", "process_vm_readv", "process_vm_writev", "pidfd_getfd"):
        assert out[name][0] == -1 and out[name][1] in (errno.EPERM, errno.EBADF, errno.ESRCH), (name, out[name])
    opened = {k: v for k, v in out.items() if v == "opened" or v == "sent"}
    assert not opened, f"reached the agent through {opened}"
    assert out["fd_list"] in (errno.EACCES, errno.ENOENT, errno.EPERM)
    assert target.ping()["pid"] == 1  # and it is still there, unharmed


def forged_frames() -> bytes:
    """Replies for the next request ids that say exit 0 and print a pass message."""
    header = {"exit_code": 0, "timed_out": False, "truncated": False, "duration_s": 0.0, "oom_killed": False}
    return b"".join(encode_message(dict(header, id=i), [b"ALL TESTS PASSED (forged)\n", b""]) for i in range(1, 64))


FORGE = r"""
import glob, os, sys
frame = open("/workspace/frame.bin", "rb").read()
targets = ["/proc/1/fd/%d" % n for n in range(8)] + glob.glob("/proc/[0-9]*/fd/*")
for path in targets:
    if path.startswith("/proc/%d/" % os.getpid()):
        continue
    try:
        with open(path, "wb", buffering=0) as f:
            f.write(frame)
        print("WROTE", path, file=sys.stderr)
    except OSError:
        pass
sys.exit(1)
"""


@pytest.mark.parametrize("user", ["sandbox", "judge"])
def test_a_failing_program_cannot_forge_its_own_exit_status(target, user):
    target.write_files({"frame.bin": forged_frames()})
    r = run_py(target, FORGE, user=user)
    assert r.exit_code == 1 and b"forged" not in r.stdout
    assert b"WROTE" not in r.stderr, r.stderr_text
    # The channel is intact: the next replies belong to the next requests.
    assert target.exec("exit 3").exit_code == 3
    assert target.exec("echo next").stdout == b"next\n"


HOST_KNOBS = r"""
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for knob in ("kernel/core_pattern", "vm/drop_caches", "kernel/panic", "kernel/hostname", "kernel/sysrq",
             "kernel/modprobe", "net/ipv4/ip_forward", "user/max_user_namespaces", "fs/protected_symlinks"):
    try:
        with open("/proc/sys/" + knob, "w") as f:
            f.write("1\n")
        out[knob] = "written"
    except OSError as e:
        out[knob] = e.errno
for path in ("/proc/sysrq-trigger",):
    try:
        open(path, "w").close()
        out[path] = "opened"
    except OSError as e:
        out[path] = e.errno
for name, nr, args in (("add_key", 248, (b"user", b"agentrl", b"x", 1, 0xFFFFFFFD)),
                       ("request_key", 249, (b"user", b"agentrl", None, 0xFFFFFFFD)),
                       ("keyctl", 250, (0, 0xFFFFFFFD, 0, 0, 0))):
    ctypes.set_errno(0)
    out[name] = [libc.syscall(nr, *args), ctypes.get_errno()]
try:
    out["keys"] = open("/proc/keys").read()
except OSError as e:
    out["keys"] = ""
print(json.dumps(out))
"""


@pytest.mark.parametrize("user", ["sandbox", "judge"])
def test_host_kernel_knobs_and_keyrings_are_closed(target, user):
    r = run_py(target, HOST_KNOBS, user=user)
    assert r.exit_code == 0, r.stderr_text
    out = json.loads(r.stdout)
    written = [k for k, v in out.items() if v in ("written", "opened")]
    assert not written, f"wrote host kernel interfaces: {written}"
    for name in ("add_key", "request_key", "keyctl"):
        assert out[name] == [-1, errno.EPERM], (name, out[name])
    assert ".builtin_trusted_keys" not in out["keys"]


def test_inode_cap_holds_and_the_program_sees_enospc(backend):
    spec = SPEC.replace(max_inodes=256)
    with backend.create(spec) as sb:
        r = run_py(
            sb,
            "import os\nfor root in ('/workspace', '/tmp', '/dev/shm'):\n"
            "    n = 0\n    try:\n        for i in range(2000):\n"
            "            os.mkdir('%s/d%d' % (root, i)) if i % 2 else open('%s/f%d' % (root, i), 'w').close()\n"
            "            n += 1\n    except OSError as e:\n        print(root, n, e.errno)\n",
        )
        rows = [line.split() for line in r.stdout_text.splitlines()]
        assert [row[0] for row in rows] == ["/workspace", "/tmp", "/dev/shm"], r
        for root, count, err in rows:
            assert int(err) == errno.ENOSPC and 200 <= int(count) <= 256, (root, count)
        with pytest.raises(SandboxFileError, match="No space left"):
            sb.write_files({"one-more.txt": "x"})
        assert sb.exec("echo alive").stdout == b"alive\n"


# Walks the whole tree as the command's uid: plants something in every directory it can write,
# plus System V IPC objects, a POSIX message queue and a process; or, with "find", reports what is there.
PLANT = r"""
import ctypes, json, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
mode, tag = sys.argv[1], sys.argv[2]
marker = ".agentrl-plant-" + tag
writable, found = [], []
for dirpath, dirnames, filenames in os.walk("/"):
    if dirpath in ("/proc", "/sys") or dirpath.startswith(("/proc/", "/sys/")):
        dirnames[:] = []
        continue
    if mode == "plant":
        try:
            open(os.path.join(dirpath, marker), "w").close()
            writable.append(dirpath)
            os.mkfifo(os.path.join(dirpath, marker + "-fifo"))
            os.symlink("/etc/passwd", os.path.join(dirpath, marker + "-link"))
        except OSError:
            pass
    else:
        found += [os.path.join(dirpath, n) for n in dirnames + filenames if n.startswith(".agentrl-plant")]
if mode == "plant":
    libc.shmget(0x5eed, 4096, 0o1666)
    libc.semget(0x5eed, 1, 0o1666)
    libc.msgget(0x5eed, 0o1666)
    subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
ipc = [line.split()[:2] for kind in ("shm", "sem", "msg") for line in open("/proc/sysvipc/" + kind).readlines()[1:]]
print(json.dumps({"writable": sorted(writable), "found": sorted(found), "ipc": ipc}))
"""
WRITABLE = {
    "sandbox": ["/dev/mqueue", "/dev/shm", "/tmp", "/workspace"],
    "judge": ["/dev/mqueue", "/dev/shm", "/run/agentrl/judge", "/tmp"],
}


def plant(sb, mode: str, user: str) -> dict:
    r = sb.exec(["python3", "-c", PLANT, mode, user], user=user, timeout=60)
    assert r.exit_code == 0, r.stderr_text
    return json.loads(r.stdout)


def test_nothing_planted_anywhere_writable_survives_into_the_next_lease(backend):
    with WarmPool(Host(backend, capacity=1)) as pool:
        with pool.lease(SPEC) as sb:
            first = sb.id
            for user in ("sandbox", "judge"):
                seen = plant(sb, "plant", user)
                # The complete list: every directory a command can write is one the reset empties.
                assert seen["writable"] == WRITABLE[user], seen["writable"]
            assert len(plant(sb, "find", "sandbox")["ipc"]) == 3
            assert sb.ping()["processes"] >= 2
        with pool.lease(SPEC) as sb:
            assert sb.id == first
            after = plant(sb, "find", "sandbox")
            assert after["found"] == [] and after["ipc"] == [], after
            assert sb.ping()["processes"] == 0
        assert pool.stats()["sandbox/pool_probe_failures"] == 0


def test_who_is_who(target):
    ids = {user: target.exec("id -u; id -g", user=user).stdout_text.split() for user in ("sandbox", "judge")}
    assert ids == {"sandbox": ["1000", "1000"], "judge": ["1001", "1001"]}
    status = target.exec("grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status").stdout_text
    fields = dict(line.split(":\t") for line in status.splitlines())
    assert int(fields["CapEff"], 16) == int(fields["CapPrm"], 16) == int(fields["CapAmb"], 16) == 0
    assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2"
    assert target.confinement["caps"] == hex(0xEB)  # chown, dac_override, fowner, kill, setgid, setuid
    if target.backend == "bwrap":
        assert target.confinement["hidepid"] is True
    # The host's view: no process of the sandbox is host root (bwrap), and no command is (both).
    marker = f"{time.time_ns() % 10**9}.5"
    target.exec(f"sleep {marker} >/dev/null 2>&1 &")
    rows = [line.split(None, 2) for line in _host_ps("uid,pid,args")]
    uids = {int(uid) for uid, _, args in rows if f"sleep {marker}" in args}
    assert uids and 0 not in uids
    if target.backend == "bwrap":
        from sandbox import identity

        first = target.host_ids[0]  # the sandbox's own slot of agentrl's registered range
        registered = identity.host_range()[0]
        assert (
            registered <= first < registered + identity.REGISTERED_SIZE
            and (first - registered) % identity.RANGE_SIZE == 0
        )
        assert uids == {first + 1000}
        agent = _host_children(target._proc.pid)
        assert agent and all(_host_uid(pid) == first for pid in agent)


def _host_ps(fields: str) -> list[str]:
    return subprocess.run(["ps", "-eo", fields, "--no-headers"], capture_output=True, text=True).stdout.splitlines()


def _host_children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def _host_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def test_planted_links_and_fifos_never_turn_the_agent_into_a_deputy(target):
    target.exec(
        "ln -s /proc/self/fd/1 out; ln -s /proc/self/environ env; ln -s /proc/self d; mkfifo fifo; "
        "mkdir -p real && ln -s /etc/shadow real/shadow"
    )
    for path in ("out", "env", "fifo", "real/shadow", "d/status"):
        with pytest.raises(SandboxFileError):
            target.read_file(path)
    with pytest.raises(SandboxFileError):
        target.write_files({"d/oom_score_adj": "-1000"})
    target.write_files({"out": "replaced", "fifo": "also replaced"})  # the link and the FIFO are replaced
    assert target.read_file("out") == b"replaced" and target.read_file("fifo") == b"also replaced"
    assert target.exec("stat -c %F out fifo; stat -c %U out").stdout_text.split("\n")[:3] == [
        "regular file",
        "regular file",
        "sandbox",
    ]
    snap = target.snapshot()
    target.restore(snap)  # links come back as links, and nothing was followed on the way
    assert target.exec("readlink env").stdout == b"/proc/self/environ\n"
    assert target.exec("echo still-in-sync").stdout == b"still-in-sync\n"


def _denied_syscalls() -> list[tuple[str, int]]:
    import pyseccomp

    out = []
    for name, _ in seccomp.DENIED:
        try:
            nr = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
        except (OSError, ValueError):
            continue
        if nr >= 0:
            out.append((name, nr))
    return out


SYSCALLS = r"""
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for name, nr in json.loads(sys.argv[1]):
    ctypes.set_errno(0)
    out[name] = [libc.syscall(nr, 0, 0, 0, 0, 0, 0), ctypes.get_errno()]
for bit in json.loads(sys.argv[2]):
    ctypes.set_errno(0)
    out["clone:%x" % bit] = [libc.syscall(56, bit | 17, 0, 0, 0, 0), ctypes.get_errno()]
ctypes.set_errno(0)
out["clone3"] = [libc.syscall(435, 0, 0), ctypes.get_errno()]
ctypes.set_errno(0)
out["personality"] = [libc.syscall(135, ctypes.c_ulong(0x0400000)), ctypes.get_errno()]
print(json.dumps(out))
"""


def test_every_listed_syscall_is_denied_inside(backend):
    """Each call of the documented list fails with EPERM (clone3: ENOSYS), whatever its arguments."""
    names = _denied_syscalls()
    assert {"ptrace", "keyctl", "bpf", "unshare", "mount", "kexec_load", "open_by_handle_at"} <= {n for n, _ in names}
    bits = [bit for _, bit in seccomp.CLONE_NAMESPACE_FLAGS]
    with backend.create(SPEC) as sb:
        r = sb.exec(["python3", "-c", SYSCALLS, json.dumps(names), json.dumps(bits)], timeout=30)
    assert r.exit_code == 0, r.stderr_text
    out = json.loads(r.stdout)
    wrong = {k: v for k, v in out.items() if v != [-1, errno.ENOSYS if k == "clone3" else errno.EPERM]}
    assert not wrong, wrong
