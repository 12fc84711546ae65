"""The built-in tools on real sandboxes (both backends): results, errors for the model, truncation, timeouts."""

from __future__ import annotations

import pytest

from envs.tasks import Task
from envs.tools import TOOLS, Tool, ToolContext, get_tools, patch_strip_level, register_tool, truncate_middle
from sandbox import SandboxSpec

SPEC = SandboxSpec(memory_mb=512, timeout_s=30.0)
TASK = Task(
    id="tools/demo",
    domain="demo",
    prompt="demo",
    metadata={"test_command": "python3 -m pytest -q tests", "test_timeout_s": 30},
)


@pytest.fixture
def ctx(pool):
    sandbox = pool.acquire(SPEC)
    try:
        yield ToolContext(sandbox=sandbox, task=TASK, timeout_s=10.0, max_output_chars=2000)
    finally:
        pool.release(sandbox)


def call(ctx, name, **arguments):
    return TOOLS[name](ctx, arguments)


def test_every_tool_has_an_openai_function_schema():
    for name in ("bash", "python", "read_file", "write_file", "apply_patch", "run_tests", "submit"):
        schema = TOOLS[name].schema()
        assert schema["type"] == "function" and schema["function"]["name"] == name
        assert schema["function"]["parameters"]["type"] == "object" and schema["function"]["description"]
    with pytest.raises(KeyError, match="unknown tool 'nope'"):
        get_tools(["bash", "nope"])
    with pytest.raises(ValueError, match="already registered"):
        register_tool(TOOLS["bash"])
    with pytest.raises(ValueError, match=r"Tool\.name"):
        Tool("bad name", "x", {"type": "object"}, lambda c, a: None)


def test_bash_reports_stdout_stderr_and_exit_code(ctx):
    result = call(ctx, "bash", command="echo out; echo err >&2; exit 3")
    assert result.exit_code == 3 and not result.ok
    assert result.output == "out\n[stderr]\nerr\n[exit code: 3]"
    assert call(ctx, "bash", command="pwd").output == "/workspace\n[exit code: 0]"


def test_bash_timeout_kills_and_says_so(ctx):
    result = call(ctx, "bash", command="sleep 30", timeout=1)
    assert result.timed_out and "[timed out after 1 s" in result.output


def test_python_tool_runs_a_snippet(ctx):
    result = call(ctx, "python", code="import math\nprint(math.factorial(10))")
    assert result.output == "3628800\n[exit code: 0]" and result.ok
    failing = call(ctx, "python", code="raise SystemExit('boom')")
    assert failing.exit_code == 1 and "boom" in failing.output


def test_write_then_read_with_line_range(ctx):
    assert call(ctx, "write_file", path="pkg/notes.txt", content="a\nb\nc\n").output == "wrote 6 bytes to pkg/notes.txt"
    assert call(ctx, "read_file", path="pkg/notes.txt").output == "a\nb\nc\n"
    assert call(ctx, "read_file", path="/workspace/pkg/notes.txt", start_line=2, end_line=3).output == "b\nc\n"
    missing = call(ctx, "read_file", path="nope.txt")
    assert missing.error and missing.output.startswith("Error: read_file:") and not missing.malformed


def test_bad_arguments_are_malformed_calls(ctx):
    result = call(ctx, "write_file", path="x.txt")
    assert result.malformed and "missing required argument(s) 'content'" in result.output
    assert call(ctx, "bash", command="ls", cwd="/").malformed


def test_output_is_truncated_with_a_marker(ctx):
    result = call(ctx, "bash", command="seq 1 5000")
    assert len(result.output) <= 2100
    assert "characters truncated ...]" in result.output
    assert result.output.startswith("1\n2\n") and "5000\n" in result.output
    assert truncate_middle("x" * 10, 20) == "x" * 10


def test_apply_patch_all_or_nothing(ctx):
    call(ctx, "write_file", path="lib.py", content="def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    good = "--- a/lib.py\n+++ b/lib.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 10\n"
    assert patch_strip_level(good) == 1
    assert call(ctx, "apply_patch", patch=good).ok
    assert "return 10" in call(ctx, "read_file", path="lib.py").output
    half_bad = good.replace("return 1\n+    return 10", "return 10\n+    return 11") + (
        "@@ -5,2 +5,2 @@\n def g():\n-    return 99\n+    return 3\n"
    )
    result = call(ctx, "apply_patch", patch=half_bad)
    assert not result.ok and "FAILED" in result.output
    assert call(ctx, "read_file", path="lib.py").output == "def f():\n    return 10\n\n\ndef g():\n    return 2\n"
    plain = "--- lib.py\n+++ lib.py\n@@ -5,2 +5,2 @@\n def g():\n-    return 2\n+    return 20\n"
    assert patch_strip_level(plain) == 0 and call(ctx, "apply_patch", patch=plain).ok
    not_a_diff = call(ctx, "apply_patch", patch="just text")
    assert not_a_diff.error and "must be a unified diff" in not_a_diff.output


def test_run_tests_uses_the_task_command(ctx):
    call(ctx, "write_file", path="tests/test_a.py", content="def test_a():\n    assert 1 + 1 == 3\n")
    result = call(ctx, "run_tests")
    assert result.exit_code == 1 and "1 failed" in result.output
    no_command = ToolContext(ctx.sandbox, Task(id="t", domain="d", prompt="p"))
    assert TOOLS["run_tests"](no_command, {}).error


def test_submit_ends_the_episode_with_an_answer(ctx):
    result = call(ctx, "submit", answer="42")
    assert result.ends_episode and result.answer == "42"
