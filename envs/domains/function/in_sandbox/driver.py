"""Runs a candidate function on recorded arguments and reports its results as plain data (untrusted side).

The host runs this as the command uid (``sandbox``), after ``kill_all``:
``python3 -I -S -B -c BUNDLE`` (this file with ``plain_data`` bundled in,
:func:`envs.in_sandbox.bundle`) with ``{"program", "entry_point", "calls",
"call_timeout_s"}`` on stdin, where ``calls`` are the recorded arguments
(tagged JSON, :mod:`envs.in_sandbox.plain_data`) and nothing else: no expected
value, test, nonce or key ever reaches this process. It executes the program,
calls the entry point once per recorded call (fresh arguments each time,
``call_timeout_s`` each), and writes one JSON line per event to the stdout it
started with::

    ["loaded"] | ["load_error", TYPE, MESSAGE]
    [i, "ok", VALUE] | [i, "raise", TYPE, MESSAGE] | [i, "timeout"] | [i, "unencodable", WHY]

stopping at the first call that does not return a value. The candidate's own
prints go to /dev/null. Results are encoded by ``plain_data`` (exact builtin
types only, and the standard library's dicts as plain dicts); anything else is
"unencodable".

Nothing here is trusted or needs to be: the candidate runs in this process
and may rewrite any of it, print forged lines, or exit early. The host
accepts only a well-formed, complete, in-order report and compares the
decoded values with expected values this process never saw; a forged report
is at best the answer a correct function would have given. Standard library
only.
"""

import json
import os
import signal
import sys

if __package__:  # imported on the host, as part of envs
    from envs.in_sandbox.plain_data import EncodeError, decode, encode
else:  # shipped: plain_data is bundled in
    from plain_data import EncodeError, decode, encode


class CallTimeout(BaseException):
    pass


def emit(fd, event):
    data = (json.dumps(event) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def _alarm(signum, frame):
    raise CallTimeout()


def main():
    request = json.loads(sys.stdin.buffer.read())
    report = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    budget = float(request["call_timeout_s"])
    signal.signal(signal.SIGALRM, _alarm)
    namespace = {"__name__": "__solution__"}
    try:
        signal.setitimer(signal.ITIMER_REAL, budget)
        exec(compile(request["program"], "solution.py", "exec"), namespace)
        signal.setitimer(signal.ITIMER_REAL, 0)
        function = namespace[request["entry_point"]]
        if not callable(function):
            raise TypeError(f"{request['entry_point']} is not callable")
    except BaseException as exc:  # noqa: BLE001 - SystemExit at import included: the program did not load
        signal.setitimer(signal.ITIMER_REAL, 0)
        emit(report, ["load_error", type(exc).__name__, str(exc)[:300]])
        os._exit(0)
    emit(report, ["loaded"])
    for i, (args, kwargs) in enumerate(request["calls"]):
        event = None
        try:
            signal.setitimer(signal.ITIMER_REAL, budget)
            value = function(*decode(args), **decode(kwargs))
            event = [i, "ok", encode(value, stdlib_dicts=True)]
        except CallTimeout:
            event = [i, "timeout"]
        except EncodeError as exc:
            event = [i, "unencodable", str(exc)[:300]]
        except BaseException as exc:  # noqa: BLE001 - the candidate's exception, reported by name
            event = [i, "raise", type(exc).__name__, str(exc)[:300]]
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        emit(report, event)
        if event[1] != "ok":
            break
    os._exit(0)  # no atexit hooks, no waiting for the candidate's threads


if __name__ == "__main__":
    main()
