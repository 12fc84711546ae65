"""The Sandbox API, identical on both backends."""

import pytest

from sandbox import SandboxClosed, SandboxFileError, SandboxSpec, SandboxUsageError


def test_exec_captures_exit_code_and_streams(sandbox):
    r = sandbox.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
    assert not r.timed_out and not r.truncated and not r.oom_killed
    assert r.duration_s > 0


def test_argv_list_is_not_shell_parsed(sandbox):
    r = sandbox.exec(["python3", "-c", "import sys; print(sys.argv[1:])", "$HOME", "a b"])
    assert r.stdout_text.strip() == "['$HOME', 'a b']"


def test_missing_program_is_127_like_a_shell(sandbox):
    r = sandbox.exec(["no-such-program"])
    assert r.exit_code == 127
    assert b"no-such-program" in r.stderr


def test_env_cwd_stdin(sandbox):
    sandbox.exec("mkdir -p sub")
    r = sandbox.exec("echo $FOO; pwd; cat", env={"FOO": "bar"}, cwd="sub", stdin="piped\n")
    assert r.stdout_text.splitlines() == ["bar", "/workspace/sub", "piped"]


def test_environment_is_minimal_and_does_not_persist(sandbox):
    r = sandbox.exec("export LEAK=1; env | sort")
    names = {line.split("=", 1)[0] for line in r.stdout_text.splitlines()}
    assert {"PATH", "HOME", "LANG"} <= names
    assert not any(n.startswith(("DOCKER", "XLA", "JAX", "PYTHONPATH")) for n in names)
    assert sandbox.exec("echo ${LEAK:-unset}").stdout_text.strip() == "unset"


def test_spec_env_reaches_commands(backend):
    with backend.create(SandboxSpec(env={"TASK_ID": "t-7"})) as sb:
        assert sb.exec("echo $TASK_ID").stdout_text.strip() == "t-7"


def test_large_stdin_round_trips(sandbox):
    data = bytes(range(256)) * 40_000  # ~10 MB, every byte value
    r = sandbox.exec("sha256sum", stdin=data)
    import hashlib

    assert r.stdout_text.split()[0] == hashlib.sha256(data).hexdigest()


def test_write_and_read_files(sandbox):
    sandbox.write_files({"pkg/mod.py": "X = 41\n", "/tmp/data.bin": b"\x00\xff", "run.sh": "echo hi"})
    assert sandbox.read_file("pkg/mod.py") == b"X = 41\n"
    assert sandbox.read_file("/tmp/data.bin") == b"\x00\xff"
    assert sandbox.exec("python3 -c 'import pkg.mod as m; print(m.X + 1)'").stdout_text.strip() == "42"
    with pytest.raises(SandboxFileError, match="nope"):
        sandbox.read_file("nope.txt")
    with pytest.raises(SandboxFileError, match="max_bytes"):
        sandbox.read_file("pkg/mod.py", max_bytes=3)


def test_writing_outside_writable_dirs_fails(sandbox):
    with pytest.raises(SandboxFileError, match="/usr/evil"):
        sandbox.write_files({"/usr/evil": "x"})
    # A `touch` as uid 1000 fails on any host; the mount's own read-only flag is what protects /etc
    # from the agent too. Control: the probe reports a writable mount (/tmp) as writable.
    ro = "import os, sys; print(*[bool(os.statvfs(p).f_flag & os.ST_RDONLY) for p in sys.argv[1:]])"
    assert sandbox.exec(["python3", "-c", ro, "/etc", "/usr", "/", "/tmp"]).stdout_text.split() == [
        "True",
        "True",
        "True",
        "False",
    ]


def test_snapshot_restore_puts_files_back_and_kills_processes(sandbox):
    sandbox.write_files({"keep.txt": "v1"})
    snap = sandbox.snapshot()
    assert snap.size_bytes > 0
    sandbox.exec("echo v2 > keep.txt; touch new.txt /tmp/t; (sleep 300 &) ; sleep 300 & true")
    assert sandbox.ping()["processes"] >= 1
    sandbox.restore(snap)
    assert sandbox.read_file("keep.txt") == b"v1"
    assert sandbox.exec("ls -A /workspace /tmp").stdout_text.split() == ["/tmp:", "/workspace:", "keep.txt"]
    assert sandbox.ping()["processes"] == 0


def test_background_service_survives_between_execs(sandbox):
    """A service started by one command answers the next (shell tasks rely on this)."""
    sandbox.write_files({"www/index.html": "hello from loopback"})
    sandbox.exec("cd www && nohup python3 -m http.server 8000 >/tmp/http.log 2>&1 &")
    r = sandbox.exec(
        "for i in $(seq 50); do curl -s http://127.0.0.1:8000/index.html && exit 0; sleep 0.1; done; exit 1",
        timeout=15,
    )
    assert r.stdout_text == "hello from loopback"


def test_closed_sandbox_refuses_calls(backend):
    sb = backend.create(SandboxSpec())
    sb.close()
    sb.close()  # idempotent
    assert sb.closed and not sb.healthy
    with pytest.raises(SandboxClosed):
        sb.exec("true")


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda sb: sb.exec(""), None),
        (lambda sb: sb.exec("x" * (2 << 20)), "cmd"),
        (lambda sb: sb.exec("echo \0"), "NUL"),
        (lambda sb: sb.exec([]), "cmd"),
        (lambda sb: sb.exec(["echo", 3]), "str"),
        (lambda sb: sb.exec(b"echo"), "cmd"),
        (lambda sb: sb.exec("true", timeout=-1), "timeout"),
        (lambda sb: sb.exec("true", timeout=float("nan")), "timeout"),
        (lambda sb: sb.exec("true", timeout="3"), "timeout"),
        (lambda sb: sb.exec("true", env={"A": None}), "env"),
        (lambda sb: sb.exec("true", cwd="\0"), "cwd"),
        (lambda sb: sb.exec("true", cwd="does/not/exist"), "cwd"),
        (lambda sb: sb.exec("true", stdin=3), "stdin"),
        (lambda sb: sb.exec(["echo", "y" * 200_000]), "E2BIG"),
        (lambda sb: sb.write_files(["a"]), "mapping"),
        (lambda sb: sb.write_files({"": "x"}), "path"),
        (lambda sb: sb.write_files({"a": 5}), "bytes or str"),
        (lambda sb: sb.read_file("a", max_bytes=-1), "max_bytes"),
        (lambda sb: sb.restore("snapshot"), "Snapshot"),
    ],
)
def test_malformed_api_arguments(sandbox, call, needle):
    if needle is None:  # an empty script is valid and does nothing
        assert call(sandbox).exit_code == 0
        return
    with pytest.raises(SandboxUsageError, match=needle):
        call(sandbox)
    assert sandbox.exec("echo alive").stdout == b"alive\n"
