"""Runs a candidate function on recorded arguments and reports its results as plain data (untrusted side).

The host runs this as the command uid (``sandbox``), after ``kill_all``:
``python3 -I -S -B -c SOURCE`` with ``{"program", "entry_point", "calls",
"call_timeout_s"}`` on stdin, where ``calls`` are the recorded arguments
(tagged JSON, see ``envs/verifiers/function_values.py``) and nothing else:
no expected value, test, nonce or key ever reaches this process. It executes
the program, calls the entry point once per recorded call (fresh arguments
each time, ``call_timeout_s`` each), and writes one JSON line per event to
the stdout it started with::

    ["loaded"] | ["load_error", TYPE, MESSAGE]
    [i, "ok", VALUE] | [i, "raise", TYPE, MESSAGE] | [i, "timeout"] | [i, "unencodable", WHY]

stopping at the first call that does not return a value. The candidate's own
prints go to /dev/null. Results are encoded with ``type(x) is`` checks, so
only exact builtin types pass (and the standard library's dicts, as plain
dicts); anything else is "unencodable".

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

MAX_DEPTH = 64
MAX_NODES = 200_000
CONTAINERS = ((list, "list"), (tuple, "tuple"), (set, "set"), (frozenset, "frozenset"), (dict, "dict"))


class CallTimeout(BaseException):
    pass


class Unencodable(Exception):
    pass


def encode(value, depth=MAX_DEPTH, budget=None):
    budget = budget if budget is not None else [MAX_NODES]
    budget[0] -= 1
    if budget[0] < 0:
        raise Unencodable(f"more than {MAX_NODES} values")
    kind = type(value)
    if value is None:
        return ["none"]
    if kind is bool:
        return ["bool", value]
    if kind is int:
        return ["int", hex(value)]
    if kind is float:
        return ["float", value.hex()]
    if kind is complex:
        return ["complex", value.real.hex(), value.imag.hex()]
    if kind is str:
        return ["str", value]
    if kind is bytes:
        return ["bytes", value.hex()]
    tag = next((t for builtin, t in CONTAINERS if kind is builtin), None)
    collections = sys.modules.get("collections")
    if tag is None and collections is not None:  # the standard library's dicts travel as plain dicts
        stdlib_dicts = (collections.Counter, collections.OrderedDict, collections.defaultdict)
        tag = "dict" if any(kind is t for t in stdlib_dicts) else None
    if tag is None:
        name = type.__getattribute__(kind, "__name__")
        raise Unencodable(f"a {name!r} object, whose type is not exactly a builtin type")
    if depth <= 0:
        raise Unencodable(f"nested deeper than {MAX_DEPTH}")
    if tag == "dict":
        return ["dict", [[encode(k, depth - 1, budget), encode(v, depth - 1, budget)] for k, v in dict.items(value)]]
    return [tag, [encode(v, depth - 1, budget) for v in value]]


def decode(tree):
    tag = tree[0]
    if tag == "none":
        return None
    if tag in ("bool", "str"):
        return tree[1]
    if tag == "int":
        return int(tree[1], 16)
    if tag == "float":
        return float.fromhex(tree[1])
    if tag == "complex":
        return complex(float.fromhex(tree[1]), float.fromhex(tree[2]))
    if tag == "bytes":
        return bytes.fromhex(tree[1])
    if tag == "dict":
        return {decode(k): decode(v) for k, v in tree[1]}
    kind = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag]
    return kind(decode(v) for v in tree[1])


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
            event = [i, "ok", encode(value)]
        except CallTimeout:
            event = [i, "timeout"]
        except Unencodable as exc:
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
