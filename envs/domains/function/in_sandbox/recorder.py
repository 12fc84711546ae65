"""Records a task's checks as data: runs the instrumented ``check`` with the reference solution (trusted side).

Run by the host as the ``judge`` user in a fresh sandbox that nothing else
uses (task code never runs on the host): ``python3 -s -S -B -P
recorder.py`` with ``PYTHONHASHSEED=0``, ``plain_data.py`` and ``checks.py``
in the same directory, and on stdin ``{"tasks": [...], "timeout_s": T,
"workers": W, "max_calls": N}``, each task holding the prompt, the reference
program, the entry point, the test as rewritten by
``envs.domains.function.instrument.instrument`` and its site templates. Every
task runs in its own forked child (``random`` seeded to 0, so checks with
random inputs record the same inputs every time); for each evaluation of a
recorded assert the child encodes the arguments (before the call: the
reference may mutate them), calls the reference, encodes the result and the
assert's constants, and verifies that the reference satisfies the filled-in
check *as the judge will evaluate it*. One JSON line per task goes to stdout:
``{"key": K, "calls": [{"args", "kwargs", "check", "line"}, ...]}`` or
``{"key": K, "error": WHY}``.

The test sees the function under test only through the recorder: its name is
bound to a sentinel that aborts the recording if anything calls it some other
way (``eval``, ``globals()``); where the test names the entry point beside
``candidate``, that name is the reference.
"""

import json
import os
import random
import signal
import sys
import time

if __package__:  # imported on the host, as part of envs
    from envs.domains.function.in_sandbox.checks import CheckError, evaluate, fill
    from envs.in_sandbox.plain_data import EncodeError, decode, encode
else:  # shipped: checks.py and plain_data.py sit beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from checks import CheckError, evaluate, fill
    from plain_data import EncodeError, decode, encode

RECORD = "__agentrl_record__"
ARGS = "__agentrl_args__"


class Unrecordable(BaseException):
    """Aborts a recording; a BaseException so that the test's own ``except Exception`` cannot swallow it."""


def _encoded(value, what, line):
    try:
        return encode(value, stdlib_dicts=True)
    except EncodeError as exc:
        raise Unrecordable(f"line {line}: {what} is not plain data ({exc})") from None


def record_task(task, max_calls):
    """Runs one task's instrumented check; returns its recorded calls or raises :class:`Unrecordable`."""
    entry, state, calls = task["entry_point"], {"misuse": None}, []
    program_ns = {"__name__": "__main__"}
    try:
        exec(compile(task["program"], "solution.py", "exec"), program_ns)
    except BaseException as exc:  # noqa: BLE001 - whatever the reference does wrong is a reason
        raise Unrecordable(f"the reference program raises {type(exc).__name__}: {str(exc)[:200]}") from None
    reference = program_ns.get(entry)
    if not callable(reference):
        raise Unrecordable(f"the reference program does not define {entry}()")

    def sentinel(*args, **kwargs):
        state["misuse"] = "the check calls the function under test in a way the recorder cannot see"
        raise Unrecordable(state["misuse"])

    def record(site_id, args_thunk, *constant_thunks):
        site = task["sites"][str(site_id)]
        line = site["line"]
        args, kwargs = args_thunk()
        encoded_args = _encoded(list(args), "an argument", line)
        encoded_kwargs = _encoded(dict(kwargs), "a keyword argument", line)
        result = reference(*args, **kwargs)
        encoded_result = _encoded(result, "the reference's result", line)
        constants = [_encoded(thunk(), "an expected value", line) for thunk in constant_thunks]
        check = fill(site["template"], constants)
        try:
            ok = evaluate(check, decode(encoded_result))
        except CheckError as exc:
            raise Unrecordable(f"line {line}: {exc}") from None
        if not ok:
            raise Unrecordable(f"line {line}: the reference solution fails this check as recorded")
        calls.append({"args": encoded_args, "kwargs": encoded_kwargs, "check": check, "line": line})
        if len(calls) > max_calls:
            raise Unrecordable(f"the check makes more than {max_calls} calls")

    test_ns = {"__name__": "__check__"}
    try:  # the prompt's helpers (e.g. HumanEval/32's poly); a prompt that is only a signature needs the body
        try:
            helpers = compile(task["prompt"], "prompt.py", "exec")
        except SyntaxError:
            helpers = compile(task["program"], "solution.py", "exec")
        exec(helpers, test_ns)
    except BaseException as exc:  # noqa: BLE001
        raise Unrecordable(f"the prompt raises {type(exc).__name__}: {str(exc)[:200]}") from None
    test_ns[entry] = sentinel if task["candidate"] == entry else reference
    test_ns[RECORD], test_ns[ARGS] = record, lambda *a, **k: (a, k)
    try:
        exec(compile(task["test"], "check.py", "exec"), test_ns)
        test_ns["check"](sentinel)
    except Unrecordable:
        raise
    except BaseException as exc:  # noqa: BLE001
        raise Unrecordable(f"the check fails with the reference: {type(exc).__name__}: {str(exc)[:200]}") from None
    if state["misuse"]:
        raise Unrecordable(state["misuse"])
    if not calls:
        raise Unrecordable("the check recorded no calls")
    return calls


def child(task, path, max_calls):
    random.seed(0)
    try:
        outcome = {"key": task["key"], "calls": record_task(task, max_calls)}
    except Unrecordable as exc:
        outcome = {"key": task["key"], "error": str(exc)}
    with open(path, "w") as f:
        json.dump(outcome, f)


def start(task, index, workdir, max_calls):
    path = os.path.join(workdir, f"{index}.json")
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # what task code prints is not ours to parse
                os.dup2(devnull, fd)
            child(task, path, max_calls)
        finally:
            os._exit(0)
    return {"pid": pid, "path": path, "key": task["key"]}


def finish(job, timed_out):
    try:
        os.killpg(job["pid"], signal.SIGKILL)
    except OSError:
        pass
    if timed_out:
        os.waitpid(job["pid"], 0)
        return {"key": job["key"], "error": "the check did not finish in time", "transient": True}
    try:
        with open(job["path"]) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"key": job["key"], "error": "the recording crashed (no result)", "transient": True}


def main():
    request = json.loads(sys.stdin.read())
    out = os.fdopen(os.dup(1), "w")
    workdir = f"/tmp/.agentrl-record-{os.getpid()}"
    os.mkdir(workdir, 0o700)
    queue, running = list(enumerate(request["tasks"])), []
    timeout, workers = float(request["timeout_s"]), int(request["workers"])
    while queue or running:
        while queue and len(running) < workers:
            index, task = queue.pop(0)
            job = start(task, index, workdir, int(request["max_calls"]))
            job["deadline"] = time.monotonic() + timeout
            running.append(job)
        time.sleep(0.002)
        for job in list(running):
            done, _ = os.waitpid(job["pid"], os.WNOHANG)
            late = time.monotonic() > job["deadline"]
            if done or late:
                running.remove(job)
                out.write(json.dumps(finish(job, timed_out=late and not done)) + "\n")
                out.flush()


if __name__ == "__main__":
    main()
