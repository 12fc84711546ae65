"""Trusted checker of a sandbox's final state, executed inside the sandbox after the agent has finished.

``python3 -I -B state_checker.py`` reads ``{"checks": [...], "nonce": ...}`` on
stdin and prints ``{"body": <json>, "mac": HMAC(nonce, body)}``: one result
per check, ``{"name", "ok", "detail"}``. Checks are declarative, so a task
says *what* must be true, not how to test it:

* ``file``: ``path`` with ``exists``, ``kind`` (file|dir|symlink), ``mode``
  (octal string, permission bits), ``executable``, ``equals``, ``lines``,
  ``contains``/``not_contains`` (lists), ``regex``, ``link_target``, ``sha256``.
* ``tree``: the sorted relative paths of regular files under ``path`` equal ``files``.
* ``command``: ``run`` (bash, in /workspace) with ``exit_code``,
  ``stdout_equals``, ``stdout_contains``, ``stdout_regex``.
* ``http``: GET ``url`` (loopback) with ``status``, ``body_equals``,
  ``body_contains``; retried for ``wait_s`` (default 1) while the service starts.
* ``tcp``: connect to ``port``, send ``send``, expect ``expect_contains``.
* ``cron``: the crontab ``file`` has a line whose schedule means the same as
  ``schedule`` (``*/15`` equals ``0,15,30,45``) and whose command contains
  ``command_contains``; with ``run: true`` the command is executed.
* ``sqlite``: ``query`` on database ``db`` returns ``rows``.

Live services started by the agent are left running: they are the state under test.
Standard library only; Python >= 3.8.
"""

import hashlib
import hmac
import json
import os
import re
import socket
import sqlite3
import stat
import subprocess
import sys
import time
import urllib.parse
import urllib.request

WORKSPACE = "/workspace"
_CRON_FIELDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_CRON_MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
_NAMES = {
    n: i for i, n in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1)
}
_NAMES.update({n: i for i, n in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])})


def _path(path):
    return path if path.startswith("/") else os.path.join(WORKSPACE, path)


def _read(path):
    with open(_path(path), encoding="utf-8", errors="replace") as f:
        return f.read()


def check_file(c):
    path = _path(c["path"])
    exists = os.path.lexists(path)
    if not c.get("exists", True):
        return not exists, "exists" if exists else "absent"
    if not exists:
        return False, "{} does not exist".format(c["path"])
    st = os.lstat(path)
    kind = "symlink" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "file"
    if "kind" in c and c["kind"] != kind:
        return False, "{} is a {}, expected a {}".format(c["path"], kind, c["kind"])
    if "link_target" in c and (kind != "symlink" or os.readlink(path).rstrip("/") != c["link_target"].rstrip("/")):
        return False, "{} does not link to {}".format(c["path"], c["link_target"])
    if "mode" in c and stat.S_IMODE(os.stat(path).st_mode) != int(c["mode"], 8):
        return False, "{} has mode {:o}, expected {}".format(c["path"], stat.S_IMODE(os.stat(path).st_mode), c["mode"])
    if "executable" in c and bool(os.stat(path).st_mode & 0o111) != c["executable"]:
        return False, "{} executable bit is {}".format(c["path"], not c["executable"])
    text_checks = ("equals", "lines", "contains", "not_contains", "regex", "sha256")
    if any(k in c for k in text_checks):
        if not os.path.isfile(path):
            return False, "{} is not a regular file".format(c["path"])
        with open(path, "rb") as f:
            raw = f.read()
        text = raw.decode("utf-8", "replace")
        if "sha256" in c and hashlib.sha256(raw).hexdigest() != c["sha256"]:
            return False, "{} content differs (sha256)".format(c["path"])
        if "equals" in c and text != c["equals"]:
            return False, "{} content differs: {!r}".format(c["path"], text[:200])
        if "lines" in c and text.splitlines() != c["lines"]:
            return False, "{} lines differ: {!r}".format(c["path"], text.splitlines()[:10])
        for needle in c.get("contains", []):
            if needle not in text:
                return False, "{} does not contain {!r}".format(c["path"], needle)
        for needle in c.get("not_contains", []):
            if needle in text:
                return False, "{} still contains {!r}".format(c["path"], needle)
        if "regex" in c and not re.search(c["regex"], text, re.M):
            return False, "{} does not match /{}/".format(c["path"], c["regex"])
    return True, "ok"


def check_tree(c):
    root = _path(c["path"])
    found = []
    for d, _, files in os.walk(root):
        for name in files:
            found.append(os.path.relpath(os.path.join(d, name), root))
    found.sort()
    return found == sorted(c["files"]), f"files: {found[:20]}"


def check_command(c):
    proc = subprocess.run(
        ["bash", "-c", c["run"]],
        cwd=WORKSPACE,
        input=c.get("stdin", "").encode(),
        capture_output=True,
        timeout=float(c.get("timeout", 20)),
    )
    out = proc.stdout.decode("utf-8", "replace")
    err = proc.stderr.decode("utf-8", "replace")
    detail = f"exit {proc.returncode}, stdout {out[:300]!r}, stderr {err[:200]!r}"
    if proc.returncode != c.get("exit_code", 0):
        return False, detail
    if "stdout_equals" in c and out.strip() != c["stdout_equals"].strip():
        return False, detail
    if any(s not in out for s in c.get("stdout_contains", [])):
        return False, detail
    if "stdout_regex" in c and not re.search(c["stdout_regex"], out, re.M):
        return False, detail
    return True, detail


_UNREACHABLE = set()  # ports that stayed closed for a whole wait: later checks do not wait again


def _deadline(port, c):
    return time.monotonic() + (0.0 if port in _UNREACHABLE else float(c.get("wait_s", 1)))


def check_http(c):
    port = urllib.parse.urlsplit(c["url"]).port or 80
    deadline = _deadline(port, c)
    last = "no attempt"
    while True:
        try:
            with urllib.request.urlopen(c["url"], timeout=3) as resp:
                status, body = resp.status, resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            status, body = exc.code, ""
        except OSError as exc:
            status, body, last = None, "", f"cannot connect: {exc}"
        if status is not None:
            detail = f"status {status}, body {body[:200]!r}"
            ok = status == c.get("status", 200)
            ok = ok and ("body_equals" not in c or body.strip() == c["body_equals"].strip())
            ok = ok and all(s in body for s in c.get("body_contains", []))
            return ok, detail
        if time.monotonic() > deadline:
            _UNREACHABLE.add(port)
            return False, last
        time.sleep(0.1)


def check_tcp(c):
    deadline = _deadline(int(c["port"]), c)
    while True:
        try:
            with socket.create_connection(("127.0.0.1", int(c["port"])), timeout=3) as s:
                s.sendall(c.get("send", "").encode())
                s.shutdown(socket.SHUT_WR)
                data = b""
                while len(data) < 65536:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            text = data.decode("utf-8", "replace")
            return c.get("expect_contains", "") in text, f"received {text[:200]!r}"
        except OSError as exc:
            if time.monotonic() > deadline:
                _UNREACHABLE.add(int(c["port"]))
                return False, "cannot connect to port {}: {}".format(c["port"], exc)
            time.sleep(0.1)


def cron_field(text, low, high):
    values = set()
    for part in text.lower().split(","):
        base, _, step = part.partition("/")
        step = int(step) if step else 1
        if base == "*":
            start, end = low, high
        elif "-" in base:
            a, b = base.split("-", 1)
            start, end = int(_NAMES.get(a, a)), int(_NAMES.get(b, b))
        else:
            start = int(_NAMES.get(base, base))
            end = high if step > 1 and "/" in part else start
        if not (low <= start <= high and low <= end <= high) or step < 1:
            raise ValueError(f"cron field {part!r} out of range {low}-{high}")
        values.update(range(start, end + 1, step))
    return frozenset(values)


def cron_schedule(expr):
    """The sets of minutes, hours, days, months and weekdays a schedule fires on (Sunday is 0 or 7)."""
    fields = _CRON_MACROS.get(expr.strip(), expr).split()
    if len(fields) != 5:
        raise ValueError(f"a schedule has 5 fields, got {expr!r}")
    sets = [cron_field(f, lo, hi) for f, (lo, hi) in zip(fields, _CRON_FIELDS, strict=False)]
    sets[4] = frozenset(0 if d == 7 else d for d in sets[4])
    return tuple(sets)


def check_cron(c):
    want = cron_schedule(c["schedule"])
    for line in _read(c["file"]).splitlines():
        line = line.strip()
        if not line or line.startswith("#") or re.match(r"^[A-Za-z_]+=", line):
            continue
        n = 1 if line.startswith("@") else 5
        parts = line.split(None, n)
        if len(parts) <= n:
            continue
        try:
            schedule = cron_schedule(" ".join(parts[:n]))
        except ValueError:
            continue
        command = parts[n]
        if schedule == want and c.get("command_contains", "") in command:
            if c.get("run"):
                proc = subprocess.run(
                    ["bash", "-c", command], cwd=WORKSPACE, timeout=20, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
                )
                return proc.returncode == 0, f"ran {command!r}: exit {proc.returncode}"
            return True, f"found {line!r}"
    return False, "no line in {} runs {!r} on schedule {!r}".format(
        c["file"], c.get("command_contains", ""), c["schedule"]
    )


def check_sqlite(c):
    path = _path(c["db"])
    if not os.path.isfile(path):
        return False, "{} does not exist".format(c["db"])
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = [list(r) for r in conn.execute(c["query"]).fetchall()]
    finally:
        conn.close()
    return rows == c["rows"], f"rows {rows[:10]!r}"


CHECKS = {
    "file": check_file,
    "tree": check_tree,
    "command": check_command,
    "http": check_http,
    "tcp": check_tcp,
    "cron": check_cron,
    "sqlite": check_sqlite,
}


def main():
    request = json.loads(sys.stdin.read())
    results = []
    for i, c in enumerate(request["checks"]):
        name = c.get("name") or "{}#{}".format(c["type"], i)
        try:
            ok, detail = CHECKS[c["type"]](c)
        except Exception as exc:  # a broken artefact fails its check, never the checker
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        results.append({"name": name, "ok": bool(ok), "detail": str(detail)[:500]})
    body = json.dumps(results)
    mac = hmac.new(request["nonce"].encode(), body.encode(), hashlib.sha256).hexdigest()
    sys.stdout.write(json.dumps({"body": body, "mac": mac}))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
