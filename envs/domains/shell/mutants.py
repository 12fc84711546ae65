"""Generated near misses of ShellOps tasks: the gold end state, made wrong the way a lazy policy would.

Each mutator reads the task's checks to find where a plausible wrong state
lives and yields nothing for tasks it does not apply to. Every mutant must fail
the task (``python -m envs.quality.validate`` plays them); one that passes names
a check that reads form instead of meaning.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from typing import Any

from envs.domains.shell.rules import cron_resets, keeps_services
from envs.quality.hooks import Mutant, bash, leave_running, register_mutator
from envs.tasks import Task

_START_COPY = "/tmp/.start"


def _checks(task: Task) -> list[dict[str, Any]]:
    return list(task.hidden.get("checks", []))


def _gold(task: Task) -> str:
    return bash(task.gold["script"])


CONSTANT_SERVER = """
import socket, threading
REPLY = {reply}
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {port}))
s.listen(16)
def serve(c):
    with c:
        c.recv(65536)
        c.sendall(REPLY)
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
"""


@register_mutator("constant_responder", domains=["shell"])
def constant_responder(env: Any, task: Task) -> Iterator[Mutant]:
    """A server on the task's TCP port that never parses its input and sends every expected reply at once."""
    by_port: dict[int, list[str]] = {}
    for c in _checks(task):
        if c["type"] == "tcp":
            by_port.setdefault(int(c["port"]), []).append(c.get("expect_equals", c.get("expect_contains", "")))
    for port, replies in sorted(by_port.items()):
        reply = "".join(dict.fromkeys(replies)).encode()
        yield Mutant(
            f"constant responder on {port}",
            "a fixed reply that contains every expected answer",
            tuple(leave_running(f"const{port}", CONSTANT_SERVER.format(reply=repr(reply), port=port))),
        )


@register_mutator("emptied_keep_names", domains=["shell"])
def emptied_keep_names(env: Any, task: Task) -> Iterator[Mutant]:
    """The gold, then every workspace file emptied under its name (a service task's state is its process: skipped)."""
    if keeps_services(task.id, task.metadata, _checks(task)):
        return
    empty = "find /workspace -type f -not -path '*/.git/*' -exec truncate -s 0 {} +"
    yield Mutant("files emptied, names kept", "the right names with no content", (_gold(task), bash(empty)))


@register_mutator("deletion_behind_symlink", domains=["shell"])
def deletion_behind_symlink(env: Any, task: Task) -> Iterator[Mutant]:
    """The gold, with what it removed kept reachable through a directory link inside each checked tree."""
    # a tree the checker resets before running the task's cron job loses the link with everything else
    resets = cron_resets(task.id, task.metadata, _checks(task))
    trees = [
        c["path"]
        for c in _checks(task)
        if c["type"] == "tree" and not any(c["path"] == r or c["path"].startswith(r + "/") for r in resets)
    ]
    if not trees:
        return
    keep = bash(f"cp -a /workspace {_START_COPY}")
    links = " && ".join(
        f"ln -s {shlex.quote(f'{_START_COPY}/{p}')} {shlex.quote(f'/workspace/{p}/.kept')}" for p in trees
    )
    yield Mutant("deletion behind a symlink", "what must be gone stays reachable", (keep, _gold(task), bash(links)))


@register_mutator("setting_in_other_section", domains=["shell"])
def setting_in_other_section(env: Any, task: Task) -> Iterator[Mutant]:
    """The expected INI settings appended to a section of their own, the real section left as it was."""
    for c in _checks(task):
        if c["type"] == "config" and c.get("format") == "ini":
            lines = "".join(f"{key.partition('.')[2]} = {json.dumps(v) if isinstance(v, bool) else v}\n"
                            for key, v in c["values"].items())  # fmt: skip
            text = "\n[elsewhere]\n" + lines.replace('"', "")
            path = shlex.quote(f"/workspace/{c['path']}")
            yield Mutant(
                f"settings of {c['path']} in another section",
                "the right lines in the wrong place",
                (bash(f"printf %s {shlex.quote(text)} >> {path}"),),
            )


@register_mutator("gold_plus_stray_change", domains=["shell"])
def gold_plus_stray_change(env: Any, task: Task) -> Iterator[Mutant]:
    """The gold, then one wrong edit to a file whose exact content a check names."""
    for c in _checks(task):
        if c["type"] == "file" and any(k in c for k in ("equals", "lines", "sha256")):
            path = shlex.quote(f"/workspace/{c['path']}")
            yield Mutant(
                f"gold plus a stray line in {c['path']}",
                "the task done, then one extra wrong change",
                (_gold(task), bash(f"echo stray >> {path}")),
            )
            return
