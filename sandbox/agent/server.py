"""The in-sandbox agent: PID 1 of every sandbox, on both backends.

The host sends the sources of this package to ``python3`` at sandbox start
(see :data:`sandbox.agent.BOOTSTRAP`), so images need only a Python 3 and never
go stale when the agent changes. Being PID 1 of the sandbox's PID namespace
makes it the reaper of every orphan, so zombies never pile up.

Who is who inside: the agent is sandbox root with a few capabilities, locked
down at boot (:mod:`sandbox.agent.confine`). Every command runs as an
unprivileged uid, ``sandbox`` (1000) by default or ``judge`` (1001) for code
that decides a reward, with no capabilities; it cannot ptrace the agent, read
its memory or descriptors, or write its reply stream.

One request at a time arrives on stdin and one response leaves on stdout
(:mod:`sandbox.agent.protocol`). The agent enforces per-command wall-clock
timeouts, kills the whole process tree a command left behind when it times out
(``setsid`` daemons and trapped SIGTERM included), caps captured output inside
the sandbox so the host never buffers more than the cap, and snapshots,
restores and lists the writable directories (:mod:`sandbox.agent.files`).

Standard library only; runs on Python >= 3.8.
"""

import errno
import os
import selectors
import signal
import sys
import time

from sandbox.agent import confine as confinement
from sandbox.agent import ipc, signals
from sandbox.agent.files import ChunkWriter, FileOpError, Trees, remove_children
from sandbox.agent.processes import process_table, signal_all, spawn, stopped, subprocess_error
from sandbox.agent.protocol import STREAM_CHUNK_BYTES, encode_message, read_message
from sandbox.agent.roots import RootAttributes

_DRAIN_AFTER_EXIT_S = 0.05
KILL_ALL_CLEARS = ("/dev/shm", "/dev/mqueue")  # memory no process owns; the workspace and /tmp stay


class Agent:
    def __init__(self, config):
        self.workdir = config["workdir"]
        self.base_env = dict(config.get("env", {}))
        judge = dict(config.get("judge") or {})
        self.user_env = {"judge": dict(judge.get("env") or self.base_env)}
        self.user_cwd = {"judge": judge.get("cwd") or self.workdir}
        self.oom_files = list(config.get("oom_files", []))
        self.users = {name: tuple(ids) for name, ids in dict(config["users"]).items()}
        self.shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        self.pid = os.getpid()
        import resource

        for name, value in dict(config.get("rlimits", {})).items():
            resource.setrlimit(getattr(resource, "RLIMIT_" + name), (int(value), int(value)))
        os.umask(0o022)
        applied = confinement.confine(config)
        self.trees = Trees(applied.pop("writable"))
        self.confinement = dict(applied, writable=self.trees.paths)
        self.root_attributes = RootAttributes(self.trees.paths)  # before any command can touch the roots
        self.exited = {}  # pid -> raw wait status of reaped children we spawned
        self.wanted = set()
        self.wake_r = signals.install()

    # -- process management -------------------------------------------------
    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.wanted:
                self.exited[pid] = status

    def kill_new(self, before):
        """SIGKILLs every process not in ``before``; the ones in it (services started earlier) survive.

        The whole sandbox is frozen meanwhile: the victims are the only processes left runnable, so
        they die at once even when hundreds of older processes spin on the sandbox's CPU share (a
        killed process must run to exit). Processes that were already stopped stay stopped.
        """
        if not before:
            self.kill_all()
            return
        frozen = [p for p, t in process_table(self.pid).items() if before.get(p) == t and not stopped(p)]
        signal_all(frozen, signal.SIGSTOP)
        try:
            for _ in range(200):
                new = [p for p, t in process_table(self.pid).items() if before.get(p) != t]
                if not new:
                    return
                for sig in (signal.SIGSTOP, signal.SIGKILL):
                    signal_all(new, sig)
                time.sleep(0.002)
                self.reap()
            self.kill_all()  # did not converge (a fork storm): take everything down
        finally:
            signal_all(frozen, signal.SIGCONT)

    def kill_all(self):
        """kill(-1) from PID 1 is atomic against fork and spares only the agent."""
        for _ in range(100):
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                break
            time.sleep(0.002)
            self.reap()
            if not process_table(self.pid):
                break
        self.reap()

    def oom_kills(self):
        total = 0
        for path in self.oom_files:
            try:
                with open(path) as f:
                    for line in f:
                        if line.startswith("oom_kill "):
                            total += int(line.split()[1])
            except (OSError, ValueError):
                continue
        return total

    # -- requests -------------------------------------------------------------
    def op_ping(self, req, blobs):
        return {"ok": True, "pid": self.pid, "processes": len(process_table(self.pid))}, []

    def op_exec(self, req, blobs):
        cmd = req["cmd"]
        argv = [self.shell, "-c", cmd] if isinstance(cmd, str) else list(cmd)
        user = req.get("user") or "sandbox"
        env = dict(self.user_env.get(user, self.base_env))
        env.update(req.get("env") or {})
        cwd = req.get("cwd") or self.user_cwd.get(user, self.workdir)
        if user not in self.users:
            return {"error": "usage", "message": "unknown user %r (one of %s)" % (user, sorted(self.users))}, []
        if not os.path.isdir(cwd):
            return {"error": "usage", "message": "cwd %r is not a directory in the sandbox" % cwd}, []
        cap = int(req["max_output"])
        stdin = blobs[0] if blobs else b""
        before = process_table(self.pid)
        oom_before = self.oom_kills()
        start = time.monotonic()
        deadline = start + float(req["timeout"])
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if stdin else (os.open(os.devnull, os.O_RDONLY), None)
        try:
            pid = spawn(argv, env, self.users[user], cwd, in_r, out_w, err_w, user=user)
        except (OSError, subprocess_error()) as exc:
            for fd in (out_r, out_w, err_r, err_w, in_r, in_w):
                if fd is not None:
                    os.close(fd)
            if getattr(exc, "errno", None) == errno.E2BIG:
                msg = "command or environment too long for execve (E2BIG); write long scripts to a file first"
                return {"error": "usage", "message": msg}, []
            # Like a shell: a missing program is 127, one that cannot start (pids limit hit, cwd
            # not enterable by the command's uid) 126.
            code = 127 if getattr(exc, "errno", None) in (errno.ENOENT, errno.ENOTDIR) else 126
            msg = ("agentrl: cannot execute %r: %s\n" % (argv[0], getattr(exc, "strerror", None) or exc)).encode()
            header = {"exit_code": code, "timed_out": False, "truncated": False, "duration_s": 0.0, "oom_killed": False}
            return header, [b"", msg]
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        self.wanted.add(pid)
        try:
            bufs, truncated, timed_out, status = self._pump(pid, out_r, err_r, in_w, stdin, cap, deadline)
            if timed_out:
                self.kill_new(before)
            duration = time.monotonic() - start
            for _ in range(500):  # collect the status of a command killed above
                if status is not None:
                    break
                self.reap()
                status = self.exited.pop(pid, None)
                if status is None:
                    time.sleep(0.002)
        finally:
            self.wanted.discard(pid)
            self.exited.pop(pid, None)
        status = signal.SIGKILL if status is None else status
        if os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
        else:
            code = 128 + (os.WTERMSIG(status) if os.WIFSIGNALED(status) else 9)
        oom = code == 128 + signal.SIGKILL and self.oom_kills() > oom_before
        header = {
            "exit_code": code,
            "timed_out": timed_out,
            "truncated": truncated,
            "duration_s": duration,
            "oom_killed": oom,
        }
        return header, [bytes(bufs[0]), bytes(bufs[1])]

    def _pump(self, pid, out_r, err_r, in_w, stdin, cap, deadline):
        sel = selectors.DefaultSelector()
        bufs = {out_r: bytearray(), err_r: bytearray()}
        truncated = False
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        sel.register(self.wake_r, selectors.EVENT_READ)
        stdin_view = memoryview(stdin)
        if in_w is not None:
            os.set_blocking(in_w, False)
            sel.register(in_w, selectors.EVENT_WRITE)
        status = None
        drain_until = None
        timed_out = False
        try:
            while True:
                self.reap()
                if status is None and pid in self.exited:
                    status = self.exited.pop(pid)
                    drain_until = time.monotonic() + _DRAIN_AFTER_EXIT_S
                open_pipes = [fd for fd in bufs if fd in sel.get_map()]
                now = time.monotonic()
                if status is not None and (not open_pipes or now >= drain_until):
                    break
                if status is None and now >= deadline:
                    timed_out = True
                    break
                limit = drain_until if status is not None else deadline
                for key, _ in sel.select(max(0.0, min(limit - now, 1.0))):
                    fd = key.fd
                    if fd == self.wake_r:
                        signals.drain(fd)
                    elif fd == in_w:
                        try:
                            n = os.write(fd, stdin_view[:65536])
                            stdin_view = stdin_view[n:]
                        except (BrokenPipeError, OSError):
                            stdin_view = stdin_view[:0]
                        if not stdin_view:
                            sel.unregister(fd)
                            os.close(fd)
                            in_w = None
                    else:
                        try:
                            chunk = os.read(fd, 1 << 16)
                        except BlockingIOError:
                            continue
                        if not chunk:
                            sel.unregister(fd)
                            continue
                        buf = bufs[fd]
                        room = cap - len(buf)
                        if len(chunk) > room:
                            truncated = True
                            chunk = chunk[: max(room, 0)]
                        buf += chunk
        finally:
            sel.close()
            for fd in (out_r, err_r, in_w):
                if fd is not None:
                    os.close(fd)
        return (bufs[out_r], bufs[err_r]), truncated, timed_out, status

    def _path(self, path):
        if not isinstance(path, str) or not path or "\0" in path:
            raise FileOpError("bad path %r" % (path,))
        return os.path.normpath(os.path.join(self.workdir, path))

    def op_write(self, req, blobs):
        uid, gid = self.users[req.get("user") or "sandbox"]
        for meta, data in zip(req["files"], blobs):
            path = self._path(meta["path"])
            try:
                self.trees.write(path, data, int(meta.get("mode", 0o644)), uid, gid)
            except (OSError, FileOpError) as exc:
                return {"error": "file", "message": "write %s: %s" % (path, getattr(exc, "strerror", None) or exc)}, []
        return {"ok": True}, []

    def op_read(self, req, blobs):
        path = self._path(req["path"])
        try:
            data = self.trees.read(path, int(req["max_bytes"]))
        except (OSError, FileOpError) as exc:
            return {"error": "file", "message": "read %s: %s" % (path, getattr(exc, "strerror", None) or exc)}, []
        return {"ok": True}, [data]

    def op_probe(self, req, blobs):
        """What the writable dirs and the IPC namespace hold and how many processes run (no command spawned).

        The warm pool's hygiene check after a reset: one round trip instead of a ``find`` exec.
        """
        entries, complete = self.trees.listing(int(req.get("max_entries", 10000)))
        entries.sort()
        return {
            "ok": True,
            "entries": entries,
            "truncated": not complete,
            "ipc": ipc.objects(),
            "roots": self.root_attributes.fingerprint(),
            "processes": len(process_table(self.pid)),
        }, []

    def op_resources(self, req, blobs):
        """Processes, System V objects and free blocks/inodes of each writable root: what a policy can exhaust.

        No listing of the trees (unlike ``probe``): it runs around every verification.
        """
        space = {}
        for path in self.trees.paths:
            try:
                st = os.statvfs(path)
            except OSError:
                continue
            space[path] = [st.f_bavail, st.f_favail]
        return {"ok": True, "processes": len(process_table(self.pid)), "ipc": ipc.objects(), "space": space}, []

    def op_killall(self, req, blobs):
        """Kills every process and clears what outlives processes in memory, so the judge starts on clean ground.

        System V IPC, POSIX message queues and ``/dev/shm`` hold memory that no process owns: a segment
        the size of the sandbox left by the model would OOM-kill every judge process after it. The
        workspace and ``/tmp`` stay: they are the model's work, which the judge has come to read.
        """
        self.kill_all()
        for path in KILL_ALL_CLEARS:
            if os.path.isdir(path) and path in self.trees.paths:
                remove_children(path)
        left = ipc.remove_all()
        if left:
            return {"error": "agent", "message": "%d IPC objects could not be removed" % left}, []
        return {"ok": True}, []

    def op_snapshot(self, req, blobs):
        """Streams the tar in chunk messages, then replies; at most ``max_bytes`` of it in all."""

        def send(chunk):
            self.out.write(encode_message({"id": req.get("id"), "chunk": True}, [chunk]))
            self.out.flush()

        try:
            self.trees.snapshot(ChunkWriter(send, STREAM_CHUNK_BYTES, int(req["max_bytes"])))
            return {"ok": True}, []
        except (OSError, FileOpError) as exc:  # what the commands made of their files, not a broken agent
            return {"error": "file", "message": "snapshot: %s" % exc}, []

    def op_restore(self, req, blobs):
        """Kills every process, empties the writable dirs and the IPC namespace, unpacks the snapshot."""
        self.kill_all()
        self.trees.clear()
        left = ipc.remove_all()
        if left:
            return {"error": "agent", "message": "%d IPC objects could not be removed" % left}, []
        try:
            self.trees.restore(blobs[0])
        except (OSError, FileOpError) as exc:
            return {"error": "agent", "message": "restore: %s" % exc}, []
        problems = self.root_attributes.reset()
        if problems:
            return {"error": "agent", "message": "restore: " + "; ".join(problems[:5])}, []
        return {"ok": True}, []

    def serve(self, inp, out):
        self.out = out  # streamed replies (snapshots) write their chunks before the final reply
        hello = {"ok": True, "hello": True, "pid": self.pid, "confinement": self.confinement}
        out.write(encode_message(hello))
        out.flush()
        while True:
            try:
                req, blobs = read_message(inp)
            except EOFError:
                return
            signals.drain(self.wake_r)  # wake-ups that came between execs say nothing new
            handler = getattr(self, "op_" + str(req.get("op")), None)
            try:
                if handler is None:
                    resp, rblobs = {"error": "usage", "message": "unknown op %r" % req.get("op")}, []
                else:
                    resp, rblobs = handler(req, blobs)
            except Exception as exc:  # report, never die: a dead PID 1 takes the sandbox with it
                resp, rblobs = {"error": "agent", "message": "%s: %s" % (type(exc).__name__, exc)}, []
            resp["id"] = req.get("id")
            out.write(encode_message(resp, rblobs))
            out.flush()


def main():
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    config, _ = read_message(inp)
    try:
        agent = Agent(config)
    except Exception as exc:  # noqa: BLE001 - a sandbox that cannot be confined must not serve
        out.write(encode_message({"error": "confine", "message": "%s: %s" % (type(exc).__name__, exc)}))
        out.flush()
        return
    agent.serve(inp, out)
