"""What a state check means, and its verdict, decided on the host from what the sandbox showed.

A check (``task.hidden["checks"]``) says *what* must be true, not how to test it:

* ``file``: ``path`` with ``exists``, ``kind`` (file|dir|symlink; ``file`` is a
  regular file), ``mode`` (octal string, permission bits), ``executable``,
  ``equals``, ``lines``, ``contains``/``not_contains`` (lists), ``regex``,
  ``link_target``, ``sha256``.
* ``tree``: the sorted relative paths of the files under ``path`` equal ``files``,
  and none of them is a symlink (to a file or a directory), a hardlink or a
  special file: each could keep reachable what the task says must be gone.
* ``command``: ``run`` (bash, in /workspace, as the judge) with ``exit_code``,
  ``stdout_equals``, ``stdout_contains``, ``stdout_regex``. The command may read
  the agent's files but must never execute them (git is safe: see
  ``envs/in_sandbox/git_env.py``). It sees them as another user would: a
  command expected to succeed fails its check if it was denied anything
  ("Permission denied" on stderr), since a directory it could not open may
  hide what it looks for.
* ``http``: GET ``url`` (loopback) with ``status``, ``body_equals``,
  ``body_contains``; ``{nonce}`` in the request or expected answer of an
  http/tcp check is a fresh random value each verification; retried for ``wait_s`` (default 1) while the service starts.
* ``tcp``: connect to ``port``, send ``send``, expect ``expect_contains``.
* ``cron``: the crontab ``file`` has a line whose schedule means the same as
  ``schedule`` (``*/15`` equals ``0,15,30,45``) and whose command contains
  ``command_contains``; with ``run: true`` the command is then run, as the
  agent's user, and must exit 0 (later checks see what it did).
* ``sqlite``: ``query`` on database ``db`` returns ``rows``. A schema is checked
  through ``pragma_table_info``/``pragma_index_list``, never by text of its SQL.
* ``config``: ``path`` parsed as ``format`` on the host, ``values`` compared at
  their keys (:mod:`envs.domains.shell.structured`).

A ``tcp`` check may say ``expect_equals`` (the whole reply): a constant
responder passes ``expect_contains`` checks whose texts it simply concatenates.

``http``/``tcp`` checks need the agent's processes alive, so a task that has
them declares ``metadata.keep_services: true`` (:func:`keeps_services`); every
other task's processes are killed before anything is looked at. A task whose
``cron`` check runs the job lists in ``metadata.reset_before_cron`` the
workspace paths the job works on (:func:`cron_resets`): they are put back as
the task made them (removed, then ``task.files`` under them written again;
``metadata.setup`` is not rerun) just before the job runs, so later checks see
what the job did, not what the agent did by hand next to a job that does nothing.

:func:`request_for` turns a check into what the in-sandbox checker is asked to
look at, which carries no expected value; :func:`judge` compares its answer
with the check. Regexes of a check run here over text the agent controls, so
a task author must write ones that cannot backtrack catastrophically.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from envs.domains.shell.structured import judge_config, validate_config_check
from envs.tasks import check_relative_path

CHECK_TYPES = ("file", "tree", "command", "http", "tcp", "cron", "sqlite", "config")
NETWORK_TYPES = ("http", "tcp")
TEXT_KEYS = ("equals", "lines", "contains", "not_contains", "regex", "sha256")
Verdict = tuple[bool, str]


def validate_checks(checks: Any, where: str) -> None:
    """Raises ValueError naming ``where`` unless ``checks`` is a non-empty list of known, uniquely named checks."""
    if not isinstance(checks, list) or not checks:
        raise ValueError(f"{where}: expected a non-empty list of checks")
    names = set()
    for i, check in enumerate(checks):
        if not isinstance(check, Mapping) or check.get("type") not in CHECK_TYPES:
            raise ValueError(f"{where}[{i}].type: expected one of {CHECK_TYPES}, got {check!r:.80}")
        if check["type"] == "config":
            validate_config_check(check, f"{where}[{i}]")
        name = check_name(check, i)
        if name in names:
            raise ValueError(f"{where}[{i}].name: {name!r} is used twice")
        names.add(name)


def check_name(check: Mapping[str, Any], index: int) -> str:
    """The name a check reports under."""
    return check.get("name") or f"{check['type']}#{index}"


def keeps_services(task_id: str, metadata: Mapping[str, Any], checks: Sequence[Mapping[str, Any]] | None) -> bool:
    """``metadata.keep_services``, validated against the checks: set exactly when a check needs a live service."""
    value = metadata.get("keep_services", False)
    if not isinstance(value, bool):
        raise ValueError(f"task {task_id!r} metadata.keep_services: expected true or false, got {value!r:.60}")
    if not isinstance(checks, list):
        return value
    network = [
        check_name(c, i) for i, c in enumerate(checks) if isinstance(c, Mapping) and c.get("type") in NETWORK_TYPES
    ]
    if value and not network:
        raise ValueError(f"task {task_id!r} metadata.keep_services: true, but no http/tcp check needs a live service")
    if network and not value:
        raise ValueError(
            f"task {task_id!r} metadata.keep_services: checks {network} probe services, so the task must declare "
            "keep_services: true (otherwise every process of the agent is killed before the checks)"
        )
    return value


def cron_resets(task_id: str, metadata: Mapping[str, Any], checks: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """``metadata.reset_before_cron``, validated: workspace-relative paths, only on tasks that run a cron job."""
    value = metadata.get("reset_before_cron", [])
    where = f"task {task_id!r} metadata.reset_before_cron"
    if not isinstance(value, list) or not all(check_relative_path(p) for p in value):
        raise ValueError(f"{where}: expected a list of normalised workspace-relative paths, got {value!r:.80}")
    runs = isinstance(checks, list) and any(
        isinstance(c, Mapping) and c.get("type") == "cron" and c.get("run") for c in checks
    )
    if value and not runs:
        raise ValueError(f"{where}: set, but no cron check has run: true")
    return list(value)


def mode_of(check: Mapping[str, Any]) -> str:
    """Which checker mode observes ``check``: ``network``, ``commands`` or ``observe``."""
    kind = check["type"]
    return "network" if kind in NETWORK_TYPES else "commands" if kind == "command" else "observe"


NONCE = "{nonce}"
_NONCE_KEYS = ("url", "send", "body_equals", "body_contains", "expect_equals", "expect_contains")


def with_nonce(check: Mapping[str, Any], nonce: str) -> Mapping[str, Any]:
    """``check`` with ``{nonce}`` in its request and expected answer replaced by ``nonce`` (fresh per verification).

    A service check whose request carries a value no one saw before can only be answered by a
    program that computes its answer, so a stand-in that replays the expected bytes fails.
    """
    if check["type"] not in NETWORK_TYPES:
        return check

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(NONCE, nonce)
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    return {k: fill(v) if k in _NONCE_KEYS else v for k, v in check.items()}


def request_for(check: Mapping[str, Any]) -> dict[str, Any]:
    """What the in-sandbox checker must look at for ``check``: where, never what to expect."""
    kind = check["type"]
    if kind == "file":
        return {"op": "file", "path": check["path"], "content": any(k in check for k in TEXT_KEYS)}
    if kind == "tree":
        return {"op": "tree", "path": check["path"]}
    if kind == "sqlite":
        return {"op": "sqlite", "db": check["db"], "query": check["query"]}
    if kind == "cron":
        return {"op": "text", "path": check["file"]}
    if kind == "config":
        return {"op": "text", "path": check["path"]}
    if kind == "command":
        return {"run": check["run"], "stdin": check.get("stdin", ""), "timeout": float(check.get("timeout", 20))}
    if kind == "http":
        return {"op": "http", "url": check["url"], "wait_s": float(check.get("wait_s", 1))}
    return {
        "op": "tcp",
        "port": int(check["port"]),
        "send": check.get("send", ""),
        "wait_s": float(check.get("wait_s", 1)),
    }


def judge_file(c: Mapping[str, Any], obs: Mapping[str, Any]) -> Verdict:
    path = c["path"]
    exists = bool(obs.get("exists"))
    if not c.get("exists", True):
        return not exists, "exists" if exists else "absent"
    if not exists:
        return False, f"{path} does not exist"
    kind = obs.get("kind")
    if "kind" in c and c["kind"] != kind:
        return False, f"{path} is a {kind}, expected a {c['kind']}"
    if "link_target" in c and (kind != "symlink" or str(obs.get("link")).rstrip("/") != c["link_target"].rstrip("/")):
        return False, f"{path} does not link to {c['link_target']}"
    if ("mode" in c or "executable" in c) and "mode" not in obs:
        return False, f"{path}: {obs.get('stat_error', 'no mode observed')}"
    if "mode" in c and obs["mode"] != int(c["mode"], 8):
        return False, f"{path} has mode {obs['mode']:o}, expected {c['mode']}"
    if "executable" in c and bool(obs["mode"] & 0o111) != c["executable"]:
        return False, f"{path} executable bit is {not c['executable']}"
    if not any(k in c for k in TEXT_KEYS):
        return True, "ok"
    if "read_error" in obs or "text" not in obs:
        return False, f"{path}: {obs.get('read_error', 'content not observed')}"
    text = obs["text"]
    if "sha256" in c and obs.get("sha256") != c["sha256"]:
        return False, f"{path} content differs (sha256)"
    if obs.get("truncated") and any(k in c for k in TEXT_KEYS if k != "sha256"):
        return False, f"{path} is too large ({obs.get('size')} bytes) to compare as text"
    if "equals" in c and text != c["equals"]:
        return False, f"{path} content differs: {text[:200]!r}"
    if "lines" in c and text.splitlines() != c["lines"]:
        return False, f"{path} lines differ: {text.splitlines()[:10]!r}"
    for needle in c.get("contains", []):
        if needle not in text:
            return False, f"{path} does not contain {needle!r}"
    for needle in c.get("not_contains", []):
        if needle in text:
            return False, f"{path} still contains {needle!r}"
    if "regex" in c and not re.search(c["regex"], text, re.M):
        return False, f"{path} does not match /{c['regex']}/"
    return True, "ok"


def judge_command(c: Mapping[str, Any], obs: Mapping[str, Any]) -> Verdict:
    out, err = str(obs.get("stdout", "")), str(obs.get("stderr", ""))
    detail = f"exit {obs.get('exit_code')}, stdout {out[:300]!r}, stderr {err[:200]!r}"
    if obs.get("timed_out"):
        return False, f"timed out after {c.get('timeout', 20)}s; {detail}"
    if obs.get("exit_code") != c.get("exit_code", 0):
        return False, detail
    if c.get("exit_code", 0) == 0 and "Permission denied" in err:
        # e.g. git status skips a directory it cannot open and still exits 0: what it saw is incomplete
        return False, f"the command was denied part of what it reads; {detail}"
    if "stdout_equals" in c and out.strip() != c["stdout_equals"].strip():
        return False, detail
    if any(s not in out for s in c.get("stdout_contains", [])):
        return False, detail
    if "stdout_regex" in c and not re.search(c["stdout_regex"], out, re.M):
        return False, detail
    return True, detail


def judge_http(c: Mapping[str, Any], obs: Mapping[str, Any]) -> Verdict:
    status, body = obs.get("status"), str(obs.get("body", ""))
    ok = status == c.get("status", 200)
    ok = ok and ("body_equals" not in c or body.strip() == c["body_equals"].strip())
    ok = ok and all(s in body for s in c.get("body_contains", []))
    return ok, f"status {status}, body {body[:200]!r}"


def judge_tcp(c: Mapping[str, Any], obs: Mapping[str, Any]) -> Verdict:
    text = str(obs.get("received", ""))
    ok = c.get("expect_contains", "") in text and ("expect_equals" not in c or text == c["expect_equals"])
    return ok, f"received {text[:200]!r}"


def judge_tree(c: Mapping[str, Any], obs: Mapping[str, Any]) -> Verdict:
    found, links = list(obs.get("files", [])), list(obs.get("links", []))
    if links:
        return False, f"links or special files reach beyond the tree: {links[:10]}"
    return found == sorted(c["files"]), f"files: {found[:20]}"


def judge_sqlite(c: Mapping[str, Any], obs: Mapping[str, Any]) -> Verdict:
    if not obs.get("exists"):
        return False, f"{c['db']} does not exist (or is not a regular file)"
    rows = obs.get("rows")
    return rows == c["rows"], f"rows {rows[:10]!r}"


# -- cron -----------------------------------------------------------------------------------
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
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_NAMES = {n: i for i, n in enumerate(_MONTHS, 1)} | {
    n: i for i, n in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])
}


def cron_field(text: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.lower().split(","):
        base, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
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


def cron_schedule(expr: str) -> tuple[frozenset[int], ...]:
    """The sets of minutes, hours, days, months and weekdays a schedule fires on (Sunday is 0 or 7)."""
    fields = _CRON_MACROS.get(expr.strip(), expr).split()
    if len(fields) != 5:
        raise ValueError(f"a schedule has 5 fields, got {expr!r}")
    sets = [cron_field(f, lo, hi) for f, (lo, hi) in zip(fields, _CRON_FIELDS, strict=True)]
    sets[4] = frozenset(0 if d == 7 else d for d in sets[4])
    return tuple(sets)


def find_cron(c: Mapping[str, Any], obs: Mapping[str, Any]) -> tuple[str | None, str]:
    """(the command of the first crontab line that matches ``c``, or None; detail)."""
    if "text" not in obs:
        return None, f"{c['file']}: {obs.get('error', 'not observed')}"
    want = cron_schedule(c["schedule"])
    for raw in str(obs["text"]).splitlines():
        line = raw.strip()
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
        if schedule == want and c.get("command_contains", "") in parts[n]:
            return parts[n], f"found {line[:200]!r}"
    return None, f"no line in {c['file']} runs {c.get('command_contains', '')!r} on schedule {c['schedule']!r}"


JUDGES = {
    "file": judge_file,
    "tree": judge_tree,
    "command": judge_command,
    "http": judge_http,
    "tcp": judge_tcp,
    "sqlite": judge_sqlite,
    "config": judge_config,
}


def judge(check: Mapping[str, Any], obs: Mapping[str, Any]) -> Verdict:
    """The verdict on ``check`` from the checker's observation (an observed error fails it)."""
    if "error" in obs:
        return False, str(obs["error"])[:500]
    if check["type"] == "cron":
        command, detail = find_cron(check, obs)
        return command is not None, detail
    return JUDGES[check["type"]](check, obs)
