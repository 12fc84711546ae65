"""The in-sandbox agent: PID 1 of every sandbox, on both backends.

The host sends this file's source to ``python3`` at sandbox start (see
:data:`BOOTSTRAP`), so images need only a Python 3 and never go stale when the
agent changes. Being PID 1 of the sandbox's PID namespace makes it immune to
signals from the code it runs (``kill -9 -1`` inside spares it), and makes it
the reaper of every orphan, so zombies never pile up.

One request at a time arrives on stdin and one response leaves on stdout, each
framed as ``u32 header length | JSON header | binary blobs`` (lengths listed in
the header's ``blobs``). The agent enforces per-command wall-clock timeouts,
kills the whole process tree a command left behind when it times out (``setsid``
daemons and trapped SIGTERM included), caps captured output inside the sandbox
so the host never buffers more than the cap, and snapshots/restores the
writable directories.

Standard library only; runs on Python >= 3.8.
"""

import errno
import io
import json
import os
import selectors
import shutil
import signal
import stat
import struct
import sys
import tarfile
import time

# The command line that boots the agent: read a u32 length, then that much source, exec it.
BOOTSTRAP = (
    "import sys,struct;r=sys.stdin.buffer;n=struct.unpack('>I',r.read(4))[0];"
    "exec(compile(r.read(n),'agentrl-agent','exec'),{'__name__':'__agent__'})"
)

_HEADER = struct.Struct(">I")
_MAX_HEADER = 64 << 20
_DRAIN_AFTER_EXIT_S = 0.05


def read_exact(stream, n):
    data = stream.read(n)
    if data is None or len(data) != n:
        raise EOFError("stream closed after %d of %d bytes" % (0 if data is None else len(data), n))
    return data


def read_message(stream):
    """Reads one framed message: returns (header dict, list of blobs)."""
    (size,) = _HEADER.unpack(read_exact(stream, 4))
    if size > _MAX_HEADER:
        raise ValueError("message header of %d bytes is too large" % size)
    header = json.loads(read_exact(stream, size).decode("utf-8"))
    blobs = [read_exact(stream, int(n)) for n in header.get("blobs", ())]
    return header, blobs


def encode_message(header, blobs=()):
    """Frames a message; the inverse of :func:`read_message`."""
    header = dict(header, blobs=[len(b) for b in blobs])
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return b"".join([_HEADER.pack(len(raw)), raw, *blobs])


def _process_table(me):
    """{pid: start time} of every process but the agent (start time guards pid reuse)."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
            table[int(name)] = stat[stat.rindex(b")") + 2 :].split()[19]
        except (OSError, ValueError, IndexError):
            continue
    return table


def _listing(roots, limit):
    """[path, kind (d/f/l/o), size of files, mode] of everything under ``roots``, at most ``limit``."""
    entries = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                mode = st.st_mode
                kind = "d" if stat.S_ISDIR(mode) else "l" if stat.S_ISLNK(mode) else "f" if stat.S_ISREG(mode) else "o"
                entries.append([path, kind, st.st_size if kind == "f" else 0, stat.S_IMODE(mode)])
                if len(entries) >= limit:
                    return entries
    return entries


def _raise_oom_score():
    """In the child before exec: whatever the command spawns is what the OOM killer takes first.

    Set before exec (not after spawn) so a fork bomb cannot fork at the old score.
    """
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


class Agent:
    def __init__(self, config):
        self.workdir = config["workdir"]
        self.writable = list(config.get("writable", [self.workdir]))
        self.base_env = dict(config.get("env", {}))
        self.oom_files = list(config.get("oom_files", []))
        self.shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        self.pid = os.getpid()
        for name, value in dict(config.get("rlimits", {})).items():
            import resource

            resource.setrlimit(getattr(resource, "RLIMIT_" + name), (int(value), int(value)))
        self.exited = {}  # pid -> raw wait status of reaped children we spawned
        self.wanted = set()
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        for path in list(self.writable):
            try:
                os.makedirs(path, exist_ok=True)
            except OSError:
                pass
            if not os.access(path, os.W_OK):
                self.writable.remove(path)

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
        """SIGKILLs every process not in ``before``: freeze first so nothing forks meanwhile."""
        if not before:
            self.kill_all()
            return
        for _ in range(200):
            new = [p for p, t in _process_table(self.pid).items() if before.get(p) != t]
            if not new:
                return
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                for pid in new:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
            time.sleep(0.002)
            self.reap()
        self.kill_all()  # did not converge (a fork storm): take everything down

    def kill_all(self):
        """kill(-1) from PID 1 is atomic against fork and spares only the agent."""
        for _ in range(100):
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                break
            time.sleep(0.002)
            self.reap()
            if not _process_table(self.pid):
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
        return {"ok": True, "pid": self.pid, "processes": len(_process_table(self.pid))}, []

    def op_exec(self, req, blobs):
        cmd = req["cmd"]
        argv = [self.shell, "-c", cmd] if isinstance(cmd, str) else list(cmd)
        env = dict(self.base_env)
        env.update(req.get("env") or {})
        cwd = req.get("cwd") or self.workdir
        if not os.path.isdir(cwd):
            return {"error": "usage", "message": "cwd %r is not a directory in the sandbox" % cwd}, []
        cap = int(req["max_output"])
        stdin = blobs[0] if blobs else b""
        before = _process_table(self.pid)
        oom_before = self.oom_kills()
        start = time.monotonic()
        deadline = start + float(req["timeout"])
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if stdin else (os.open(os.devnull, os.O_RDONLY), None)
        try:
            pid = self._spawn(argv, env, cwd, in_r, out_w, err_w)
        except OSError as exc:
            for fd in (out_r, out_w, err_r, err_w, in_r, in_w):
                if fd is not None:
                    os.close(fd)
            if exc.errno == errno.E2BIG:
                msg = "command or environment too long for execve (E2BIG); write long scripts to a file first"
                return {"error": "usage", "message": msg}, []
            # Like a shell: a missing program is 127, one that cannot start (pids limit hit) 126.
            code = 127 if exc.errno in (errno.ENOENT, errno.ENOTDIR) else 126
            msg = ("agentrl: cannot execute %r: %s\n" % (argv[0], exc.strerror or exc)).encode()
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

    def _spawn(self, argv, env, cwd, stdin_fd, out_fd, err_fd):
        import subprocess  # deferred: only exec needs it

        proc = subprocess.Popen(
            argv,
            stdin=stdin_fd,
            stdout=out_fd,
            stderr=err_fd,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_raise_oom_score,  # safe: the agent is single-threaded
        )
        proc.returncode = 0  # the agent reaps; stop Popen from ever waiting on it
        return proc.pid

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
                        try:
                            os.read(fd, 4096)
                        except BlockingIOError:
                            pass
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

    def _resolve(self, path):
        if not isinstance(path, str) or not path or "\0" in path:
            raise ValueError("bad path %r" % (path,))
        return os.path.normpath(os.path.join(self.workdir, path))

    def op_write(self, req, blobs):
        for meta, data in zip(req["files"], blobs):
            path = self._resolve(meta["path"])
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
                os.chmod(path, int(meta.get("mode", 0o644)))
            except OSError as exc:
                return {"error": "file", "message": "write %s: %s" % (path, exc.strerror or exc)}, []
        return {"ok": True}, []

    def op_read(self, req, blobs):
        path = self._resolve(req["path"])
        limit = int(req["max_bytes"])
        try:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
        except OSError as exc:
            return {"error": "file", "message": "read %s: %s" % (path, exc.strerror or exc)}, []
        if len(data) > limit:
            return {"error": "file", "message": "read %s: larger than max_bytes=%d" % (path, limit)}, []
        return {"ok": True}, [data]

    def op_probe(self, req, blobs):
        """What the writable dirs hold and how many processes run, seen from here (no command spawned).

        The warm pool's hygiene check after a reset: one round trip instead of a ``find`` exec.
        """
        limit = int(req.get("max_entries", 10000))
        entries = _listing(self.writable, limit + 1)
        entries.sort()
        return {
            "ok": True,
            "entries": entries[:limit],
            "truncated": len(entries) > limit,
            "processes": len(_process_table(self.pid)),
        }, []

    def op_killall(self, req, blobs):
        self.kill_all()
        return {"ok": True}, []

    def op_snapshot(self, req, blobs):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for root in self.writable:
                tar.add(root, arcname=root.lstrip("/"), recursive=True)
        return {"ok": True}, [buf.getvalue()]

    def op_restore(self, req, blobs):
        """Kills every process, empties the writable dirs, unpacks the snapshot."""
        self.kill_all()
        for root in self.writable:
            for name in os.listdir(root):
                path = os.path.join(root, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
        with tarfile.open(fileobj=io.BytesIO(blobs[0]), mode="r") as tar:
            kwargs = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
            tar.extractall("/", **kwargs)
        return {"ok": True}, []

    def serve(self, inp, out):
        out.write(encode_message({"ok": True, "hello": True, "pid": self.pid}))
        out.flush()
        while True:
            try:
                req, blobs = read_message(inp)
            except EOFError:
                return
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
    Agent(config).serve(inp, out)


if __name__ == "__agent__":
    main()
