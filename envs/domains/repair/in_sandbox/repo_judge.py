"""Runs a task's hidden pytest tests as the judge user, with the repository under test in another process.

agentrl writes this file, ``repo_proxy.py``, ``repo_wire.py``, ``plain_data.py``,
``plain_runner.py``, the hidden tests and a pytest.ini into a directory only the judge user can
read (mode 0700), starts ``repo_server.py`` as the sandbox user, and runs::

    python3 -I -B repo_judge.py      # stdin: {"root", "socket", "modules", "test_timeout_s", "runner"}

The tests run under pytest, pinned to ROOT (rootdir, ini, confcutdir; no plugin
autoloading, no cache); or, with ``runner: "plain"`` (the host found nothing of pytest in
them), under :mod:`plain_runner`, which gives pytest's verdict for such files without importing
pytest. Either way they import the repository's packages (``modules``)
through :class:`repo_proxy.RemoteFinder`: nothing of the workspace is ever
imported or executed in this process, so nothing the agent wrote can patch
pytest, read the expected values, swap a test's code or outlive the run here.
Each test, and the import of each test module, gets ``test_timeout_s`` (a hung
repository fails that test, and, since the connection can no longer be trusted
to be in step, every later one).

The last line of stdout is the report, JSON: ``{"exit_code", "collected",
"outcomes" (node id -> passed/failed/error/skipped/xfailed), "collect_errors",
"link"}`` (``link``: why the repository became unreachable, or null). The host
reads it as the verdict: no other process can write to this one's stdout.
"""

import json
import os
import signal
import sys


class TestTimeout(BaseException):
    """The test ran past its time limit (BaseException: a test's ``except Exception`` must not swallow it)."""


def _recorder(pytest):
    """The pytest plugin class (defined once pytest is imported: the plain runner never imports it)."""

    class Recorder:
        """A pytest plugin: what was collected, how each test ended, and a time limit per test."""

        def __init__(self, timeout_s):
            self.timeout_s = timeout_s
            self.collected, self.outcomes, self.collect_errors = [], {}, []

        def pytest_collection_finish(self, session):
            self.collected = [item.nodeid for item in session.items]

        def pytest_collectreport(self, report):
            if report.failed:
                self.collect_errors.append(report.nodeid or "<session>")

        def pytest_runtest_logreport(self, report):
            if report.when == "call":
                xfailed = hasattr(report, "wasxfail") and report.skipped
                self.outcomes[report.nodeid] = "xfailed" if xfailed else report.outcome
            elif report.failed:
                self.outcomes[report.nodeid] = "error"
            elif report.skipped and report.when == "setup":
                self.outcomes[report.nodeid] = "skipped"

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_call(self, item):
            signal.setitimer(signal.ITIMER_REAL, self.timeout_s)
            try:
                yield
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)

        @pytest.hookimpl(hookwrapper=True)
        def pytest_make_collect_report(self, collector):
            """Collecting a test module imports the repository: a module that hangs at import is cut off too."""
            signal.setitimer(signal.ITIMER_REAL, self.timeout_s)
            try:
                yield
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)

    return Recorder


def _alarm(signum, frame):
    raise TestTimeout("the test ran past its time limit")


def main():
    config = json.loads(sys.stdin.read())
    root = config["root"]
    sys.path.insert(0, root)
    from repo_proxy import Link, RemoteFinder

    link = Link.connect(config["socket"])
    modules = [m for m in config["modules"] if m not in sys.modules]
    sys.meta_path.insert(0, RemoteFinder(link, modules))
    signal.signal(signal.SIGALRM, _alarm)
    timeout_s = float(config.get("test_timeout_s", 30.0))
    stdout, sys.stdout = sys.stdout, sys.stderr  # the tests' chatter goes to stderr; stdout carries the report
    if config.get("runner") == "plain":
        import plain_runner

        arm = lambda: signal.setitimer(signal.ITIMER_REAL, timeout_s)  # noqa: E731
        disarm = lambda: signal.setitimer(signal.ITIMER_REAL, 0)  # noqa: E731
        report = plain_runner.run(root, arm, disarm)
    else:
        report = _run_pytest(root, timeout_s)
    report["link"] = link.dead
    stdout.write("\n" + json.dumps(report, sort_keys=True) + "\n")
    stdout.flush()


def _run_pytest(root, timeout_s):
    import pytest

    recorder = _recorder(pytest)(timeout_s)
    args = [
        "--rootdir=" + root,
        "-c",
        os.path.join(root, "pytest.ini"),
        "--confcutdir=" + root,
        "-p",
        "no:cacheprovider",
        "-q",
        os.path.join(root, "tests"),
    ]
    code = pytest.main(args, plugins=[recorder])
    return {
        "exit_code": int(code),
        "collected": recorder.collected,
        "outcomes": recorder.outcomes,
        "collect_errors": recorder.collect_errors,
    }


if __name__ == "__main__":
    main()
