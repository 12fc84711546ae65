"""Processes inside the sandbox, as the agent sees them: the process table, signals, starting a command.

Runs inside the sandbox (standard library only, Python >= 3.8), loaded by the
agent like its other parts (:func:`sandbox.agent.bundle`). Split from
:mod:`sandbox.agent.server`, which decides *when* to start and kill; this
module knows *how*: a command starts in its own session, at the lowest CPU
priority and the highest OOM score, as its unprivileged uid.
"""

import os

from sandbox.agent import confine as confinement


def process_table(me):
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


def stopped(pid):
    """True if ``pid`` is stopped (state T) or gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] in (b"T", b"t")
    except (OSError, ValueError):
        return True


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# The judge's commands are the OOM killer's second choice: when judge work meets the sandbox's memory
# limit, whatever the model's commands still hold is killed first (a judge that itself runs away is
# still killed before the agent, whose score is 0). Raising a score needs no capability.
OOM_SCORE_ADJ = {"judge": 500}
DEFAULT_OOM_SCORE_ADJ = 1000


def _start_as(uid, gid, cwd, oom_score_adj=DEFAULT_OOM_SCORE_ADJ):
    """In the child before exec: raise its OOM score, lower its priority, become ``uid``, enter ``cwd``.

    The OOM score is set first, while the child may still write its own ``/proc`` files, so a fork
    bomb cannot fork at the old score. ``SCHED_IDLE`` costs commands nothing (the sandbox's cgroup is
    its own scheduling group, where the agent idles) but keeps the agent answering when they spin on
    every CPU they have: a starved agent would turn the model's doing into a host timeout, an anomaly.
    The uid comes last and every capability goes with it.
    """

    def start():
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(oom_score_adj))
        except OSError:
            pass
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        confinement.drop_to(uid, gid)
        os.chdir(cwd)

    return start


def spawn(argv, env, ids, cwd, stdin_fd, out_fd, err_fd, user="sandbox"):
    """Starts a command of ``user`` as ``ids`` (uid, gid) in ``cwd``; returns its pid (the agent reaps it)."""
    import subprocess  # deferred: only exec needs it

    proc = subprocess.Popen(
        argv,
        stdin=stdin_fd,
        stdout=out_fd,
        stderr=err_fd,
        env=env,
        start_new_session=True,
        close_fds=True,
        preexec_fn=_start_as(
            ids[0], ids[1], cwd, OOM_SCORE_ADJ.get(user, DEFAULT_OOM_SCORE_ADJ)
        ),  # safe: the agent is single-threaded
    )
    proc.returncode = 0  # the agent reaps; stop Popen from ever waiting on it
    return proc.pid


def subprocess_error():
    import subprocess

    return subprocess.SubprocessError
