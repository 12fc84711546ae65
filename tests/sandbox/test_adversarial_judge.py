"""Attacks on what surrounds the escape boundary (issue 23): the agent's own plumbing, reset, errors.

Each test is an attack through the public API, fresh and pooled on both backends, with a control
showing that the probe sees the effect when it is real.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.sandbox.test_adversarial import SETUID_ROOT

# Stops and continues an orphan of the agent (so each stop/continue is a SIGCHLD to PID 1) as fast as
# it can, from a process left running between execs: before the fix this filled the agent's wake-up
# pipe, then its stderr pipe, and the agent blocked for good on a diagnostic write.
STOP_CONTINUE_FLOOD = r"""
import json, os, signal, sys, time
n = int(sys.argv[1])
if os.fork():
    os._exit(0)
os.setsid()
child = os.fork()
if child == 0:
    if os.fork():
        os._exit(0)  # leaves an orphan whose parent is now the agent
    while True:
        time.sleep(1)
os.waitpid(child, 0)
time.sleep(0.2)
orphan = [int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid())
          and open('/proc/%s/stat' % p).read().split()[3] == '1' and int(p) > os.getpid()][0]
stat = os.open('/proc/%d/stat' % orphan, os.O_RDONLY)
def state():
    return os.pread(stat, 512, 0).rsplit(b')', 1)[1].split()[0]
stopped_seen = 0
for i in range(n):
    os.kill(orphan, signal.SIGSTOP)
    while state() != b'T':  # a stop the orphan never reached sends no notification
        pass
    stopped_seen += 1
    os.kill(orphan, signal.SIGCONT)
    while state() == b'T':
        pass
ppid = int(open('/proc/%d/stat' % orphan).read().split()[3])
with open('/tmp/flood.json', 'w') as f:
    json.dump({'iterations': n, 'orphan_ppid': ppid, 'stopped_seen': stopped_seen}, f)
"""


def test_a_stop_continue_flood_between_execs_cannot_wedge_the_agent(target):  # noqa: F811
    target.exec(["python3", "-c", STOP_CONTINUE_FLOOD, "20000"], timeout=10)
    time.sleep(4)  # the agent sits idle between requests while the flood runs: the window before the fix
    r = target.exec(
        "for i in $(seq 600); do [ -s /tmp/flood.json ] && break; sleep 0.1; done; cat /tmp/flood.json", timeout=60
    )
    assert r.exit_code == 0, r.stderr_text
    done = json.loads(r.stdout)
    # Control: the attack really ran in full against an orphan of the agent.
    assert done["iterations"] == 20000 and done["orphan_ppid"] == 1, done
    assert done["stopped_seen"] == 20000, done
    for _ in range(3):
        assert target.exec("echo alive", timeout=15).stdout_text.strip() == "alive"
    assert target.ping()["pid"] == 1


NOCLDSTOP_PROBE = r"""
import os, signal, sys, time
from sandbox.agent import signals
wake = signals.install() if sys.argv[1] == "agent" else None
if wake is None:  # control: Python's plain SIGCHLD handler, as the agent had it before
    r, w = os.pipe(); os.set_blocking(r, False); os.set_blocking(w, False)
    signal.set_wakeup_fd(w); signal.signal(signal.SIGCHLD, lambda *_: None); wake = r
signals.drain(wake)  # what came before (find_library forks a helper) is not under test
child = os.fork()
if child == 0:
    while True:
        time.sleep(1)
for _ in range(20):
    os.kill(child, signal.SIGSTOP); os.waitpid(child, os.WUNTRACED)
    os.kill(child, signal.SIGCONT); os.waitpid(child, os.WCONTINUED)
time.sleep(0.05)
try:
    n = len(os.read(wake, 4096))
except BlockingIOError:
    n = 0
os.kill(child, signal.SIGKILL)
print(n)
"""


@pytest.mark.parametrize("handler", ["agent", "control"])
def test_stop_and_continue_of_a_child_never_wake_the_agent(handler):
    """SA_NOCLDSTOP: the agent's wake-up pipe hears exits only; the control (no flag) hears every stop/continue."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", NOCLDSTOP_PROBE, handler], capture_output=True, text=True, check=True)
    wakeups = int(out.stdout)
    if handler == "agent":
        assert wakeups == 0
    else:
        assert wakeups >= 1  # the probe does see notifications when the flag is absent


def test_the_agent_never_blocks_on_its_stderr():
    """A full, unread stderr pipe: the agent's diagnostics are dropped, not a write that blocks PID 1."""
    import os
    import subprocess
    import sys

    code = (
        "import os, sys\nfrom sandbox.agent import signals\nsignals.install()\n"
        "n = 0\ntry:\n    while n < 1 << 22:\n        n += os.write(2, b'x' * 4096)\nexcept BlockingIOError:\n    print('dropped', n)\n"
    )
    r, w = os.pipe()  # nobody reads r
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], stderr=w, capture_output=False, stdout=subprocess.PIPE, timeout=60
        )
    finally:
        os.close(w)
        os.close(r)
    assert out.stdout.startswith(b"dropped"), out.stdout  # control: the pipe did fill (a blocking fd would hang)


# Leaves memory that no process owns: a System V segment of most of the sandbox's memory (touched, so
# it is really held), a POSIX message queue and a file in /dev/shm.
LEAVE_MEMORY_BEHIND = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
size = 240 << 20
seg = libc.shmget(0, ctypes.c_size_t(size), 0o1000 | 0o600)
assert seg >= 0, os.strerror(ctypes.get_errno())
addr = libc.shmat(seg, None, 0)
ctypes.memset(addr, 1, size)
libc.shmdt(ctypes.c_void_p(addr))
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
assert libc.mq_open(b"/left", os.O_CREAT | os.O_RDWR, 0o600, None) >= 0, os.strerror(ctypes.get_errno())
with open("/dev/shm/left", "wb") as f:
    f.write(b"x" * (8 << 20))
"""
JUDGE_NEEDS_MEMORY = "b = b'\\x01' * (200 << 20); print(len(b) >> 20)"
LEFT = "ipcs -m | grep -c '^0x' ; ls /dev/shm /dev/mqueue"


def test_kill_all_leaves_no_memory_behind_for_the_judge(target):  # noqa: F811
    r = target.exec(["python3", "-c", LEAVE_MEMORY_BEHIND], timeout=30)
    assert r.exit_code == 0, r.stderr_text
    left = target.exec(LEFT, user="judge").stdout_text
    assert left.split()[0] == "1" and "left" in left, left  # control: the probe sees what was left
    starved = target.exec(["python3", "-c", JUDGE_NEEDS_MEMORY], user="judge", timeout=30)
    assert starved.exit_code != 0  # control: with the segment held, the judge's allocation fails
    # The OOM killer's order: the model's commands before the judge's, the judge's before the agent.
    scores = [target.exec("cat /proc/self/oom_score_adj", user=u).stdout_text.strip() for u in ("sandbox", "judge")]
    assert scores == ["1000", "500"], scores
    target.kill_all()
    left = target.exec(LEFT, user="judge").stdout_text
    assert left.split()[0] == "0" and "left" not in left, left
    fed = target.exec(["python3", "-c", JUDGE_NEEDS_MEMORY], user="judge", timeout=30)
    assert fed.exit_code == 0 and fed.stdout_text.strip() == "200", (fed.exit_code, fed.stderr_text)


# The model's traps for a careless verifier: a .pth under $HOME (run by site at every python3 start) and
# a module named like a stdlib one in the default cwd, each leaving a marker when it runs as the judge.
PLANT_TRAPS = r"""
import os, sys, sysconfig
home = os.environ["HOME"]
ver = "python%d.%d" % sys.version_info[:2]
site = os.path.join(home, ".local", "lib", ver, "site-packages")
os.makedirs(site, exist_ok=True)
hook = "import os; open('/tmp/ran-as-%d-pth' % os.getuid(), 'w').close()\n"
open(os.path.join(site, "trap.pth"), "w").write(hook)
open(os.path.join(os.getcwd(), "json.py"), "w").write(hook.replace("pth", "cwd"))
"""
JUDGE_LOOKS = (
    "import json, os, stat; st = os.stat(os.environ['HOME']);"
    "print(json.dumps({'cwd': os.getcwd(), 'home': os.environ['HOME'], 'tmp': os.environ['TMPDIR'],"
    "'mode': stat.S_IMODE(st.st_mode), 'uid': st.st_uid, 'env': sorted(os.environ)}))"
)


def test_the_judge_stands_on_its_own_ground(target):  # noqa: F811
    assert target.exec(["python3", "-c", PLANT_TRAPS]).exit_code == 0
    # Control: a judge run the old way (model's HOME and cwd) does trip both traps.
    control = target.exec(["python3", "-c", "import json"], user="judge", cwd="/workspace", env={"HOME": "/workspace"})
    assert control.exit_code == 0, control.stderr_text
    tripped = target.exec("ls /tmp").stdout_text.split()
    assert {"ran-as-1001-pth", "ran-as-1001-cwd"} <= set(tripped), tripped
    assert target.exec("rm -f /tmp/ran-as-*", user="judge").exit_code == 0
    r = target.exec(["python3", "-c", JUDGE_LOOKS], user="judge")
    assert r.exit_code == 0, r.stderr_text
    seen = json.loads(r.stdout)
    assert seen["cwd"] == seen["home"] == seen["tmp"] == "/run/agentrl/judge", seen
    assert (seen["mode"], seen["uid"]) == (0o700, 1001), seen
    assert seen["env"] == ["HOME", "LANG", "PATH", "TMPDIR"], seen
    assert "ran-as" not in target.exec("ls /tmp").stdout_text
    # The model can neither look into nor plant in the judge's ground.
    assert target.exec("ls /run/agentrl/judge || touch /run/agentrl/judge/x").exit_code != 0
    assert target.exec("touch /run/agentrl/judge/x", user="judge").exit_code == 0  # control: writable to the judge


def test_an_unreachable_daemon_is_named_at_once_not_a_saturated_pool():
    """A daemon URL that accepts connections and never answers: the pool names it and its error."""
    import socket

    from sandbox import Host, HostUnavailable, SandboxSpec, WarmPool
    from tests.sandbox.conftest import backend_or_skip

    live = backend_or_skip("docker")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        with (
            WarmPool(Host(url, capacity=1)) as pool,
            pytest.raises(HostUnavailable, match="no host in rotation") as caught,
        ):
            pool.acquire(SandboxSpec(), timeout=45)
    assert url in str(caught.value) and "timed out" in str(caught.value), caught.value
    assert "saturated" not in str(caught.value)
    with WarmPool(Host(live, capacity=1)) as pool, pool.lease(SandboxSpec()) as sb:  # control: a daemon that answers
        assert sb.exec("true").exit_code == 0


@pytest.mark.parametrize(
    "attack",
    [
        "truncate -s 100M /tmp/hole1 /workspace/hole2",  # 200 MiB apparent, nothing allocated
        "head -c 8M /dev/zero > /tmp/f && for i in $(seq 40); do ln /tmp/f /tmp/l$i; done",  # 328 MiB by name
    ],
    ids=["sparse", "hardlinks"],
)
def test_a_snapshot_of_inflated_files_is_a_file_error_not_an_oom(target, attack):  # noqa: F811
    from sandbox import SandboxFileError

    assert target.exec(attack).exit_code == 0
    with pytest.raises(SandboxFileError, match=r"sparse|hard links"):
        target.snapshot()
    assert target.exec("echo alive").stdout_text.strip() == "alive"  # the agent was not OOM-killed
    # Control: the same files made dense and unlinked down to one name snapshot fine.
    target.exec("rm -f /tmp/l* /tmp/hole1 /workspace/hole2; head -c 8M /dev/zero > /tmp/dense")
    assert target.snapshot().size_bytes > 8 << 20


def test_a_snapshot_past_its_cap_is_a_file_error_and_the_cap_holds_on_restore(target):  # noqa: F811
    """Dense data past ``max_bytes``: the agent streams chunks and stops at the cap, it does not OOM."""
    from sandbox import SandboxFileError, Snapshot
    from sandbox.agent.protocol import STREAM_CHUNK_BYTES
    from sandbox.backends.base import SNAPSHOT_MAX_BYTES

    cap = 4 * STREAM_CHUNK_BYTES
    assert target.exec("head -c 6M /dev/urandom > /workspace/big").exit_code == 0
    with pytest.raises(SandboxFileError, match=rf"max_bytes={cap} \((\d+) bytes reached\)"):
        target.snapshot(max_bytes=cap)
    assert target.exec("echo alive").stdout_text.strip() == "alive"  # the agent was not OOM-killed
    with pytest.raises(SandboxFileError, match=f"larger than max_bytes={SNAPSHOT_MAX_BYTES}"):
        target.restore(Snapshot(target.backend, target.id, bytes(SNAPSHOT_MAX_BYTES + 1), 0.0))
    # Control: under the cap the same kind of data streams in several chunks and round-trips.
    target.exec("head -c 3M /dev/urandom > /workspace/big && sha256sum /workspace/big > /tmp/sum")
    snap = target.snapshot(max_bytes=cap)
    assert 3 * STREAM_CHUNK_BYTES < snap.size_bytes <= cap
    target.exec("rm /workspace/big /tmp/sum")
    target.restore(snap)
    assert target.exec("sha256sum -c /tmp/sum").exit_code == 0


def test_the_snapshot_writer_holds_at_most_one_chunk_and_stops_at_its_cap():
    """What bounds the agent's memory: every chunk it sends is at most ``chunk`` bytes, and past the cap it stops."""
    from sandbox.agent.files import ChunkWriter, FileOpError

    sent: list[bytes] = []
    writer = ChunkWriter(sent.append, chunk=1000, limit=10_000)
    for _ in range(9):
        writer.write(b"x" * 999)
    writer.flush()
    assert max(map(len, sent)) <= 1000 and b"".join(sent) == b"x" * 8991  # control: all of it arrives
    with pytest.raises(FileOpError, match=r"max_bytes=10000 \(12987 bytes reached\)"):
        writer.write(b"x" * 3996)
    assert sum(map(len, sent)) == 8991  # nothing past the cap was sent


def test_privilege_escalation_probes_see_success_when_it_is_real(hostile):
    """Controls for test_adversarial's privilege-escalation probes: they exit 0 where the effect is allowed."""
    if os.geteuid() == 0:  # root on the host: the setuid probe does become uid 0 there
        assert subprocess.run(["sh", "-c", SETUID_ROOT], capture_output=True).returncode == 0
    r = hostile.exec("sleep 30 & kill -9 $!", timeout=10)  # killing a process the command may signal works
    assert r.exit_code == 0, r.stderr_text
