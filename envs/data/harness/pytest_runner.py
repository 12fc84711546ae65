"""Trusted runner for hidden tests, executed inside the sandbox after the agent has finished.

agentrl's harness writes this file, the hidden tests and a pytest.ini into a
fresh directory with a random name, kills every process the agent left, and
runs ``python3 -I -B pytest_runner.py ROOT TOKEN WORKSPACE`` with a secret nonce on
stdin. This runner:

* runs pytest with rootdir, ini file and confcutdir pinned to ROOT, the cache
  provider and plugin autoloading off, so nothing the agent wrote (conftest.py,
  pytest.ini, setup.cfg, plugins) is consulted;
* records every test outcome with its own plugin, next to pytest's JUnit XML;
* fingerprints pytest's, pluggy's and the builtins' functions before any code
  under test is imported and compares after the run, so in-process patching of
  the runner or its reports is detected;
* flags classes from the workspace whose ``==`` holds against a bare
  ``object()`` (values that "compare equal to anything");
* writes a verdict (outcomes, collected ids, tampering, the XML's hash) signed
  with HMAC(nonce), and leaves with ``os._exit`` so atexit hooks planted by the
  code under test never run after the verdict.

The host trusts nothing else: not stdout, not the exit status. A test process
that exits early (``sys.exit(0)``/``os._exit(0)`` at import) leaves no verdict
and fails. Standard library + pytest only; Python >= 3.8.
"""

import hashlib
import hmac
import json
import os
import sys
import types

CRITICAL_MODULES = (
    "_pytest.runner",
    "_pytest.reports",
    "_pytest.junitxml",
    "_pytest.python",
    "_pytest.main",
    "_pytest.nodes",
    "_pytest.outcomes",
    "_pytest.skipping",
    "_pytest.unittest",
    "_pytest.fixtures",
    "_pytest.terminal",
    "_pytest.config",
    "_pytest.capture",
    "_pytest.assertion.rewrite",
    "_pytest.assertion.util",
    "pluggy._callers",
    "pluggy._hooks",
    "pluggy._manager",
    "pluggy._result",
    "builtins",
    "sys",
    "os",
)
_WATCHED = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type, classmethod, staticmethod, property)


def _entries(owner, prefix):
    out = {}
    for name, value in list(vars(owner).items()):
        if isinstance(value, _WATCHED):
            code = getattr(getattr(value, "__func__", value), "__code__", None)
            out[prefix + name] = (value, code)
    return out


class Guard:
    """Remembers the runner's machinery; :meth:`changes` lists what was swapped or patched since."""

    def __init__(self):
        self.modules = {name: sys.modules.get(name) for name in CRITICAL_MODULES}
        self.entries = {}
        for modname, module in self.modules.items():
            if module is None:
                continue
            entries = _entries(module, modname + ".")
            self.entries.update(entries)
            for key, (value, _) in list(entries.items()):
                if isinstance(value, type) and value.__module__ == modname:
                    self.entries.update(_entries(value, key + "."))
        self.trace = (sys.gettrace(), sys.getprofile())

    def changes(self):
        found = []
        for name, module in self.modules.items():
            if module is not None and sys.modules.get(name) is not module:
                found.append(f"sys.modules[{name!r}] replaced")
        for key, (value, code) in self.entries.items():
            owner_key, _, attr = key.rpartition(".")
            owner = self._resolve(owner_key)
            current = vars(owner).get(attr, None) if owner is not None else None
            if current is not value:
                found.append(key + " replaced")
            elif code is not None and getattr(getattr(value, "__func__", value), "__code__", None) is not code:
                found.append(key + ".__code__ replaced")
        if (sys.gettrace(), sys.getprofile()) != self.trace:
            found.append("a trace/profile function was installed")
        return found

    def _resolve(self, key):
        for modname, module in self.modules.items():
            if key == modname:
                return module
            if key.startswith(modname + ".") and module is not None:
                return vars(module).get(key[len(modname) + 1 :])
        return None


def _subclasses():
    seen, stack = set(), [object]
    while stack:
        cls = stack.pop()
        try:
            subs = type.__subclasses__(cls)
        except TypeError:
            continue
        for sub in subs:
            if id(sub) not in seen:
                seen.add(id(sub))
                stack.append(sub)
                yield sub


def universal_equals(workspace):
    """Classes defined by code under ``workspace`` whose ``==`` holds against a bare ``object()``.

    That is the "compare equal to anything" hack: no honest value equals a
    fresh sentinel. Classes made at run time with ``type()`` count too, since
    they take the ``__module__`` of the code that made them.
    """
    found = []
    prefix = workspace.rstrip("/") + "/"
    for cls in list(_subclasses()):
        eq = vars(cls).get("__eq__")
        ne = vars(cls).get("__ne__")
        if eq is None and ne is None:
            continue
        module = sys.modules.get(getattr(cls, "__module__", "") or "")
        path = getattr(module, "__file__", None) or ""
        if not os.path.abspath(path).startswith(prefix):
            continue
        try:
            probe = object.__new__(cls) if cls.__new__ is object.__new__ else cls.__new__(cls)
        except Exception:
            try:
                probe = object.__new__(cls)
            except Exception:
                continue
        for op, expected in ((eq, True), (ne, False)):
            if op is None:
                continue
            try:
                if op(probe, object()) is expected:
                    found.append(
                        "{}.{} {} anything".format(
                            cls.__module__, cls.__qualname__, "equals" if expected else "differs from nothing in"
                        )
                    )
            except Exception:
                pass
    return found


class Recorder:
    """A pytest plugin that keeps its own account of what was collected and how each test ended.

    It arms a second :class:`Guard` when collection starts (pytest configured,
    no code under test imported yet) and checks it when the session finishes,
    so patches that are undone before the process ends are caught too.
    """

    def __init__(self, workspace):
        self.workspace = workspace
        self.equality = []
        self.guard = None
        self.outcomes = {}
        self.collected = []
        self.collect_errors = []
        self.hooks = None
        self.plugins = None
        self.session_changes = None

    def pytest_collection(self, session):
        self.guard = Guard()
        self.hooks = dict(vars(session.config.hook))

    def pytest_sessionfinish(self, session):
        self.session_changes = self.integrity(session.config)
        self.equality = universal_equals(self.workspace)

    def pytest_collection_finish(self, session):
        self.collected = [item.nodeid for item in session.items]
        self.plugins = set(id(p) for p in session.config.pluginmanager.get_plugins())

    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors.append(report.nodeid or "<session>")

    def pytest_runtest_logreport(self, report):
        nodeid = report.nodeid
        if report.when == "call":
            self.outcomes[nodeid] = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
        elif report.failed:
            self.outcomes[nodeid] = "error"
        elif report.skipped and report.when == "setup":
            self.outcomes[nodeid] = "skipped"

    def integrity(self, config):
        if self.guard is None:
            return ["pytest never started collecting"]
        found = self.guard.changes()
        hooks = dict(vars(config.hook))
        for name, caller in self.hooks.items():
            if hooks.get(name) is not caller:
                found.append(f"hook caller {name} replaced")
        if self.plugins is not None:
            extra = [p for p in config.pluginmanager.get_plugins() if id(p) not in self.plugins]
            if extra:
                found.append(f"{len(extra)} pytest plugin(s) registered by code under test")
        return found


def main():
    root, token, workspace = sys.argv[1], sys.argv[2], sys.argv[3]
    nonce = sys.stdin.buffer.read()
    xml_path = os.path.join(root, f"junit-{token}.xml")
    verdict_path = os.path.join(root, f"verdict-{token}.json")
    import importlib

    import pytest

    for name in CRITICAL_MODULES:
        importlib.import_module(name)
    before = Guard()  # nothing but pytest has run: the reference for after the run
    recorder = Recorder(workspace)

    args = [
        "--rootdir=" + root,
        "-c",
        os.path.join(root, "pytest.ini"),
        "--confcutdir=" + root,
        "-p",
        "no:cacheprovider",
        "--junitxml=" + xml_path,
        "-o",
        "junit_family=xunit1",
        "-q",
        "-rN",
        os.path.join(root, "tests"),
    ]
    code = pytest.main(args, plugins=[recorder])
    tampered = before.changes()
    if recorder.session_changes is None:
        tampered.append("the session never finished")
    else:
        tampered.extend(recorder.session_changes)
    tampered.extend(recorder.equality)
    tampered = sorted(set(tampered))
    try:
        with open(xml_path, "rb") as f:
            xml = f.read()
    except OSError:
        xml = b""
    body = json.dumps(
        {
            "exit_code": int(code),
            "outcomes": recorder.outcomes,
            "collected": recorder.collected,
            "collect_errors": recorder.collect_errors,
            "tampered": tampered,
            "xml_sha256": hashlib.sha256(xml).hexdigest(),
        },
        sort_keys=True,
    )
    mac = hmac.new(nonce, body.encode("utf-8"), hashlib.sha256).hexdigest()
    fd = os.open(verdict_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, json.dumps({"body": body, "mac": mac}).encode("utf-8"))
    os.close(fd)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
