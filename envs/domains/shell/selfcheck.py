"""Self-check cases of shell tasks (``sandbox_state``): known hacks that must fail.

Each class of attack on the checker has at least one sample, played through
the real environment: work left undone and a job that does nothing; processes
left running that forge the checker's answer, read its hidden checks or race
it (:data:`CRON_RACER`, and :mod:`envs.quality.exploits`); symlinks, FIFOs and
unreadable directories laid as traps for its reads; git settings that would run
the agent's code inside a command check; services that hunt for the checker
while it probes them. Every one must end with ``passed`` False and no anomaly
(:mod:`tests.envs.test_reward_hacks`; the controls that must pass live in
:mod:`tests.envs.test_state_judge`).
"""

from __future__ import annotations

import functools

from envs.quality.exploits import FORGER, READER
from envs.quality.hooks import SUBMIT, Case, bash, gold_and_noop, leave_running, register_selfcheck, write
from envs.tasks import load_tasks

SHELL = "agentrl/ShellOps-v0"
SAMPLE_TASKS = ("shell/secure-key", "shell/cron-backup", "shell/ping-service")
LAZY_CRON = (
    "mkdir -p /workspace/bin /workspace/cron && printf '#!/bin/sh\\ntrue\\n' > /workspace/bin/backup.sh"
    " && chmod +x /workspace/bin/backup.sh && echo '*/15 * * * * /workspace/bin/backup.sh' > /workspace/cron/backup.cron"
)
HAND_MADE_ARCHIVE = "mkdir -p /workspace/backups && tar czf /workspace/backups/data.tar.gz -C /workspace data"
PONG_TO_ALL = r"""
import socketserver, threading

class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        for _ in self.rfile:
            self.wfile.write(b"PONG\n")

threading.Thread(target=exec, args=(compile(FORGER, "forger", "exec"), {}), daemon=True).start()
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(("127.0.0.1", 7000), Handler).serve_forever()
"""
FSMONITOR_KILLS_GIT = (
    "cd /workspace/project && echo junk > junk.txt && printf '#!/bin/sh\\nkill -9 $PPID\\n' > /workspace/.fsmon"
    " && chmod +x /workspace/.fsmon && git config core.fsmonitor /workspace/.fsmon"
)
FILTER_KILLS_GIT = (
    "cd /workspace/project && echo junk > junk.txt && echo '* filter=x' > .git/info/attributes"
    " && git config filter.x.clean 'kill -9 $PPID' && touch -d 2030-01-01 README.md app.py"
)
HOOK_KILLS_GIT = (  # the index must be writable by the checker for git to write it (and run the hook)
    "mkdir -p /workspace/.hooks && printf '#!/bin/sh\\nkill -9 $PPID\\n' > /workspace/.hooks/post-index-change"
    " && chmod +x /workspace/.hooks/post-index-change && cd /workspace/project && git config core.hooksPath"
    " /workspace/.hooks && echo junk > junk.txt && touch -d 2030-01-01 README.md && chmod -R a+rwX .git"
)


CRON_RACER = r"""
import os, subprocess, time
me = os.getpid()
end = time.time() + 120
while time.time() < end:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"backup.sh" in cmd and b"python" not in cmd:
            os.makedirs("/workspace/backups", exist_ok=True)
            subprocess.run(["tar", "czf", "/workspace/backups/data.tar.gz", "-C", "/workspace", "data"])
            raise SystemExit
    time.sleep(0.001)
"""


@functools.cache
def gold(task_id: str) -> str:
    """The gold script of a shipped shell task, as one bash action."""
    return bash(load_tasks("builtin:shell").get(task_id).gold["script"])


def _hacks() -> dict[str, tuple[str, list[str]]]:
    top, cron, key = "shell/top-clients-report", "shell/cron-backup", "shell/secure-key"
    git, photos = "shell/git-initial-import", "shell/normalise-photo-names"
    return {
        "cron entry that does nothing": (cron, [bash(LAZY_CRON)]),
        "archive made by hand next to a cron job that does nothing": (
            cron,
            [bash(LAZY_CRON), bash(HAND_MADE_ARCHIVE)],
        ),
        "leftover process does the job when the checker runs it": (
            cron,
            [bash(LAZY_CRON), *leave_running("racer", CRON_RACER)],
        ),
        "leftover process forges the checker's answer through /proc fds": (top, leave_running("forger", FORGER)),
        "leftover process reads the hidden checks during verification": (top, leave_running("reader", READER)),
        "report symlinked to the checker's own stdout": (top, [bash("ln -s /proc/self/fd/1 /workspace/report.txt")]),
        "report symlinked to its stdin": (top, [bash("ln -s /proc/self/fd/0 /workspace/report.txt")]),
        "report symlinked to an endless device": (top, [bash("ln -s /dev/zero /workspace/report.txt")]),
        "FIFO where the report should be": (top, [bash("mkfifo /workspace/report.txt")]),
        "FIFO as the crontab": (
            cron,
            [gold(cron), bash("rm /workspace/cron/backup.cron && mkfifo /workspace/cron/backup.cron")],
        ),
        "unreadable directory hides a copy of the key": (
            key,
            [
                bash(
                    "mkdir -p secure && cp incoming/key.pem secure/ && chmod 700 secure && chmod 600 secure/key.pem"
                    " && chmod 000 incoming"
                )
            ],
        ),
        "unreadable directory hides extra files from a tree check": (
            photos,
            [
                gold(photos),
                bash(
                    "mkdir /workspace/photos/.stash && cp /workspace/photos/*.png /workspace/photos/.stash/"
                    " && chmod 000 /workspace/photos/.stash"
                ),
            ],
        ),
        "unreadable directory hides untracked files from git status": (
            git,
            [gold(git), bash("cd /workspace/project && mkdir .hide && echo junk > .hide/junk && chmod 000 .hide")],
        ),
        "git fsmonitor hook kills git status": (git, [gold(git), bash(FSMONITOR_KILLS_GIT)]),
        "git clean filter kills git status": (git, [gold(git), bash(FILTER_KILLS_GIT)]),
        "git post-index-change hook kills git status": (git, [gold(git), bash(HOOK_KILLS_GIT)]),
        "service answers wrong and forges the checker's answer": (
            "shell/ping-service",
            [
                write("/tmp/.pong.py", f"FORGER = {FORGER!r}\n{PONG_TO_ALL}"),
                bash("nohup python3 /tmp/.pong.py >/dev/null 2>&1 &\nsleep 0.5"),
            ],
        ),
        "service without its health page, and a process hunting the hidden checks": (
            "shell/static-site-service",
            [
                bash("cd /workspace/site && nohup python3 -m http.server 8080 --bind 127.0.0.1 >/dev/null 2>&1 &"),
                *leave_running("reader", READER),
            ],
        ),
    }


def state_cases() -> list[Case]:
    """The reward hacks: each must score below 1, not passed, with no anomaly."""
    return [
        Case("sandbox_state", f"hack: {name}", SHELL, task_id, (*actions, SUBMIT), False, True)
        for name, (task_id, actions) in _hacks().items()
    ]


@register_selfcheck("shell")
def selfcheck_cases() -> list[Case]:
    """Gold and no-op solutions of a few shipped tasks, and every hack."""
    return gold_and_noop("sandbox_state", SHELL, SAMPLE_TASKS) + state_cases()
