"""The in-sandbox half of the ``sandbox_state`` verifier: it looks, the host judges.

    python3 -I -B -c <this file, git_env bundled in>      # request on stdin, answer on stdout

The request and the answer travel over the exec's own pipes, which the sandbox
agent creates as root: no other uid can reopen them through ``/proc``. The host
(``envs/domains/shell/verifier.py``) sends ``{"mode", "items", "budget_s"}``
and reads back ``{"observations": [...]}``, one per item. No expected value
ever enters the sandbox: a request says only *where* to look (paths, queries,
commands, URLs) and whether what was seen is right is decided on the host
(``envs/domains/shell/rules.py``). So there is nothing here worth stealing,
and nothing of this process speaks for the verdict but plain observations.

Modes, and who runs them:

* ``observe`` (uid 1000, only after every process of the agent was killed):
  file metadata and content, directory listings, crontab text, sqlite rows. It
  takes the agent's uid because the graded state includes owner-only files (a
  0700 directory, a 0600 key) no other unprivileged uid may read; nothing of the
  agent is alive to watch it, and it never starts another program.
* ``commands`` (uid 1001, the judge): task-given shell commands over the
  agent's files (see ``git_env.py``, bundled in by the host, for how git is kept
  from running anything the agent configured).
* ``network`` (uid 1001): HTTP and TCP requests to services the agent left
  running, for tasks that declare ``keep_services``; the agent's processes are
  alive then, and cannot see, signal or read a process of another uid.

Every mode first makes itself non-dumpable (its ``/proc/<pid>/fd``, ``mem`` and
``environ`` are then closed to every uid, its own included), and before it
answers it kills whatever else runs under its uid (what a command left behind).
Reads never block on a FIFO, never follow a symlink into ``/proc``, ``/sys`` or
``/dev``, and are bounded; an error observes as an error, so it fails its check.
Standard library only; Python >= 3.8.
"""

import ctypes
import errno
import hashlib
import http.client
import json
import os
import selectors
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
import urllib.parse

if __package__:  # imported on the host, as part of envs
    from envs.in_sandbox.git_env import GitVetError, git_env
else:  # shipped: git_env is bundled in
    from git_env import GitVetError, git_env

WORKSPACE = "/workspace"
TEXT_LIMIT = 128 << 10  # content returned for text checks
HASH_LIMIT = 256 << 20  # content hashed for sha256 checks
TREE_LIMIT = 20000
OUTPUT_LIMIT = 128 << 10  # per stream of a command
ANSWER_BUDGET = 900 << 10  # the exec's stdout holds 1 MiB: an observation past this budget is an error
PROBE_S = 5.0  # longest a response may trickle in
_DENIED_ROOTS = ("/proc", "/sys", "/dev")
_DEADLINE = [float("inf")]


class Refused(Exception):
    """A path or an object the checker will not read (it observes as an error)."""


def _path(path):
    return path if path.startswith("/") else os.path.join(WORKSPACE, path)


def _inside(path, root):
    return path == root or path.startswith(root + "/")


def _real(path):
    real = os.path.realpath(path)
    if any(_inside(real, r) for r in _DENIED_ROOTS) and not _inside(real, "/dev/shm"):
        raise Refused(f"{path} resolves to {real}, which is not part of the state")
    return real


def _lstat(path):
    """``os.lstat`` or None when absent; any other error (EACCES on a 000 directory) is raised."""
    try:
        return os.lstat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise


def read_regular(path, limit):
    """(first ``limit`` bytes, size, sha256) of a regular file; FIFOs, devices and /proc refused."""
    fd = os.open(_real(path), os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(f"{path} is not a regular file")
        digest, head, size = hashlib.sha256(), bytearray(), 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return bytes(head), size, digest.hexdigest()
            size += len(chunk)
            if size > HASH_LIMIT:
                raise Refused(f"{path} is larger than {HASH_LIMIT} bytes")
            digest.update(chunk)
            if len(head) < limit:
                head += chunk[: limit - len(head)]
    finally:
        os.close(fd)


def _kind(mode):
    if stat.S_ISLNK(mode):
        return "symlink"
    return "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


def observe_file(item):
    path = _path(item["path"])
    st = _lstat(path)
    if st is None:
        return {"exists": False}
    out = {"exists": True, "kind": _kind(st.st_mode)}
    if out["kind"] == "symlink":
        out["link"] = os.readlink(path)
    try:
        target = os.stat(path)
        out["mode"], out["target_kind"] = stat.S_IMODE(target.st_mode), _kind(target.st_mode)
    except OSError as exc:
        out["stat_error"] = f"{type(exc).__name__}: {exc}"
    if item.get("content"):
        try:
            head, size, digest = read_regular(path, TEXT_LIMIT)
            out.update(text=head.decode("utf-8", "replace"), size=size, sha256=digest, truncated=size > len(head))
        except (OSError, Refused) as exc:
            out["read_error"] = f"{type(exc).__name__}: {exc}"
    return out


def observe_tree(item):
    root = _real(_path(item["path"]))
    st = _lstat(root)
    if st is None:
        return {"files": []}  # as before: a directory that is gone holds no files
    if not stat.S_ISDIR(st.st_mode):
        raise Refused("{} is not a directory".format(item["path"]))

    def fail(exc):  # an unreadable directory could hide files: it fails the check, never shrinks it
        raise exc

    # os.walk puts a directory symlink among the directories and never enters it: reported here as an
    # entry, with every symlink, hardlink and special file, so "only X remains" sees what still reaches elsewhere
    found, links = [], []
    for d, dirs, files in os.walk(root, onerror=fail):
        for name in dirs + files:
            path = os.path.join(d, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                continue
            found.append(rel)
            if stat.S_ISLNK(st.st_mode):
                links.append(f"{rel} is a symlink to {os.readlink(path)}")
            elif not stat.S_ISREG(st.st_mode):
                links.append(f"{rel} is a special file")
            elif st.st_nlink > 1:
                links.append(f"{rel} is a hardlink ({st.st_nlink} names)")
        if len(found) > TREE_LIMIT:
            raise Refused("more than {} files under {}".format(TREE_LIMIT, item["path"]))
    return {"files": sorted(found), "links": links}


def observe_text(item):
    head, size, _ = read_regular(_path(item["path"]), 1 << 20)
    return {"text": head.decode("utf-8", "replace"), "truncated": size > len(head)}


def _cell(value):
    if isinstance(value, bytes):
        return f"<blob {value[:64].hex()}>"
    return value


def observe_sqlite(item):
    real = _real(_path(item["db"]))
    st = _lstat(real)
    if st is None or not stat.S_ISREG(st.st_mode):
        return {"exists": False}
    conn = sqlite3.connect(f"file:{urllib.parse.quote(real)}?mode=ro", uri=True, timeout=1)
    deadline = time.monotonic() + 10
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10000)
    try:
        rows = [[_cell(v) for v in row] for row in conn.execute(item["query"]).fetchmany(10000)]
    finally:
        conn.close()
    return {"exists": True, "rows": rows}


def _pump(proc, stdin, timeout):
    """Feeds ``stdin`` and reads at most OUTPUT_LIMIT of each stream; (out, err, timed_out).

    Stops when the command has exited and its pipes are drained (or a moment after: a process it
    left behind may hold them open), or at its timeout; then every process of this uid but the
    checker is killed.
    """
    sel = selectors.DefaultSelector()
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    pending, stdin_fd = memoryview(stdin), proc.stdin.fileno()
    os.set_blocking(stdin_fd, False)
    sel.register(stdin_fd, selectors.EVENT_WRITE)
    end = min(time.monotonic() + timeout, _DEADLINE[0])
    exited = None
    while True:
        now = time.monotonic()
        if exited is None and proc.poll() is not None:
            exited = now
        reading = [fd for fd in bufs if fd in sel.get_map()]
        if now >= end or (exited is not None and (not reading or now - exited > 0.2)):
            break
        for key, _ in sel.select(max(0.0, min(end - now, 0.1))):
            if key.fd == stdin_fd:
                try:
                    pending = pending[os.write(key.fd, pending[:65536]) :]
                except OSError:
                    pending = pending[:0]
                if not pending:
                    sel.unregister(key.fd)
                    proc.stdin.close()
                continue
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                sel.unregister(key.fd)
            elif len(bufs[key.fd]) < OUTPUT_LIMIT:
                bufs[key.fd] += chunk[: OUTPUT_LIMIT - len(bufs[key.fd])]
    sel.close()
    timed_out = proc.poll() is None
    kill_own()
    proc.wait()
    if not proc.stdin.closed:
        proc.stdin.close()
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), timed_out


def run_command(argv, env, stdin=b"", timeout=20.0, cwd=WORKSPACE):
    """Runs ``argv`` to completion (or its timeout); everything it started is killed after it."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    with proc:
        out, err, timed_out = _pump(proc, stdin, timeout)
    return {
        "exit_code": proc.returncode,
        "stdout": out.decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace"),
        "timed_out": timed_out,
    }


def observe_commands(items):
    problem = None
    try:
        env = git_env([WORKSPACE, "/tmp", "/dev/shm"])
    except GitVetError as exc:
        env, problem = git_env([]), f"git cannot be run safely here: {exc}"
    out = []
    for item in items:
        if problem and "git" in item["run"]:
            out.append({"error": problem})
        elif time.monotonic() >= _DEADLINE[0]:
            out.append({"error": "the checker ran out of time before this command"})
        else:
            try:
                stdin = item.get("stdin", "").encode()
                out.append(run_command(["bash", "-c", item["run"]], env, stdin, float(item.get("timeout", 20))))
            except OSError as exc:  # e.g. /workspace made unenterable for other users
                out.append({"error": f"cannot run the command: {type(exc).__name__}: {exc}"})
    return out


_UNREACHABLE = set()  # ports that stayed closed for a whole wait: later checks do not wait again


def _until(port, item):
    return time.monotonic() + (0.0 if port in _UNREACHABLE else float(item.get("wait_s", 1)))


def observe_http(item):
    url = urllib.parse.urlsplit(item["url"])
    port, last = url.port or 80, "no attempt"
    deadline = _until(port, item)
    while True:
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", port, timeout=3)
        try:
            conn.request("GET", (url.path or "/") + ("?" + url.query if url.query else ""))
            resp = conn.getresponse()
            body, stop = b"", time.monotonic() + PROBE_S
            while len(body) < (1 << 20) and time.monotonic() < stop:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                body += chunk
            return {"status": resp.status, "body": body.decode("utf-8", "replace")}
        except (OSError, http.client.HTTPException) as exc:
            last = f"cannot connect: {exc}"
        finally:
            conn.close()
        if time.monotonic() > deadline:
            _UNREACHABLE.add(port)
            return {"error": last}
        time.sleep(0.1)


def observe_tcp(item):
    port = int(item["port"])
    deadline = _until(port, item)
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
                s.sendall(item.get("send", "").encode())
                s.shutdown(socket.SHUT_WR)
                data, stop = b"", time.monotonic() + PROBE_S
                while len(data) < 65536 and time.monotonic() < stop:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            return {"received": data.decode("utf-8", "replace")}
        except OSError as exc:
            if time.monotonic() > deadline:
                _UNREACHABLE.add(port)
                return {"error": f"cannot connect to port {port}: {exc}"}
            time.sleep(0.1)


OBSERVERS = {"file": observe_file, "tree": observe_tree, "text": observe_text, "sqlite": observe_sqlite,
             "http": observe_http, "tcp": observe_tcp}  # fmt: skip
MODES = {"observe": ("file", "tree", "text", "sqlite"), "network": ("http", "tcp")}


def kill_own():
    """SIGKILLs every other process of this uid (the kernel spares the caller): nothing outlives a command."""
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass


def make_undumpable():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def observe(mode, items):
    if mode == "commands":
        return observe_commands(items)
    out = []
    for item in items:
        if item.get("op") not in MODES[mode]:
            out.append({"error": "op {!r} is not observed in mode {}".format(item.get("op"), mode)})
            continue
        try:
            out.append(OBSERVERS[item["op"]](item))
        except Exception as exc:  # a broken artefact fails its check, never the checker
            out.append({"error": f"{type(exc).__name__}: {exc}"[:500]})
    return out


def within_budget(observations):
    """Observations as sent: one that would overflow the exec's output fails alone, not the whole answer."""
    out, used = [], 0
    for obs in observations:
        size = len(json.dumps(obs, ensure_ascii=False).encode("utf-8"))
        if used + size > ANSWER_BUDGET:
            obs, size = {"error": f"the observation is too large to report ({size} bytes)"}, 100
        out.append(obs)
        used += size
    return out


def main():
    make_undumpable()
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    _DEADLINE[0] = time.monotonic() + float(request.get("budget_s", 100))
    if request["mode"] not in ("observe", "commands", "network"):
        raise SystemExit("unknown mode {!r}".format(request["mode"]))
    observations = within_budget(observe(request["mode"], request["items"]))
    kill_own()
    sys.stdout.write(json.dumps({"observations": observations}, ensure_ascii=False))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
