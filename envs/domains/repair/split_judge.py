"""Hidden tests in a judge process under its own uid, the repository under test behind a plain-data proxy.

:func:`run_hidden_tests` is how repository tasks are judged (``hidden_tests``).
After the agent has finished (and the caller has killed its processes and
cleaned the workspace, :func:`envs.domains.repair.workspace.restore_workspace`):

1. The hidden tests, a pytest.ini and the judge's code go into a fresh directory
   owned by the ``judge`` user, mode 0700: the sandbox user can neither list,
   read nor change it.
2. ``repo_server.py`` starts as the ``sandbox`` user, from a judge-owned
   directory it can read but not change, and waits on a unix socket. It
   imports the repository only when the judge asks.
3. ``repo_judge.py`` runs as ``judge``: pytest over the hidden tests, whose
   ``import`` of the repository's packages yields proxies
   (``repo_proxy.py``). Every call crosses the socket as plain data and comes
   back as plain data, a handle, or an exception; the tests' own assertions run
   here, on genuine builtin values, against expected values the repository's
   process never sees. pytest itself, its reports, the tests' code objects and
   the verdict are out of that process's reach: another uid, no ptrace, no
   access to the judge's ``/proc`` entries, files or stdout.
4. ``kill_all``; the host reads the judge's report from its stdout.

So the classic hacks have nothing to work on: a profile hook or patched
``TestReport`` patches the server, a frame walk finds no nonce, atexit hooks and
daemons die with ``kill_all`` and could not reach the judge anyway, objects that
equal anything arrive as handles that equal nothing, and the hidden tests (with
their ``pytest.raises`` blocks) are never visible to the code under test.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import secrets
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from envs.domains.repair.in_sandbox.plain_runner import plain_reason
from envs.in_sandbox import shared, source
from sandbox import SandboxFileError

IN_SANDBOX = Path(__file__).resolve().parent / "in_sandbox"
JUDGE_FILES = ("repo_judge.py", "repo_proxy.py", "repo_wire.py", "plain_data.py", "plain_runner.py")
SERVER_FILES = ("repo_server.py", "repo_wire.py", "plain_data.py")
PYTEST_INI = "[pytest]\naddopts =\npython_files = test_*.py *_test.py\n"
NOT_REPOSITORY = frozenset({"tests", "test", "conftest", "setup", "pytest", "_pytest", "pluggy"})


@dataclasses.dataclass(frozen=True)
class JudgeRun:
    """What the judge reported: per-test outcomes, or why there is no report."""

    outcomes: dict[str, str]
    collected: list[str]
    problems: list[str]
    collect_errors: list[str]
    link: str | None
    judge_tail: str = ""
    server_tail: str = ""


def programs(names: Sequence[str]) -> dict[str, str]:
    """File name -> source of the judge's or the server's programs (:data:`JUDGE_FILES`, :data:`SERVER_FILES`)."""
    return {
        name: shared(name[: -len(".py")]) if name == "plain_data.py" else source(IN_SANDBOX / name) for name in names
    }


def repository_modules(files: Iterable[str], protected: Sequence[str] = ("tests/*",)) -> list[str]:
    """Top-level packages and modules of a repository (its ``.py`` files), which the judge imports by proxy."""
    names = set()
    for path in files:
        if not path.endswith(".py") or any(fnmatch.fnmatch(path, p) for p in protected):
            continue
        head = path.split("/")[0]
        names.add(head[: -len(".py")] if head == path else head)
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    return sorted(n for n in names if n.isidentifier() and n not in NOT_REPOSITORY and n not in stdlib)


def run_hidden_tests(
    sandbox: Any,
    tests: Mapping[str, str],
    *,
    modules: Sequence[str],
    import_roots: Sequence[str] = ("/workspace",),
    workspace: str = "/workspace",
    timeout_s: float = 120.0,
    test_timeout_s: float = 30.0,
) -> JudgeRun:
    """Runs ``tests`` (path under ``tests/`` -> source) against the repository in ``workspace``; see the module doc.

    What the agent left can make the run fail (a full disk or memory), never make it an anomaly:
    only :class:`sandbox.SandboxInfraError` escapes.
    """
    sandbox.kill_all()
    # The agent's scratch files in /tmp and /dev/shm are not the repository; they would only crowd the
    # judge (a disk the agent filled must still have room for it).
    scratch = ["find", "/tmp", "/dev/shm", "-mindepth", "1", "-maxdepth", "1", "-user", "sandbox"]
    sandbox.exec([*scratch, "-exec", "rm", "-rf", "{}", "+"], timeout=60)
    tag = secrets.token_hex(8)
    judge, serve, link = (f"/tmp/.agentrl-{kind}-{tag}" for kind in ("judge", "serve", "link"))
    problem = _stage(sandbox, tests, judge, serve, link, workspace, import_roots)
    result = None
    if problem is None:
        config = {"root": judge, "socket": f"{link}/sock", "modules": list(modules), "test_timeout_s": test_timeout_s}
        config["runner"] = "pytest" if plain_reason(tests) else "plain"  # pytest's verdict either way
        result = sandbox.exec(
            ["python3", "-I", "-B", f"{judge}/repo_judge.py"],
            user="judge",
            stdin=json.dumps(config),
            cwd=judge,
            env={"HOME": judge, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"},
            timeout=timeout_s,
        )
    sandbox.kill_all()
    server_tail = _tail(sandbox, f"{link}/log")
    sandbox.exec(["rm", "-rf", judge, serve], user="judge", timeout=30)
    sandbox.exec(["rm", "-rf", link], timeout=30)
    if result is None:
        return JudgeRun({}, [], [problem], [], None, "", server_tail)
    return _read_report(result, timeout_s, server_tail)


def _stage(
    sandbox: Any, tests: Mapping[str, str], judge: str, serve: str, link: str, workspace: str, roots: Sequence[str]
) -> str | None:
    """Writes and seals the judge's directory, then starts the repository server; why not, if it could not."""
    files = {f"{judge}/tests/{path}": source for path, source in tests.items()}
    files[f"{judge}/pytest.ini"] = PYTEST_INI
    files.update({f"{judge}/{name}": text for name, text in programs(JUDGE_FILES).items()})
    try:
        sandbox.write_files(files, mode=0o600, user="judge")
        sealed = sandbox.exec(["chmod", "-R", "go-rwx", judge], user="judge", timeout=30)
        if not sealed.ok:
            return f"could not seal the judge's directory: {sealed.stderr_text[-300:]}"
        sandbox.write_files({f"{serve}/{name}": text for name, text in programs(SERVER_FILES).items()}, user="judge")
    except SandboxFileError as exc:
        return f"no room for the judge in the sandbox: {exc}"
    # The server starts in the background: the judge, started next, waits for its socket meanwhile.
    start = (
        f"mkdir -m 755 {link} && cd {workspace} && "
        f"{{ setsid python3 -I -B {serve}/repo_server.py {link}/sock {' '.join(roots)} >{link}/log 2>&1 </dev/null & }}"
    )
    started = sandbox.exec(["bash", "-c", start], timeout=30)
    if not started.ok:
        return f"the repository server did not start (exit {started.exit_code}): {started.stderr_text[-300:]}"
    return None


def _tail(sandbox: Any, path: str) -> str:
    try:
        return sandbox.read_file(path, max_bytes=1 << 20).decode("utf-8", "replace")[-1500:]
    except SandboxFileError:
        return ""


def _read_report(result: Any, timeout_s: float, server_tail: str) -> JudgeRun:
    judge_tail = result.stderr_text[-1500:]
    report = None
    lines = result.stdout_text.strip().splitlines()
    if lines:
        try:
            report = json.loads(lines[-1])
        except ValueError:
            report = None
    if result.timed_out:
        problem = f"the hidden tests did not finish within {timeout_s:g} s"
    elif not isinstance(report, dict):
        problem = f"the judge ended without a report (exit {result.exit_code}, oom {result.oom_killed})"
    else:
        problem = None
    if problem:
        return JudgeRun({}, [], [problem], [], None, judge_tail, server_tail)
    return JudgeRun(
        outcomes={str(k): str(v) for k, v in report["outcomes"].items()},
        collected=[str(c) for c in report["collected"]],
        problems=[],
        collect_errors=[str(e) for e in report["collect_errors"]],
        link=report.get("link"),
        judge_tail=judge_tail,
        server_tail=server_tail,
    )
