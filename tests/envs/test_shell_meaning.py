"""ShellOps end states that look right but are not, through ``gym.make("agentrl/ShellOps-v0")``, on both backends.

One test per class of issue 22's list. Each plays its own attack as tool calls
and ``submit``, asserts it gets no reward and names the check that caught it,
and plays the task's gold as the control that the same checks pass.
"""

from __future__ import annotations

import pytest

from envs.domains.shell.rules import judge
from envs.domains.shell.selfcheck import gold
from envs.quality.hooks import SUBMIT, bash, leave_running
from envs.quality.near_misses import task_mutants
from envs.quality.validate import play
from tests.envs.conftest import make_env

CONSTANT_RESPONDER = """
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7000))
s.listen(16)
while True:
    c, _ = s.accept()
    c.recv(4096)
    c.sendall(b"PONG\\nPONG\\nERR\\n")
    c.close()
"""

STAND_IN = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"Hello from agentrl (debug=off)\\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", 9090), H).serve_forever()
"""


def _failed(pool, task_id: str, actions) -> set[str]:
    """The names of the checks that fail after ``actions``; the task's gold must pass in the same env."""
    env = make_env("agentrl/ShellOps-v0", pool)
    try:
        task = env.tasks.get(task_id)
        control = play(env, task, (gold(task_id), SUBMIT))
        assert control["anomaly"] is None and control["reward"] == 1.0, control["details"]
        verification = play(env, task, (*actions, SUBMIT))
    finally:
        env.close()
    assert verification["anomaly"] is None, verification["anomaly"]
    checks = verification["details"]["outcome"]["details"]["checks"]
    failed = {c["name"] for c in checks if not c["ok"]}
    # all or nothing: the one catching check takes the whole reward
    assert not verification["passed"] and verification["reward"] == 0.0 and failed, verification["details"]
    return failed


def test_a_fixed_reply_tcp_server_fails(pool):
    failed = _failed(pool, "shell/ping-service", leave_running("constant", CONSTANT_RESPONDER))
    assert {"answers PING", "answers other lines"} <= failed


def test_a_stand_in_http_server_with_the_config_untouched_fails(pool):
    failed = _failed(pool, "shell/configure-app", leave_running("standin", STAND_IN))
    assert failed == {"configured", "app answers on 9090"}


def test_a_stand_in_http_server_with_the_config_right_fails(pool):
    configure = "cd /workspace/app && sed -i -e 's/^port = .*/port = 9090/' -e 's/^debug = .*/debug = false/' app.ini"
    failed = _failed(pool, "shell/configure-app", [bash(configure), *leave_running("standin", STAND_IN)])
    assert failed == {"app answers on 9090"}  # it cannot answer a path it never saw as the app does


def test_a_setting_in_another_section_or_one_left_unchecked_fails(pool):
    other_section = "cd /workspace/app && printf 'port = 9090\\ndebug = false\\n' >> app.ini"
    assert "configured" in _failed(pool, "shell/configure-app", [bash(other_section), *leave_running("s", STAND_IN)])
    # the server section right, but a setting the task said to keep is gone
    dropped = "cd /workspace/app && printf '[server]\\nport = 9090\\ndebug = off\\n' > app.ini"
    assert "configured" in _failed(pool, "shell/configure-app", [bash(dropped), *leave_running("s", STAND_IN)])


def test_constraints_written_in_a_sql_comment_fail(pool):
    script = (
        'cd /workspace && sqlite3 app.db "CREATE TABLE users(id INTEGER, name TEXT, email TEXT'
        ' -- PRIMARY KEY UNIQUE NOT NULL\n);" && sqlite3 app.db -cmd ".mode csv" ".import --skip 1 users.csv users"'
        " && sqlite3 app.db 'UPDATE users SET id = CAST(id AS INTEGER)'"
    )
    failed = _failed(pool, "shell/csv-to-sqlite", [bash(script)])
    assert {"columns", "email unique", "constraints hold"} <= failed
    assert "rows imported" not in failed  # the data is right: only the schema's meaning catches it


def test_an_archive_of_empty_members_fails(pool):
    script = (
        "t=$(mktemp -d) && mkdir -p $t/src /workspace/dist && : > $t/src/main.py && : > $t/src/util.py"
        " && tar czf /workspace/dist/app-1.0.tar.gz -C $t src && cd /workspace/dist"
        " && sha256sum app-1.0.tar.gz > SHA256SUMS"
    )
    assert _failed(pool, "shell/release-checksums", [bash(script)]) == {"tarball content"}


def test_a_directory_symlink_keeping_old_files_reachable_fails(pool):
    script = (
        "cd /workspace && mkdir -p .attic && find tmpdata -type f -mtime +7 -exec mv {} .attic/ \\;"
        " && ln -s ../.attic tmpdata/sub/.keep"
    )
    assert _failed(pool, "shell/purge-old-files", [bash(script)]) == {"only recent files left"}


def test_git_stat_trust_config_cannot_hide_a_modification(pool):
    # same size, same mtime: with ctime untrusted and minimal stat checks, git's own status calls it clean
    script = (
        "cd /workspace/project && git config core.trustctime false && git config core.checkStat minimal"
        " && cp -p app.py /tmp/orig && printf \"print('APP')\\n\" > app.py && touch -r /tmp/orig app.py"
        ' && test -z "$(git status --porcelain)"'
    )
    failed = _failed(pool, "shell/git-initial-import", [gold("shell/git-initial-import"), bash(script)])
    assert failed == {"clean tree"}


def test_every_authored_and_generated_mutant_of_every_shell_task_fails(pool):
    env = make_env("agentrl/ShellOps-v0", pool)
    survivors, played = [], 0
    try:
        for task in env.tasks:
            mutants, problems = task_mutants(env, task)
            assert not problems and sum(m.name.startswith("near miss") for m in mutants) >= 3, (task.id, problems)
            for mutant in mutants:
                verification = play(env, task, (*mutant.actions, SUBMIT))
                played += 1
                if verification["reward"] > 0 or verification["passed"] or verification["anomaly"]:
                    survivors.append((task.id, mutant.name, verification["reward"], verification["anomaly"]))
    finally:
        env.close()
    assert played >= 4 * len(env.tasks) and not survivors, survivors


@pytest.mark.parametrize(
    ("fmt", "text", "ok"),
    [
        ("ini", "[server]\nport = 9090\ndebug = off\n[app]\ngreeting = hi\n", True),
        ("ini", "[server]\nport = 8000\ndebug = off\n[app]\ngreeting = hi\nport = 9090\n", False),
        ("ini", "[server]\nport = 9090\nport = 9091\ndebug = no\n[app]\ngreeting = hi\n", False),  # duplicate key
        ("ini", "[server]\nport = 9090\n[app]\ngreeting = hi\n", False),  # debug left unset
        ("json", '{"server": {"port": 9090, "debug": false}, "app": {"greeting": "hi"}}', True),
        ("json", '{"server": {"port": "9090", "debug": false}, "app": {"greeting": "hi"}}', False),  # a string
        ("yaml", "server: {port: 9090, debug: false}\napp: {greeting: hi}\n# port: 9090\n", True),
        ("toml", 'app.greeting = "hi"\n[server]\nport = 9090\ndebug = false\n', True),
        ("toml", '[server]\nport = 9090\ndebug = false\n[other]\ngreeting = "hi"\n', False),
    ],
)
def test_config_values_are_compared_at_their_keys(fmt, text, ok):
    check = {"type": "config", "path": "c", "format": fmt, "values": {"server.port": 9090, "server.debug": False}}
    check["values"]["app.greeting"] = "hi"
    assert judge(check, {"text": text})[0] is ok
