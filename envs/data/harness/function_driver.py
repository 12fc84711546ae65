"""Trusted driver for HumanEval-format function tests, executed inside the sandbox.

``python3 -I -B function_driver.py PROBLEMS RESULTS WORKERS TIMEOUT`` with a
key on stdin runs every problem of the PROBLEMS JSON file in its own forked
child process (WORKERS at a time, TIMEOUT seconds each, its own session so the
whole tree is killed after) and writes a RESULTS file signed with the key, which
the driver reads only after the last child is gone. Batching and forking from a
parent that has already imported what tests use are what make checking all 164
HumanEval problems cost one sandbox command and a few seconds.

A child executes the candidate program, then runs the problem's ``check`` in a
*separate* namespace built from the trusted prompt (its helper functions) and a
copy of the builtins taken before the candidate ran, so a candidate cannot
redefine ``abs`` or ``check`` for the test. The candidate is wrapped so that
every value it returns must be a plain builtin (int, str, list of those, ...):
an object that "compares equal to anything" fails. Standard-library functions
are fingerprinted and compared after the check. A child proves it reached the
end by writing its own random nonce to a pipe only the driver reads; exiting
early (``sys.exit(0)`` at import, ``os._exit(0)``) or printing "passed" proves
nothing. Python >= 3.8, standard library only.
"""

import hashlib
import hmac
import json
import os
import secrets
import signal
import sys
import time
import types

PRELOAD = (
    "math",
    "random",
    "string",
    "re",
    "collections",
    "itertools",
    "functools",
    "heapq",
    "copy",
    "hashlib",
    "statistics",
    "operator",
    "fractions",
    "decimal",
    "typing",
    "bisect",
)
_PLAIN_SCALARS = (int, float, complex, str, bytes, bool, type(None))
_WATCHED = (types.FunctionType, types.BuiltinFunctionType, type)


def plain(value, depth=0):
    """True for builtin values (containers of builtin values included) and nothing else."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return True
    if depth > 64:
        return False
    if kind in (list, tuple, set, frozenset):
        return all(plain(v, depth + 1) for v in value)
    if kind is dict:
        return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in value.items())
    return False


def strict(fn):
    def candidate(*args, **kwargs):
        result = fn(*args, **kwargs)
        if not plain(result):
            raise TypeError(f"the candidate returned a {type(result).__name__}, not a plain builtin value")
        return result

    return candidate


def fingerprint(modules):
    table = {}
    for module in modules:
        for name, value in list(vars(module).items()):
            if isinstance(value, _WATCHED):
                table[(module.__name__, name)] = (module, value, getattr(value, "__code__", None))
    return table


def changed(table):
    out = []
    for (modname, name), (module, value, code) in table.items():
        current = vars(module).get(name)
        if current is not value or (code is not None and getattr(current, "__code__", None) is not code):
            out.append(f"{modname}.{name}")
    return out


def child(problem, nonce, report_fd):
    """Runs one problem in this (forked) process; returns a failure message, or None after reporting success."""
    import builtins

    table = fingerprint([sys.modules[m] for m in PRELOAD] + [builtins, sys, os])
    trusted_builtins = dict(vars(builtins))
    prompt_ns = {"__name__": "__prompt__", "__builtins__": dict(trusted_builtins)}
    exec(compile(problem["prompt"], "prompt.py", "exec"), prompt_ns)
    solution_ns = {"__name__": "__solution__"}
    try:
        exec(compile(problem["program"], "solution.py", "exec"), solution_ns)
    except BaseException as exc:  # SystemExit included: exiting at import is a failure
        return f"failed: the program raised {type(exc).__name__}: {str(exc)[:200]}"
    entry = problem["entry_point"]
    if not callable(solution_ns.get(entry)):
        return f"failed: the program does not define {entry}()"
    candidate = strict(solution_ns[entry])
    test_ns = dict(prompt_ns)
    test_ns["__builtins__"] = dict(trusted_builtins)
    test_ns["__name__"] = "__check__"
    test_ns[entry] = candidate
    try:
        exec(compile(problem["test"], "check.py", "exec"), test_ns)
        test_ns["check"](candidate)
    except BaseException as exc:
        return f"failed: {type(exc).__name__}: {str(exc)[:200]}"
    tampered = changed(table)
    if tampered:
        return "failed: the program patched " + ", ".join(tampered[:5])
    os.write(report_fd, f"{nonce} passed".encode())
    return None


def start(problem, timeout, running):
    """Forks a child for ``problem``: cheap, since the parent has already imported what tests use."""
    nonce = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: shed everything of the parent's before any untrusted code runs
        try:
            os.setsid()
            os.close(read_fd)
            for job in running.values():
                os.close(job["fd"])
            running.clear()
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            message = child(problem, nonce, write_fd)
            if message is not None:
                os.write(write_fd, message.encode("utf-8", "replace")[:1000])
        finally:
            os._exit(0)
    os.close(write_fd)
    os.set_blocking(read_fd, False)
    return {"pid": pid, "fd": read_fd, "nonce": nonce, "data": b"", "deadline": time.monotonic() + timeout}


def drain(job):
    try:
        while True:
            chunk = os.read(job["fd"], 4096)
            if not chunk:
                return
            job["data"] += chunk
    except BlockingIOError:
        return


def finish(job, status, timed_out):
    try:
        os.killpg(job["pid"], signal.SIGKILL)  # the child and anything it spawned
    except OSError:
        pass
    if status is None:
        _, status = os.waitpid(job["pid"], 0)
    drain(job)
    os.close(job["fd"])
    text = job["data"].decode("utf-8", "replace")
    if timed_out:
        return "timed out"
    if text == job["nonce"] + " passed":
        return "passed"
    if text.startswith("failed: "):
        return text
    return f"failed: no verdict (the program exited early with status {os.waitstatus_to_exitcode(status)})"


def main():
    problems_path, results_path, workers, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    with open(problems_path) as f:
        problems = json.load(f)
    results, queue, running = {}, list(problems), {}
    while queue or running:
        while queue and len(running) < workers:
            problem = queue.pop(0)
            running[problem["id"]] = start(problem, timeout, running)
        time.sleep(0.001)
        for pid, job in list(running.items()):
            drain(job)  # keep the pipe from filling up
            done, status = os.waitpid(job["pid"], os.WNOHANG)
            late = time.monotonic() > job["deadline"]
            if done or late:
                results[pid] = finish(job, status if done else None, timed_out=late and not done)
                del running[pid]
    # The key is read only now: forked children closed their copy of stdin before running anything.
    key = sys.stdin.buffer.read()
    body = json.dumps(results, sort_keys=True)
    mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
    with open(results_path, "w") as f:
        json.dump({"body": body, "mac": mac}, f)


if __name__ == "__main__":
    main()
